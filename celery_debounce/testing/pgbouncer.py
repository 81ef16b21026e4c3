"""A throwaway PgBouncer in front of a :class:`~celery_debounce.testing.postgres.LocalPostgres`,
as shops deploy it: transaction pooling (a client's server connection is another client's
between transactions), on a free loopback port, removed on close.

The binary is Debian's (``/usr/sbin/pgbouncer``; scripts/ensure-postgres.sh installs it),
or ``$CELERY_DEBOUNCE_PGBOUNCER``, or ``pgbouncer`` on ``PATH``. It refuses to run as
root: as root it runs as the server's system user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .postgres import LocalPostgres
from .reaper import Watched
from .servers import _tail, free_port

#: The binary to run: first choice.
BINARY_ENV = "CELERY_DEBOUNCE_PGBOUNCER"


def find_pgbouncer() -> Path | None:
    """The ``pgbouncer`` binary, or None when it is not installed."""
    for candidate in (os.environ.get(BINARY_ENV), shutil.which("pgbouncer"), "/usr/sbin/pgbouncer"):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


class LocalPgBouncer(Watched):
    """PgBouncer on ``127.0.0.1`` in front of ``server`` (every database, its user
    trusted), ``pool_mode`` ``transaction`` unless told, at most ``pool_size`` server
    connections per database and user."""

    LOG = "pgbouncer.log"

    def __init__(
        self, server: LocalPostgres, pool_mode: str = "transaction", pool_size: int = 10
    ) -> None:
        self.server = server
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="celery-debounce-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._as = dict(server._as)
        if self._as:
            os.chown(self.dir, self._as["user"], self._as["group"])

    def url(self, dbname: str = "postgres") -> str:
        """The URL through PgBouncer (``postgresql://debounce@127.0.0.1:<port>/<dbname>``)."""
        return f"postgresql://{self.server.USER}@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 15.0) -> LocalPgBouncer:
        binary = find_pgbouncer()
        if binary is None:
            raise FileNotFoundError(
                f"no pgbouncer found: run scripts/ensure-postgres.sh (Debian's pgbouncer) or "
                f"set {BINARY_ENV}"
            )
        users = self.dir / "users.txt"
        users.write_text(f'"{self.server.USER}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={self.server.port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\n"
            f"admin_users = {self.server.USER}\n"
            f"logfile = {self.dir / self.LOG}\n"
            "server_check_delay = 0\n"
        )
        for path in (users, ini):
            if self._as:
                os.chown(path, self._as["user"], self._as["group"])
        self.process = subprocess.Popen(
            [str(binary), str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            **self._as,
        )
        self._watch(self.process.pid, self.dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"pgbouncer exited with {self.process.returncode}:\n"
                    + "\n".join(_tail(self.dir / self.LOG, 20))
                )
            if self._answers():
                return self
            time.sleep(0.05)
        raise TimeoutError(f"pgbouncer did not listen on port {self.port}")

    def _answers(self) -> bool:
        """This PgBouncer answers on its port: its admin console names it (a free
        port another server took meanwhile is not mistaken for it)."""
        import psycopg

        try:
            with psycopg.connect(
                self.url("pgbouncer"), autocommit=True, connect_timeout=2, prepare_threshold=None
            ) as conn:
                row = conn.execute("SHOW VERSION").fetchone()
        except psycopg.Error:
            return False
        return row is not None and "PgBouncer" in str(row[0])

    def stop(self) -> None:
        self._unwatch()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPgBouncer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
