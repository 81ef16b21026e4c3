"""How the PostgreSQL store sends a call (a base of ``PostgresStore``): a pooled
connection, the call's transaction with the store's settings in it, the watchdog, and
the server's answers as the store's typed errors.

Reads and idempotent steps go through ``_read`` (a lost connection is an outage);
writes through ``_write``, sent at most once (a connection lost once the call may have
reached the server is :class:`ReplyLost`).
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import StoreMisconfigured
from ..domain import ReplyLost, ServerRefused, StoreUnavailable, waited_out
from ..records import LATE_BUCKETS_MS
from .gate_args import refused
from .link import LinkState
from .schema import _safe, _schema_error
from .simple_query import UNQUOTABLE, simple_query
from .step import Step, search_path
from .watchdog import guarded

__all__ = ["PostgresSending"]


class PostgresSending:
    """Sending of :class:`~.store.PostgresStore`."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides
        pool: ConnectionPool[psycopg.Connection[Any]]
        url: str
        connect_kwargs: dict[str, Any]
        timeout: float
        link: LinkState
        schema: str | None
        history_ttl_ms: int
        locals_sql: str
        locals: tuple[str, ...]
        _checked: bool
        _check_lock: threading.Lock

    def _locals(self, timeout_ms: int) -> tuple[str, ...]:
        """:attr:`locals_sql`'s arguments, for a call's ``statement_timeout`` of
        ``timeout_ms``."""
        buckets = ",".join(str(bound) for bound in LATE_BUCKETS_MS)
        given = (str(timeout_ms), str(self.history_ttl_ms), buckets)
        return given if self.schema is None else (*given, search_path(self.schema))

    def _run(self, conn: psycopg.Connection[Any], work: Step | Callable[[Any], Any]) -> Any:
        """``work`` in one transaction that begins with the store's settings
        (:data:`LOCALS_SQL`, for that transaction only): a :class:`Step` sent with them
        as one simple query (one message, one round trip, one implicit transaction; its
        values quoted by the client, simple_query.py, so nothing is prepared on the
        server); a function ``work(conn)`` (a read of several statements, a migration)
        in an explicit transaction.

        Not libpq's pipeline: psycopg ends a pipeline with a Flush that may arrive after
        the transaction's end, and PgBouncer before 1.21 then holds its server
        connection for this client until the client's next call."""
        if isinstance(work, Step):
            sql = f"{self.locals_sql}; {work.sql}"
            params = (*self.locals, *(work.params or ()))
            rows = simple_query(conn, sql, params)
            if rows is UNQUOTABLE:  # arrays, a NUL byte: the cursor quotes (or refuses) them
                cursor = psycopg.ClientCursor(conn)
                cursor.execute(sql, params)
                cursor.nextset()
                rows = cursor.fetchall()
            if not work.first:
                return rows
            return rows[0] if rows else None
        with conn.transaction():
            conn.execute(self.locals_sql, self.locals)
            return work(conn)

    def _getconn(self) -> psycopg.Connection[Any]:
        """A pooled connection within ``timeout``. While none is idle, the pool's last
        connection attempt is looked at every :data:`LOOK_S`: a misconfiguration is
        raised at once (:class:`StoreMisconfigured`), a server that refuses or cannot be
        found is :class:`StoreUnavailable` at once; otherwise the call waits."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self.pool.getconn(timeout=IDLE_S)
            except PoolTimeout:
                pass
            self.link.raise_if_hopeless()
            left = deadline - time.monotonic()
            try:
                return self.pool.getconn(timeout=max(IDLE_S, min(LOOK_S, left)))
            except PoolTimeout as exc:
                if time.monotonic() >= deadline:
                    last = self.link.failure
                    why = f" (last connection attempt: {_safe(last)})" if last else ""
                    raise waited_out(
                        StoreUnavailable(
                            f"PostgreSQL store unreachable: no connection within "
                            f"{self.timeout:g}s{why}"
                        )
                    ) from exc

    def _read(self, fn: Any) -> Any:
        """``fn(connection)`` for a read or an idempotent step: any lost connection is
        an outage."""
        conn = self._getconn()
        try:
            return _answered(self._run, fn, conn, self.timeout + ANSWER_GRACE)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"PostgreSQL store: {_safe(exc)}") from exc
        except pg_errors.UndefinedFunction as exc:
            raise _schema_error(exc) from exc
        except pg_errors.InsufficientPrivilege as exc:
            raise _no_right(exc) from exc
        finally:
            self.pool.putconn(conn)

    def _connection(self) -> psycopg.Connection[Any]:
        """A pooled connection that was not seen closed: one the server (or the link)
        closed while it was idle in the pool is discarded before anything is sent on
        it, so a call after an outage is :class:`StoreUnavailable`, not a lost reply.
        No round trip: the socket is polled."""
        for _ in range(self.pool.max_size + 1):
            conn = self._getconn()
            if not _closed_while_idle(conn):
                return conn
            conn.close()
            self.pool.putconn(conn)  # a closed connection: the pool replaces it
        raise StoreUnavailable("PostgreSQL store: every pooled connection was closed")

    def _write(self, fn: Any, operation: str) -> Any:
        """``fn(connection)`` for a step that changes windows, sent at most once: a
        connection lost once the call may have reached the server is
        :class:`ReplyLost` (an ``OutcomeUnknown``)."""
        conn = self._connection()
        try:
            return self._sent(fn, conn, operation)
        finally:
            self.pool.putconn(conn)

    def _write_now(self, fn: Any, operation: str) -> Any:
        """``fn`` as :meth:`_write` sends it, without waiting for the pool: on an idle
        pooled connection if one is ready, else on a connection opened for this call
        alone (closed after). For a claim's renewal, whose lease waits neither for the
        pool's reconnects (they back off up to :data:`RECONNECT_S` after an outage) nor
        for runs that hold its connections (as the Redis store's renewal link)."""
        try:
            conn: psycopg.Connection[Any] | None = self.pool.getconn(timeout=IDLE_S)
        except PoolTimeout:
            conn = None
        if conn is not None and _closed_while_idle(conn):
            conn.close()
            self.pool.putconn(conn)  # a closed connection: the pool replaces it
            conn = None
        if conn is not None:
            try:
                return self._sent(fn, conn, operation)
            finally:
                self.pool.putconn(conn)
        try:  # the pool's own class: the attempt is recorded in self.link, as the pool's
            conn = self.pool.connection_class.connect(self.url, **self.connect_kwargs)
        except psycopg.Error as exc:
            self.link.raise_if_hopeless()  # a misconfiguration, by name
            raise StoreUnavailable(f"PostgreSQL store unreachable: {_safe(exc)}") from exc
        try:
            return self._sent(fn, conn, operation)
        finally:
            conn.close()

    def _sent(self, fn: Any, conn: psycopg.Connection[Any], operation: str) -> Any:
        """``fn(conn)`` sent at most once, the server's answers as typed errors."""
        try:
            return _answered(self._run, fn, conn, self.timeout + ANSWER_GRACE)
        except psycopg.OperationalError as exc:
            raise ReplyLost(
                f"the PostgreSQL store's reply to {operation} was lost (it may have run; "
                f"it was not sent again): {_safe(exc)}"
            ) from exc
        except pg_errors.UndefinedFunction as exc:
            with self._check_lock:
                self._checked = False
            raise _schema_error(exc) from exc
        except pg_errors.InsufficientPrivilege as exc:
            raise _no_right(exc) from exc
        except psycopg.Error as exc:
            error = refused(exc.sqlstate, _safe(exc))
            if error is not None:
                raise error from exc
            raise


#: How long a call takes an idle pooled connection in, at most (seconds); and how often
#: a call that waits for one looks at the pool's last connection attempt.
IDLE_S = 0.001
LOOK_S = 0.05
#: The longest the pool's retries back off, then a call starts them afresh (seconds).
RECONNECT_S = 10.0
#: How long past the store's ``timeout`` a call may wait for its answer before its
#: connection is shut down: the server cancels a statement at ``timeout``
#: (``statement_timeout``) and answers, unless it is not running at all.
ANSWER_GRACE = 1.0
#: SQLSTATEs of a call the server refused before it wrote anything (a read-only
#: transaction: a standby, ``default_transaction_read_only``; insufficient resources: a
#: full disk, out of memory; the server is starting or stopping): ``ServerRefused``.
REFUSED = ("25006", "53", "57P03")
#: SQLSTATEs of a call the server cancelled and undid (``statement_timeout`` or a
#: cancel, ``lock_timeout``, a serialization failure or a deadlock): its error reply
#: says the transaction rolled back, so nothing was written: ``StoreUnavailable``.
UNDONE = ("57014", "55P03", "40")


def _no_right(exc: psycopg.Error) -> StoreMisconfigured:
    """A statement the role may not run: a misconfiguration, raised by name, nothing
    written (the grants are ``debounce migrate --grant-to``'s)."""
    return StoreMisconfigured(
        f"PostgreSQL store: {_safe(exc)}: the role lacks the grants the store needs "
        "(run `celery -A proj debounce migrate --grant-to ROLE` as the schema's owner)"
    )


def _answered(run: Any, work: Any, conn: psycopg.Connection[Any], seconds: float) -> Any:
    """``run(conn, work)``, with a call the server answered by refusing or undoing it raised
    as the store's typed error (nothing was written); other errors as they are. A call
    not answered within ``seconds`` has its connection shut down (watchdog.py): a
    psycopg ``OperationalError``, as for any lost connection. A call the server never
    answered (cut by the watchdog) is marked :func:`waited_out`, for the outage breaker;
    one it cancelled at ``statement_timeout`` is not: the server answers (a lock on one
    window's row is that key's, not an outage of the store)."""
    started = time.monotonic()
    try:
        with guarded(conn, seconds):
            return run(conn, work)
    except psycopg.Error as exc:
        state = exc.sqlstate or ""
        if state.startswith(REFUSED):
            raise ServerRefused(
                f"PostgreSQL store refused the call, nothing written: {_safe(exc)}"
            ) from exc
        if state.startswith(UNDONE):
            raise StoreUnavailable(
                f"PostgreSQL store cancelled the call, nothing written: {_safe(exc)}"
            ) from exc
        if time.monotonic() - started >= seconds:  # the watchdog shut it down
            waited_out(exc)
        raise


#: The store's settings, for the transaction of each call only (nothing stays on the
#: connection: a pooler in transaction mode hands it to other clients): the statement
#: timeout, and the history TTL and lateness buckets of the schema's counters.
LOCALS_SQL = (
    "SELECT set_config('statement_timeout', %s, true), "
    "set_config('debounce.history_ttl_ms', %s, true), "
    "set_config('debounce.late_buckets_ms', %s, true)"
)


#: With a schema of its own: the ``search_path`` too (``pg_catalog`` stays first).
IN_SCHEMA_SQL = ", set_config('search_path', %s, true)"


def _closed_while_idle(conn: psycopg.Connection[Any]) -> bool:
    """True when an idle pooled connection is not to be trusted with a call: closed,
    broken, or with anything to read. It listens to nothing, so bytes on it are the
    server ending it (a shutdown sends its FATAL error, then closes: a call sent between
    the two would read that error as its reply, an outcome unknown) or, rarely, a
    notice; either way the pool makes a new one."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable) or conn.pgconn.status != psycopg.pq.ConnStatus.OK
