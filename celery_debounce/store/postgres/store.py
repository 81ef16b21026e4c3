"""``PostgresStore``: the window store on PostgreSQL (psycopg 3 and its pool).

Each operation is one call of a schema function (``functions/<name>.sql``) in one
round trip, in its own transaction (the pool's connections are in autocommit), on the
server's clock. Nothing is sent twice: a connection lost after the call was sent is
:class:`~celery_debounce.store.domain.ReplyLost` (an ``OutcomeUnknown``); no connection
to be had (within ``timeout``) is :class:`~celery_debounce.store.domain.StoreUnavailable`,
as is a call the server cancelled and undid (``statement_timeout``, at most ``timeout``
unless the server's is shorter; a lock timeout, a deadlock); a call a read-only server
(a standby) or a full disk refused is :class:`~celery_debounce.store.domain.ServerRefused`.

What exists: the gate (open or join; the ceiling; payload replacement; the call count;
the call cap; fixed ids and their aliases; exclusive windows; the leading edge) and
``gate_many`` (bulk.py: call by call), take (claims whose lease passed, lapsed leases,
due windows, holds; ``FOR UPDATE SKIP LOCKED``), ack, release, quarantine, flush, the
dispatcher's heartbeat, layouts, expiry sweep with the record sweep, wake-ups
(``LISTEN``/``NOTIFY``), the worker's claim, renewal, end of claim, put back and finish,
the schema's migration and its version check, debounce_collect, the
operators' reads and actions (inspect.py, cancel.py), the counters and gauges
(stats.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql as pg_sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from ...aliases import parse_aliases
from ...errors import DebounceConfigError
from ...settings import DEFAULTS
from ..domain import (
    Released,
    ShardRef,
    StoreUnavailable,
)
from ..records import Record
from ..results import GateResult, TakenWindow, TakeResult
from ..states import as_state
from .bulk import PostgresBulk
from .cancel import PostgresCancel
from .columns import record_fields, select_record
from .definitions import PostgresDefinitions
from .gate_args import gate_args, gate_result
from .inspect import PostgresInspect
from .link import LinkState, connection_class
from .logs import POOL_NAME, route_pool_logs
from .reuse import last_returned_first
from .runs import PostgresRuns
from .schema import (
    BLOCKERS_SQL,
    HAS_SCHEMA_SQL,
    LOCK_SQL,
    MIGRATE_LOCK,
    MIGRATE_LOCK_TIMEOUT_MS,
    MIGRATE_WAIT_S,
    MIN_SERVER_VERSION,
    SCHEMA_VERSION,
    VERSION_SQL,
    WRITE_VERSION_SQL,
    SchemaTooNew,
    _safe,
    blocked,
    grants_sql,
    refusal,
    steps_to,
)
from .sending import IN_SCHEMA_SQL, LOCALS_SQL, RECONNECT_S, PostgresSending
from .stats import PostgresStats
from .step import many, one
from .sweeps import PostgresSweeps
from .wake import PostgresWakeListener

if TYPE_CHECKING:  # pragma: no cover
    from ...aliases import FixedId
    from ...producer.call import PreparedCall
    from ...settings import Settings

__all__ = ["PostgresStore"]

#: Defaults where no settings are given (those of ``debounce_dispatch_lease`` and
#: ``debounce_record_ttl``).
DEFAULT_LEASE_MS = 30_000
DEFAULT_RECORD_TTL_MS = 7 * 86_400_000
DEFAULT_HISTORY_TTL_MS = DEFAULTS["debounce_history_ttl"] * 1000

#: libpq link settings used unless the URL sets them: a connection attempt gives up
#: after 5 s, and a link that goes silent fails in about 10 s (TCP keepalives; sent
#: data unacknowledged for 10 s) instead of hanging the call.
LINK_DEFAULTS: dict[str, object] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
}

_GATE = (
    "SELECT * FROM debounce_gate(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s)"
)
#: The session's own ``statement_timeout`` (ms; 0: none), as the role, the database or
#: the URL set it: ``reset_val`` is untouched by the call's ``set_config``.
_DEFAULT_TIMEOUT = "SELECT reset_val::bigint FROM pg_settings WHERE name = 'statement_timeout'"
#: The schemas with a ``debounce_open`` table other than the one the calls use.
_OTHER_SCHEMAS = (
    "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = 'debounce_open' AND c.relkind = 'r' "
    "AND n.nspname IS DISTINCT FROM current_schema() ORDER BY 1"
)
_TAKE = "SELECT * FROM debounce_take(%s, %s, %s, %s)"
#: After a take failed, the takes ask for half its bytes for this long (seconds), then
#: double back each time up to ``debounce_dispatch_batch_bytes``: a link that could not
#: carry a reply within the timeout is not tried with it again at once.
TAKE_REGROW_S = 60.0
_ACK = "SELECT debounce_ack(%s, %s)"
_RELEASE = "SELECT debounce_release(%s, %s, %s, %s)"
_QUARANTINE = "SELECT aliases FROM debounce_quarantine(%s, %s)"
_FLUSH = select_record(", 'dispatching', capped FROM debounce_close(%s, %s, clock_timestamp())")
_PENDING = select_record(
    ", 'pending', capped, collect_bytes, max_calls, is_trailing FROM debounce_open WHERE ident = %s"
)
_PAYLOADS = select_record(
    ", content_type, payload, options_json, collect_bytes FROM debounce_open "
    "WHERE left(ident, %s) = %s ORDER BY deadline, ident"
)
_DELETE_ALL = (
    "WITH o AS (DELETE FROM debounce_open RETURNING 1), "
    "c AS (DELETE FROM debounce_calls), "
    "t AS (DELETE FROM debounce_taken RETURNING 1), "
    "q AS (DELETE FROM debounce_quiet RETURNING 1), "
    "d AS (DELETE FROM debounce_dispatchers RETURNING 1), "
    "l AS (DELETE FROM debounce_layouts RETURNING 1), "
    "k AS (DELETE FROM debounce_tasks RETURNING 1), "
    "x AS (DELETE FROM debounce_cancelled RETURNING 1), "
    "s AS (DELETE FROM debounce_stats RETURNING 1) "
    "SELECT (SELECT count(*) FROM o) + (SELECT count(*) FROM t) + (SELECT count(*) FROM q)"
    " + (SELECT count(*) FROM d) + (SELECT count(*) FROM l) + (SELECT count(*) FROM k)"
    " + (SELECT count(*) FROM x) + (SELECT count(*) FROM s)"
)
_HELD = (
    "SELECT o.ident, debounce_ms(o.held_since), (SELECT t.task_id FROM debounce_taken t "
    "WHERE t.ident = o.ident AND t.exclusive AND t.state IN ('dispatching', 'queued', "
    "'claimed') LIMIT 1) FROM debounce_open o WHERE o.held_since IS NOT NULL"
)
_LIVENESS = (
    "SELECT debounce_ms(clock_timestamp()), d.name, d.alive, debounce_ms(d.seen_at) "
    "FROM (SELECT 1) AS one LEFT JOIN debounce_dispatchers d ON true ORDER BY d.name"
)


def _migrate(conn: psycopg.Connection[Any], schema: str | None) -> int | None:
    """:meth:`PostgresStore.migrate` on ``conn`` (creating ``schema`` when it is named):
    the version found. Each lock is waited for :data:`MIGRATE_LOCK_TIMEOUT_MS` at most
    (``LockNotAvailable``: nothing changed)."""
    with conn.transaction():
        conn.execute(
            "SELECT set_config('lock_timeout', %s, true)", (f"{MIGRATE_LOCK_TIMEOUT_MS}ms",)
        )
        conn.execute(LOCK_SQL, (MIGRATE_LOCK,))
        if schema is not None:
            conn.execute(
                pg_sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pg_sql.Identifier(schema))
            )
        found = _read_version(conn)
        if found is not None and found > SCHEMA_VERSION:
            error = refusal(found)
            assert isinstance(error, SchemaTooNew)
            raise error
        for step in steps_to(found, SCHEMA_VERSION):
            conn.execute(step.encode())
        conn.execute(WRITE_VERSION_SQL, (SCHEMA_VERSION,))
        return found


def _read_version(conn: psycopg.Connection[Any]) -> int | None:
    """The schema version of the connection's ``search_path`` (None: no schema)."""
    row = conn.execute(HAS_SCHEMA_SQL).fetchone()
    if row is None or not row[0]:
        return None
    row = conn.execute(VERSION_SQL).fetchone()
    return None if row is None or row[0] is None else int(row[0])


class PostgresStore(
    PostgresDefinitions,
    PostgresSending,
    PostgresRuns,
    PostgresSweeps,
    PostgresBulk,
    PostgresCancel,
    PostgresInspect,
    PostgresStats,
):
    """Windows in a PostgreSQL database (``postgresql://user:pass@host/db``).

    ``settings`` gives the dispatch lease and the record TTL (otherwise the settings'
    defaults). The pool opens in the background: an unreachable server is
    ``StoreUnavailable`` at the first call that needs it, after ``timeout`` seconds.
    """

    def __init__(
        self,
        url: str,
        settings: Settings | None = None,
        *,
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 5.0,
        lease_ms: int | None = None,
        record_ttl_ms: int | None = None,
        schema: str | None = None,
    ) -> None:
        self._settings = settings
        self.lease_ms = lease_ms or (settings.dispatch_lease_ms if settings else DEFAULT_LEASE_MS)
        self.record_ttl_ms = record_ttl_ms or (
            settings.record_ttl_ms if settings else DEFAULT_RECORD_TTL_MS
        )
        self.history_ttl_ms = settings.history_ttl_ms if settings else DEFAULT_HISTORY_TTL_MS
        given = conninfo_to_dict(url)
        links = {name: value for name, value in LINK_DEFAULTS.items() if name not in given}
        #: how the pool's last connection attempt went (link.py)
        self.link = LinkState()
        route_pool_logs()
        #: each connection's settings (the pool's, and a renewal's own: _write_now); no
        #: server-side prepared statements: behind a pooler in transaction mode another
        #: client's statement of the same name would run instead
        self.connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": None,
            **links,
        }
        self.pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            open=False,
            connection_class=connection_class(self.link),
            # the pool's retries back off (1 s, 2 s, 4 s, ...) up to this, then start
            # afresh at the next call: a server back after an outage is used again soon
            reconnect_timeout=RECONNECT_S,
            kwargs=self.connect_kwargs,
            name=POOL_NAME,
        )
        last_returned_first(self.pool)
        self.pool.open(wait=False)
        #: a debounce_collect window's byte budget, as the Redis store's gate gives it
        self.max_payload_bytes: int = (
            settings.max_payload_bytes if settings else DEFAULTS["debounce_max_payload_bytes"]
        )
        #: the most bytes of bodies a take leases (``debounce_dispatch_batch_bytes``), and
        #: what the next take asks for: halved by a take that failed (a reply too big
        #: for the link within the timeout is cut), doubled back by each one answered
        #: once :data:`TAKE_REGROW_S` passed since the last failure
        self.batch_bytes: int = (
            settings.dispatch_batch_bytes if settings else DEFAULTS["debounce_dispatch_batch_bytes"]
        )
        self.take_bytes = self.batch_bytes
        self._take_failed_at = -TAKE_REGROW_S
        self.url = url
        self.timeout = timeout
        #: the schema of the tables (None: the URL's ``search_path``), set per call
        self.schema = schema
        if schema is None and settings is not None:
            self.schema = settings.postgres_schema
        #: what each call's transaction sets first, and its arguments: the call's
        #: ``statement_timeout`` is ``timeout``, or a shorter one the role, the database
        #: or the URL sets (read at the check)
        self.locals_sql = LOCALS_SQL if self.schema is None else LOCALS_SQL + IN_SCHEMA_SQL
        self.locals = self._locals(max(1, int(timeout * 1000)))
        self.links = links
        self._checked = False
        self._check_lock = threading.Lock()

    # -- BaseStore ---------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            raise DebounceConfigError("this PostgresStore was built without settings")
        return self._settings

    def tag(self, shard: ShardRef) -> str:
        """The wire form of a shard: the store has one, whatever the layout says."""
        return str(shard)

    def check_server(self, outage_raises: bool = False) -> None:
        """Refuse a server older than :data:`MIN_SERVER_VERSION` and a schema that is
        missing, older or newer than :data:`SCHEMA_VERSION` (once per store)."""
        try:
            self._check()
        except StoreUnavailable:
            if outage_raises:
                raise

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the schema --------------------------------------------------------------------

    def schema_version(self) -> int | None:
        """The database's schema version (None: it has none)."""
        found: int | None = self._read(_read_version)
        return found

    def migrate(self, wait_s: float = MIGRATE_WAIT_S) -> tuple[int | None, int]:
        """Create the schema, or upgrade an older one, in one transaction under an
        advisory lock (concurrent migrations wait for each other); ``(version before,
        version now)``. A newer schema is refused (:class:`SchemaTooNew`).

        On a live database each attempt waits for a table lock briefly (calls queue
        behind it only that long) and is retried with backoff for up to ``wait_s``;
        then :class:`MigrationBlocked` names the sessions holding the locks."""
        deadline = time.monotonic() + wait_s
        delay = 0.05
        while True:
            try:
                before = self._changing_schema(lambda conn: _migrate(conn, self.schema))
                break
            except StoreUnavailable as exc:
                if not isinstance(exc.__cause__, pg_errors.LockNotAvailable):
                    raise
                remaining = deadline - time.monotonic()
                if remaining <= 0:  # the whole wait spent: never sooner (``--wait``)
                    raise blocked(wait_s, self._read(many(BLOCKERS_SQL))) from exc
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 1.0)
        with self._check_lock:
            self._checked = False
        return before, SCHEMA_VERSION

    def grant(self, role: str) -> str:
        """Give ``role`` what workers, dispatchers and producers need on the schema
        (:data:`~.schema.GRANTS_SQL`, run as its owner); the SQL it ran."""
        done: list[str] = []

        def run(conn: psycopg.Connection[Any]) -> None:
            row = conn.execute("SELECT current_schema()").fetchone()
            if row is None or row[0] is None:
                raise StoreUnavailable("PostgreSQL store: no schema in the search_path")
            text = grants_sql(role, str(row[0]))
            conn.execute(text.encode())
            done.append(text)

        self._changing_schema(run)
        return done[0]

    def _changing_schema(self, fn: Any) -> Any:
        """``fn(connection)`` that changes the schema: an error of the server that is
        not an outage (no right to create a table, say) is a :class:`DebounceConfigError`
        naming it."""
        try:
            return self._read(fn)
        except psycopg.Error as exc:
            raise DebounceConfigError(f"the schema could not be migrated: {_safe(exc)}") from exc

    def other_schemas(self) -> list[tuple[str, int]]:
        """Every other schema of the database holding this package's tables, with its
        open windows: ``[(schema, open windows)]`` (``migrate`` names them)."""
        found = self._read(many(_OTHER_SCHEMAS))
        result = []
        for (name,) in found:
            query = pg_sql.SQL("SELECT count(*) FROM {}.debounce_open").format(
                pg_sql.Identifier(name)
            )
            row = self._read(lambda conn, q=query: conn.execute(q).fetchone())
            result.append((str(name), int(row[0]) if row else 0))
        return result

    def _check(self) -> None:
        if self._checked:
            return
        with self._check_lock:
            if self._checked:
                return

            def read(conn: psycopg.Connection[Any]) -> tuple[int, int | None, int]:
                row = conn.execute(_DEFAULT_TIMEOUT).fetchone()
                default_ms = int(row[0]) if row else 0
                return conn.info.server_version, _read_version(conn), default_ms

            server, found, default_ms = self._read(read)
            ours = max(1, int(self.timeout * 1000))
            if 0 < default_ms < ours:
                self.locals = self._locals(default_ms)
            if server // 10000 < MIN_SERVER_VERSION:
                raise DebounceConfigError(
                    f"PostgreSQL {server // 10000} is older than the oldest the store "
                    f"supports ({MIN_SERVER_VERSION})"
                )
            error = refusal(found)
            if error is not None:
                raise error
            self._checked = True

    # -- ProducerStore -----------------------------------------------------------------

    def gate(self, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
        """One call: open the window of ``call.ident`` or join the open one (one
        ``debounce_gate`` call)."""
        self._check()
        params = gate_args(call, fixed, self.max_payload_bytes)
        row = self._write(one(_GATE, params), "gate")
        assert row is not None
        return gate_result(row)

    # -- DispatcherStore ---------------------------------------------------------------

    def take(
        self, shard: ShardRef, limit: int, observer: str = "", lapse_upto: int | None = None
    ) -> TakeResult:
        """Lease up to ``limit`` windows for one dispatch lease: lapsed claims released
        first (up to ``lapse_upto`` ms), then those whose lease passed, then the due
        ones, earliest first; a held exclusive window is not taken (one
        ``debounce_take`` call). The windows stop at :attr:`take_bytes` of bodies (the
        first whatever its size)."""
        self._check()
        budget = self.take_bytes
        try:
            rows = self._write(many(_TAKE, (limit, self.lease_ms, lapse_upto, budget)), "take")
        except StoreUnavailable:
            self.take_bytes = max(1, budget // 2)
            self._take_failed_at = time.monotonic()
            raise
        if time.monotonic() - self._take_failed_at >= TAKE_REGROW_S:
            self.take_bytes = min(self.batch_bytes, budget * 2)
        header = rows[-1]
        now_ms, next_ms = int(header[14]), header[15]
        windows = [
            TakenWindow(
                shard=shard,
                taken_ms=now_ms,
                failures=int(row[10]),
                held_ms=int(row[12]),
                record=Record(
                    **record_fields(row),  # the take's rows begin with RECORD_COLUMNS
                    state="dispatching",
                    content_type=row[6],
                    payload=bytes(row[7]),
                    options_json=row[8],
                    tries=int(row[9]),
                    capped=bool(row[11]),
                    leading=bool(row[13]),
                ),
            )
            for row in rows[:-1]
        ]
        next_in = -1 if next_ms is None else max(0, int(next_ms) - now_ms)
        return TakeResult(now_ms=now_ms, next_in_ms=next_in, windows=windows)

    def ack(self, shard: ShardRef, task_ids: Sequence[str]) -> int:
        """Published: these windows are queued, kept for the record TTL (idempotent);
        how many were dispatching."""
        if not task_ids:
            return 0
        self._check()
        row = self._write(one(_ACK, (list(task_ids), self.record_ttl_ms)), "ack")
        return int(row[0]) if row else 0

    def release(self, shard: ShardRef, delay_ms: int, windows: Sequence[Released]) -> int:
        """Not published: each window still leased to this caller (its ``tries``) is
        taken again in ``delay_ms`` (``failed``: a publish failure counted); how many.
        Sent at most once."""
        if not windows:
            return 0
        ids = [w.task_id for w in windows]
        tries = [w.tries for w in windows]
        counted = [w.failed for w in windows]
        self._check()
        row = self._write(
            one(_RELEASE, (ids, tries, counted, delay_ms)),
            "release",
        )
        return int(row[0]) if row else 0

    def quarantine(
        self,
        shard: ShardRef,
        task_id: str,
        reason: str,
    ) -> list[dict[str, Any]] | None:
        """Set a taken (dispatching) window aside for good: its aliases, or None when
        it was not dispatching."""
        self._check()
        row = self._write(one(_QUARANTINE, (task_id, reason)), "quarantine")
        return None if row is None else parse_aliases(row[0])

    def wake_listener(self) -> PostgresWakeListener:
        """A new subscription to the wake channel (one per dispatcher)."""
        return PostgresWakeListener(self)

    def refresh_topology(self) -> None:
        """Nothing to find again: one server."""

    # -- OperatorStore (the reads and actions that exist) ------------------------------

    def ping(self) -> bool:
        try:
            self._read(one("SELECT 1"))
        except StoreUnavailable:
            return False
        return True

    def time_ms(self, operation: str = "time") -> int:
        """The server's clock (``clock_timestamp()``), ms."""
        row = self._read(one("SELECT debounce_ms(clock_timestamp())"))
        assert row is not None
        return int(row[0])

    def liveness(self) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
        """``(server ms, [(name, last heartbeat ms)], [(name, stopped at ms)])``."""
        self._check()
        rows = self._read(many(_LIVENESS))
        beats = [(name, int(ms), alive) for _, name, alive, ms in rows if name is not None]
        return (
            int(rows[0][0]),
            [(n, ms) for n, ms, alive in beats if alive],
            [(n, ms) for n, ms, alive in beats if not alive],
        )

    def pending_payloads(self, shard: int, prefix: str | None = None) -> Iterator[Record]:
        """Every pending window (whose ident starts with ``prefix``) with its payload and
        options, a collect window with its calls so far, in deadline order (the testing
        helpers' read)."""
        self._check()
        found = self._read(many(_PAYLOADS, (len(prefix or ""), prefix or "")))
        for row in found:
            ctype, payload, opts, size = row[6:]
            yield Record(
                **record_fields(row),
                state="pending",
                content_type=ctype,
                payload=bytes(payload),
                options_json=opts,
                collected_bytes=size,
                collect_list=None if size is None else row[0],
                collected=None if size is None else self._collected(row[0]),
            )

    def delete_all(self) -> int:
        """Delete every row but the schema's version (windows, quiet periods, cancels'
        kept answers, counters, heartbeats, layouts, task definitions), as the Redis
        store deletes every key under its prefix; how many rows."""
        self._check()
        (deleted,) = self._write(one(_DELETE_ALL), "clear")
        return int(deleted)

    def pending(self, shard: int, ident: str) -> Record | None:
        """The open window of ``ident``, or None."""
        self._check()
        row = self._read(one(_PENDING, (ident,)))
        if row is None:
            return None
        max_calls, trailing = row[9:]
        return _record(row[:9])._replace(max_calls=max_calls, trailing=bool(trailing))

    def held(self, shard: int) -> dict[str, tuple[int, str | None]]:
        """Exclusive windows held: ident -> (held since ms, the id of the run in
        progress it waits for, None if that one just ended)."""
        self._check()
        rows = self._read(many(_HELD))
        return {ident: (int(since), runner) for ident, since, runner in rows}

    def flush(self, shard: int, windows: Sequence[tuple[str, str]]) -> list[Record]:
        """Close the open window of each ``(ident, task id)`` (of that id unless ""), one
        call each: the next take takes them. The windows as flushed."""
        flushed = []
        for ident, task_id in windows:
            self._check()
            row = self._write(one(_FLUSH, (ident, task_id)), "flush")
            if row is not None:
                flushed.append(_record(row))
        return flushed


def _record(row: Sequence[Any]) -> Record:
    """A window of ``_PENDING`` (with its collected bytes) or ``_FLUSH``."""
    task_id = row[0]
    state, capped, *size = row[6:]
    return Record(
        **record_fields(row),
        state=as_state(state),
        capped=bool(capped),
        collected_bytes=size[0] if size else None,
        collect_list=task_id if size and size[0] is not None else None,
    )


if TYPE_CHECKING:  # pragma: no cover
    from ..api import DispatcherStore, WorkerStore

    def _postgres_is_a_worker_store(store: PostgresStore) -> WorkerStore:
        """``mypy --strict`` fails here when a worker role member drifts from the
        contract (the operator role is not complete yet)."""
        return store

    def _postgres_is_a_dispatcher_store(store: PostgresStore) -> DispatcherStore:
        """The same for the dispatcher role."""
        return store
