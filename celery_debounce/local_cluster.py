"""Start a throwaway local Redis Cluster (masters + replicas on loopback): tests, benchmarks."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from .local_redis import LocalRedis, find_redis_server, free_port


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 < 65536:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port pair for a cluster node")


def redis_cli() -> str:
    """Path of redis-cli (next to redis-server, or on PATH)."""
    server = Path(find_redis_server())
    sibling = server.with_name("redis-cli")
    if sibling.exists():
        return str(sibling)
    found = shutil.which("redis-cli")
    if found:
        return found
    raise FileNotFoundError("no redis-cli found (it ships with redis-server)")


class LocalCluster:
    """``masters`` masters with ``replicas`` replicas each, created with
    ``redis-cli --cluster create``; each node in its own temporary directory.

    ``node_timeout_ms`` is ``cluster-node-timeout``: how long a master must be
    unreachable before its replica is promoted.
    """

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[LocalRedis] = []

    @property
    def url(self) -> str:
        """URL of the first node that is still running (any node bootstraps a client)."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                return node.url
        raise RuntimeError("no cluster node is running")

    def start(self, timeout: float = 30.0) -> LocalCluster:
        for _ in range(self.masters * (1 + self.replicas)):
            port = _free_cluster_port()
            node = LocalRedis(
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms),
                # a replica that lost its master a while ago still takes over (tests
                # stop processes for a few seconds)
                "--cluster-replica-validity-factor", "0",
                port=port,
            )
            self.nodes.append(node)
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [redis_cli(), "--cluster", "create", *addresses,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout,
        )
        self.wait_ok(timeout)
        return self

    def cli(self, port: int, *args: str) -> str:
        out = subprocess.run(
            [redis_cli(), "-p", str(port), *args], check=True, capture_output=True, timeout=30,
        )
        return out.stdout.decode()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node reports ``cluster_state:ok`` and agrees on
        the masters (one per slot range, ``masters`` of them)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                states = [self.cli(node.port, "cluster", "info") for node in self.running()]
                if all("cluster_state:ok" in s for s in states) and len(
                    self.master_ports()) == self.masters:
                    return
                last = states[0]
            except subprocess.SubprocessError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise TimeoutError(f"cluster not ok after {timeout}s: {last[:200]}")

    def running(self) -> list[LocalRedis]:
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def master_ports(self) -> list[int]:
        """Ports of the masters that serve slots, as the first running node sees them."""
        text = self.cli(self.running()[0].port, "cluster", "nodes")
        ports = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) > 8 and "master" in fields[2] and "fail" not in fields[2]:
                ports.append(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
        return sorted(ports)

    def node_of_slot(self, slot: int) -> int:
        """Port of the master serving ``slot``."""
        text = self.cli(self.running()[0].port, "cluster", "nodes")
        for line in text.splitlines():
            fields = line.split()
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for part in fields[8:]:
                if part.startswith("["):
                    continue
                low, _, high = part.partition("-")
                if int(low) <= slot <= int(high or low):
                    return int(fields[1].split("@")[0].rsplit(":", 1)[1])
        raise LookupError(f"no master serves slot {slot}")

    def node(self, port: int) -> LocalRedis:
        return next(n for n in self.nodes if n.port == port)

    def flushall(self) -> None:
        for port in self.master_ports():
            self.cli(port, "flushall")

    def stop(self) -> None:
        for node in self.nodes:
            node.cleanup()
        self.nodes = []

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

