"""The PostgreSQL store's wake-ups: a dispatcher's ``LISTEN`` on the schema's channel."""

from __future__ import annotations

import select
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql as pg_sql

from ..domain import StoreUnavailable
from .schema import _safe, _schema_error
from .watchdog import guarded

if TYPE_CHECKING:  # pragma: no cover
    from .store import PostgresStore


class PostgresWakeListener:
    """A dispatcher's ``LISTEN`` on the schema's wake channel, on a connection of its
    own. When that connection fails, :meth:`wait` returns (the dispatcher takes, as
    after a wake-up) and the next wait subscribes again; while it cannot subscribe, a
    wait is a plain sleep (the dispatcher polls, as without wake-ups)."""

    #: how long one look at the socket lasts at most (``stop`` is seen that often)
    SLICE_S = 0.25

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def subscribed(self) -> bool:
        return self._conn is not None

    def subscribe(self) -> None:
        """LISTEN (no-op when listening); an outage is :class:`StoreUnavailable`."""
        if self._conn is not None:
            return
        try:  # outside the pool: the LISTEN lives as long as its connection
            conn = psycopg.connect(self.store.url, autocommit=True, **self.store.links)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise StoreUnavailable(f"PostgreSQL store: {_safe(exc)}") from exc
        try:
            with guarded(conn, self.store.timeout + 1.0):  # a server that stopped: no hang
                row = conn.execute("SELECT debounce_wake_channel()").fetchone()
                assert row is not None
                conn.execute(pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(row[0])))
        except psycopg.Error as exc:
            conn.close()
            if isinstance(exc, pg_errors.UndefinedFunction):
                raise _schema_error(exc) from exc
            raise StoreUnavailable(f"PostgreSQL store: {_safe(exc)}") from exc
        self._conn = conn

    def wait(self, seconds: float, stop: threading.Event) -> None:
        """Sleep up to ``seconds``; return early on a notification or when ``stop``
        is set, or when the connection fails (it is dropped)."""
        deadline = time.monotonic() + seconds
        if seconds <= 0:
            return
        try:
            self.subscribe()
        except StoreUnavailable:
            stop.wait(seconds)
            return
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._poll(min(remaining, self.SLICE_S)):
                return
            if self._conn is None:  # failed: a wake-up may be lost, so the dispatcher
                return  # takes now, and its next wait subscribes again

    def _poll(self, timeout: float) -> bool:
        """True when a notification arrived within ``timeout`` (all of them read)."""
        conn = self._conn
        assert conn is not None
        try:
            readable, _, _ = select.select([conn.fileno()], [], [], timeout)
            if not readable:
                return False
            conn.pgconn.consume_input()
            got = False
            while conn.pgconn.notifies() is not None:
                got = True
            if conn.pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the wake connection closed")
            return got
        except (OSError, psycopg.Error):
            self.close()
            return False

    def close(self) -> None:
        """Stop listening (the connection is closed)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: S110 - closing a broken connection
                pass
