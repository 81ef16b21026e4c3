"""Start a throwaway local Redis Cluster (masters + replicas on loopback): tests, benchmarks."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from .servers import LocalRedis, find_redis_server, free_port


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
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
                # a replica that lost its master a while ago still takes over (tests
                # stop processes for a few seconds)
                "--cluster-replica-validity-factor",
                "0",
                port=port,
            )
            self.nodes.append(node)
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [
                redis_cli(),
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
        self.wait_ok(timeout)
        return self

    def cli(self, port: int, *args: str) -> str:
        out = subprocess.run(
            [redis_cli(), "-p", str(port), *args],
            check=True,
            capture_output=True,
            timeout=30,
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
                if (
                    all("cluster_state:ok" in s for s in states)
                    and len(self.master_ports()) == self.masters
                    and self._replicas_in_sync()
                ):
                    return
                last = states[0]
            except subprocess.SubprocessError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise TimeoutError(f"cluster not ok after {timeout}s: {last[:200]}")

    def _replicas_in_sync(self) -> bool:
        """Every running replica has its master link up (initial sync done)."""
        for node in self.running():
            info = self.cli(node.port, "info", "replication")
            if "role:slave" in info and "master_link_status:up" not in info:
                return False
        return True

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

    def node_id(self, port: int) -> str:
        return self.cli(port, "cluster", "myid").strip()

    def replica_of(self, port: int) -> int:
        """Port of a replica of the master on ``port``."""
        master_id = self.node_id(port)
        text = self.cli(self.running()[0].port, "cluster", "nodes")
        for line in text.splitlines():
            fields = line.split()
            if "slave" in fields[2] and fields[3] == master_id:
                return int(fields[1].split("@")[0].rsplit(":", 1)[1])
        raise LookupError(f"no replica of {port}")

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port``; it comes back empty.

        A node that once full-synced as a replica holds that copy as ``dump.rdb``
        (received to disk), which a restart would load, with its replication offset,
        and keep by a partial resync: old keys would come back. The copy goes too."""
        node = self.node(port)
        assert node.process is not None
        node.process.kill()
        node.process.wait(10)
        node.process = None
        for rdb in Path(node.dir).glob("*.rdb"):
            rdb.unlink()

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start a killed node again (it rejoins as a replica) and wait for the cluster.

        Only once its replica took over: a master without persistence that comes back
        before that returns empty, and its replica would copy the emptiness."""
        node = self.node(port)
        if node.process is None:
            self.wait_ok(timeout)  # its slots served by a promoted replica first
            node.start()
        self.wait_ok(timeout)

    def migrate_slot(self, slot: int, source: int, target: int, pause: float = 0.0) -> int:
        """Move ``slot`` from master ``source`` to master ``target`` as ``redis-cli
        --cluster reshard`` does (IMPORTING/MIGRATING, MIGRATE of its keys, SETSLOT
        NODE on every master). ``pause``: seconds between the last MIGRATE and SETSLOT
        NODE, while the source answers ASK for the slot. Returns how many keys moved."""
        source_id, target_id = self.node_id(source), self.node_id(target)
        self.cli(target, "cluster", "setslot", str(slot), "importing", source_id)
        self.cli(source, "cluster", "setslot", str(slot), "migrating", target_id)
        moved = 0
        while True:
            keys = self.cli(source, "cluster", "getkeysinslot", str(slot), "1000").split()
            if not keys:
                break
            self.cli(source, "migrate", "127.0.0.1", str(target), "", "0", "5000", "keys", *keys)
            moved += len(keys)
        time.sleep(pause)
        others = [p for p in self.master_ports() if p not in (source, target)]
        for port in (target, source, *others):  # the target first, as redis-cli does
            self.cli(port, "cluster", "setslot", str(slot), "node", target_id)
        return moved

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
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
