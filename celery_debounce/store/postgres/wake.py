"""The PostgreSQL store's wake-ups: a dispatcher's ``LISTEN`` on the schema's channel.

``LISTEN`` needs a session of its own: it connects to ``debounce_postgres_listen_url``
(by default the store's URL) and checks once that a notification arrives. Through a
pooler in transaction mode none does (the server connection goes back to the pool):
then, as with ``debounce_postgres_listen_url = ""``, the dispatcher polls, and says so.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql as pg_sql

from ...redact import redact
from ..domain import StoreUnavailable
from .schema import _safe, _schema_error
from .step import one
from .watchdog import guarded

if TYPE_CHECKING:  # pragma: no cover
    from .store import PostgresStore

logger = logging.getLogger("celery_debounce.dispatch")


class PostgresWakeListener:
    """A dispatcher's ``LISTEN`` on the schema's wake channel, on a connection of its
    own. When that connection fails, :meth:`wait` returns (the dispatcher takes, as
    after a wake-up) and the next wait subscribes again; while it cannot subscribe, a
    wait is a plain sleep (the dispatcher polls, as without wake-ups)."""

    #: how long one look at the socket lasts at most (``stop`` is seen that often)
    SLICE_S = 0.25
    #: how long the first subscription waits for its own test notification
    CHECK_S = 2.0

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._conn: psycopg.Connection[Any] | None = None
        settings = store._settings
        #: where to LISTEN; None: nowhere (the dispatcher polls)
        self.url: str | None = store.url
        if settings is not None and settings.postgres_listen_url is not None:
            self.url = settings.postgres_listen_url or None
        self._checked = False
        if self.url is None:
            logger.info(
                "debounce: PostgreSQL wake-ups are off (debounce_postgres_listen_url is ''):"
                " the dispatcher polls"
            )

    @property
    def subscribed(self) -> bool:
        return self._conn is not None

    def subscribe(self) -> None:
        """LISTEN (no-op when listening, or polling); an outage is
        :class:`StoreUnavailable`."""
        if self._conn is not None or self.url is None:
            return
        try:  # outside the pool: the LISTEN lives as long as its connection
            conn = psycopg.connect(
                self.url,
                autocommit=True,
                prepare_threshold=None,
                **self.store.links,  # type: ignore[arg-type]
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(f"PostgreSQL store: {_safe(exc)}") from exc
        try:
            with guarded(conn, self.store.timeout + 1.0):  # a server that stopped: no hang
                with conn.transaction():  # the store's schema, for this transaction
                    conn.execute(self.store.locals_sql, self.store.locals)
                    row = conn.execute("SELECT debounce_wake_channel()").fetchone()
                assert row is not None
                conn.execute(pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(row[0])))
        except psycopg.Error as exc:
            conn.close()
            if isinstance(exc, pg_errors.UndefinedFunction):
                raise _schema_error(exc) from exc
            raise StoreUnavailable(f"PostgreSQL store: {_safe(exc)}") from exc
        self._conn = conn
        if not self._checked:
            self._check_delivery()

    def _check_delivery(self) -> None:
        """Notify once through the store and wait for it here: through a pooler in
        transaction mode it never arrives, and the dispatcher polls from then on."""
        self.store._write(one("SELECT pg_notify(debounce_wake_channel(), '')"), "wake check")
        deadline = time.monotonic() + self.CHECK_S
        arrived = False
        while not arrived and self._conn is not None and time.monotonic() < deadline:
            arrived = self._poll(min(self.SLICE_S, deadline - time.monotonic()))
        if self._conn is None:  # the connection failed meanwhile: check at the next one
            return
        self._checked = True
        where = redact(self.url or "")
        if arrived:
            logger.info("debounce: PostgreSQL wake-ups: LISTEN on %s", where)
            return
        logger.warning(
            "debounce: PostgreSQL wake-ups do not arrive on %s (a pooler in transaction "
            "mode?): the dispatcher polls. Set debounce_postgres_listen_url to a direct "
            "connection to the server to be woken",
            where,
        )
        self.close()
        self.url = None

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
        if self._conn is None:  # wake-ups off, or they do not arrive here: poll
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
