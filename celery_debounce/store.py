"""The windows' store: every Redis operation of the package, one typed method each.

:class:`WindowStore` holds one app's Redis client and its Lua scripts (found by
file in ``celery_debounce/lua/``) and offers one method per operation; key names
and record fields come from :mod:`celery_debounce.layout`. No other module of the
package imports redis-py (``backend.py`` re-exports this module's names for code
written before it existed). Every redis-py error leaves as
:class:`~celery_debounce.DebounceBackendError`.

The hot path, :meth:`WindowStore.gate`, is one ``EVALSHA`` sent on a pooled
connection without redis-py's per-command wrapper (:meth:`WindowStore._evalsha`).
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple

import redis
from celery import Celery
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.commands.core import Script
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    TryAgainError,
)
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from .errors import DebounceBackendError, DebounceOutcomeUnknown
from .gate import GateResult, gate_args, gate_keys, parse_reply
from .layout import (
    CANCEL_FIELDS,
    F_ID,
    F_STATE,
    FLUSH_FIELDS,
    HOT_KEYS_KEPT,
    INSPECT_FIELDS,
    LATE_BUCKETS_MS,
    LIST_FIELDS,
    PAYLOAD_FIELDS,
    TAKE_FIELDS,
    Record,
    active_key,
    alive_key,
    all_keys_pattern,
    as_text,
    bulk_marker_prefix,
    calls_key,
    cancel_marker_key,
    claims_key,
    decode_record,
    dispatchers_key,
    due_key,
    expiring_key,
    held_key,
    hot_key,
    key_slot,
    layouts_key,
    leased_key,
    open_key,
    quarantine_key,
    quiet_key,
    run_key,
    shard_wake_channel,
    split_ident,
    stats_key,
    stats_reset_key,
    stopped_key,
    taken_set_key,
    win_key,
)
from .sentinel import SentinelConfig, redact
from .settings import Settings, settings_for

_logger = logging.getLogger("celery_debounce")

#: A shard as the store's methods take it: a number of this process's layout
#: (``settings.tag``), or a shard's tag as it is (a message's ``debounce_tag``, a
#: shard of another layout that a dispatcher drains).
Shard = int | str

#: How long after its message's ``expires`` a window still queued is finished as
#: REVOKED (expire.lua): room for a worker whose clock is behind Redis's, and for the
#: time between the take and the broker's enqueue.
EXPIRY_GRACE_MS = 2000

if TYPE_CHECKING:  # pragma: no cover
    from .aliases import FixedId
    from .call import PreparedCall

__all__ = [
    "SCRIPT_NAMES", "UNKNOWN_OUTCOME", "WRITTEN", "CancelOutcomeUnknown", "CensusRow",
    "Outcome", "ShardCounts",
    "ShardSnapshot", "TakeResult", "TakenWindow", "WakeListener", "WindowStore", "as_text",
    "is_outage", "is_unknown_outcome", "script_source", "store_for", "translate_errors",
]


def _script_names() -> tuple[str, ...]:
    lua = resources.files("celery_debounce").joinpath("lua")
    return tuple(sorted(p.name[:-4] for p in lua.iterdir() if p.name.endswith(".lua")))


#: Every script in celery_debounce/lua/, by file name (listed at import).
SCRIPT_NAMES = _script_names()


logger = logging.getLogger("celery_debounce.store")

#: The line of gate.lua and flush.lua that chooses plain PUBLISH to ``<prefix>:wake``;
#: :func:`script_source` turns it on (SPUBLISH to ``<tag>:wake``) for a cluster.
SHARDED_WAKE_OFF = "local SHARDED_WAKE = false"
SHARDED_WAKE_ON = "local SHARDED_WAKE = true"


def script_source(name: str, sharded_wake: bool = False) -> str:
    lua = resources.files("celery_debounce").joinpath("lua")
    source = lua.joinpath(f"{name}.lua").read_text("utf-8")
    if sharded_wake and SHARDED_WAKE_OFF in source:
        source = source.replace(SHARDED_WAKE_OFF, SHARDED_WAKE_ON, 1)
    return source


# -- typed results ----------------------------------------------------------------------

@dataclass(frozen=True)
class TakenWindow:
    """A window taken out of the due set, ready to publish (times: Redis ms)."""

    shard: Shard
    task_id: str
    ident: str
    first_seen_ms: int
    deadline_ms: int
    ceiling_ms: int  # absolute: first_seen_ms + the window's max wait
    calls: int
    content_type: str
    payload: bytes  # the protocol-2 body, published as it is
    options_json: str
    tries: int
    taken_ms: int
    capped: bool = False  # closed by its debounce_max_calls (gate.lua), not by time
    leading: bool = False  # a leading run (debounce_leading=True), due at its first call
    #: publish failures counted against it (``fl``); ``tries`` also counts the takes a
    #: broker outage wasted, which never count
    failures: int = 0
    #: a debounce_exclusive window that was held: ms it was held (0: it was not)
    held_ms: int = 0

    @property
    def task_name(self) -> str:
        return split_ident(self.ident)[0]

    @property
    def key(self) -> str:
        return split_ident(self.ident)[1]

    @property
    def lateness_ms(self) -> int:
        return max(0, self.taken_ms - self.deadline_ms)

    @property
    def forced_by_max_wait(self) -> bool:
        """The max wait, not a quiet period, set this window's deadline."""
        return self.deadline_ms >= self.ceiling_ms


@dataclass(frozen=True)
class TakeResult:
    now_ms: int
    next_in_ms: int  # -1: nothing pending
    windows: list[TakenWindow]
    #: (key, Redis error) of entries take.lua set aside: a key of the wrong type
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: (task id, reason) of taken records whose fields cannot be read
    unreadable: list[tuple[str, str]] = field(default_factory=list)


class ListStep(NamedTuple):
    """One ``list.lua`` step along the due set."""

    examined: int
    cursor: str
    at_cursor: int
    done: bool
    windows: list[Record]


class TakenEntry(NamedTuple):
    """One member of a taken-window set: its record, or the error reading it (a key of
    the wrong type), or neither (the record is gone)."""

    task_id: str
    record: Record | None
    error: str | None


class Cancelled(NamedTuple):
    record: Record
    aliases: list[Any]  # raw alias JSON texts (aliases.parse_aliases)


class CensusRow(NamedTuple):
    task: str
    open: int
    due: int
    oldest_first_seen_ms: int  # -1: none
    calls_waiting: int


class ShardCounts(NamedTuple):
    """``stats`` of one shard: open and due windows, the counters (``<kind>|<task>``)."""

    open: int
    due: int
    counters: dict[str, int]


class ShardSnapshot(NamedTuple):
    """What ``top`` reads of one shard; a key of the wrong type reads as empty."""

    open: int
    due: int
    first_due_ms: int | None
    leased: int
    active: int
    quarantined: int
    counters: dict[str, int]
    hot: list[tuple[str, int]]
    dispatchers: list[tuple[str, int]]
    alive: list[tuple[str, int]] = []  # name -> last heartbeat ms (alive.lua)
    stopped: list[tuple[str, int]] = []  # name -> clean stop ms
    held: int = 0  # debounce_exclusive windows held behind a run of their key
    held_front: list[tuple[str, int]] = []  # the longest held: ident -> held since ms


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Outcome of a bulk call whose chunk ran but whose reply was lost (window id unknown).
WRITTEN = _Marker("WRITTEN")


#: Outcome of a bulk call whose chunk may or may not have run (Redis unreachable afterwards).
UNKNOWN_OUTCOME = DebounceOutcomeUnknown("debounce Redis unreachable: outcome of this call unknown")

Outcome = GateResult | _Marker | BaseException


def is_unknown_outcome(outcome: object) -> bool:
    """True for a bulk call that may or may not have survived: its chunk's outcome is
    unknown (Redis unreachable), or too few replicas acknowledged it (``WAIT``)."""
    return isinstance(outcome, DebounceOutcomeUnknown)

#: How long a bulk chunk's "this chunk ran" marker key lives (ms).
_MARKER_TTL_MS = 60_000


# -- errors --------------------------------------------------------------------------------

@contextmanager
def translate_errors(operation: str) -> Iterator[None]:
    """Turn redis-py errors into :class:`DebounceBackendError`."""
    try:
        yield
    except redis.RedisError as exc:
        raise _translated(operation, exc) from exc


def _translated(operation: str, exc: redis.RedisError) -> DebounceBackendError:
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return DebounceBackendError(f"debounce Redis unreachable during {operation}: {exc}")
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        # Redis refuses a script under OOM only at its first write, before anything is
        # written (docs/design.md, "Maxmemory"); a plain command or a MULTI is refused whole
        return DebounceBackendError(
            f"debounce Redis is at maxmemory (OOM): {operation} refused, nothing was written "
            f"(free memory, raise maxmemory, or check the maxmemory-policy): {exc}")
    return DebounceBackendError(f"debounce Redis refused {operation}: {exc}")


class CancelOutcomeUnknown(DebounceOutcomeUnknown):
    """A cancel whose reply was lost and that Redis did not answer again in time; its
    token names the key that holds its reply if it ran (:meth:`WindowStore.cancelled_by`)."""

    def __init__(self, message: str, shard: int, ident: str, token: str) -> None:
        super().__init__(message)
        self.shard, self.ident, self.token = shard, ident, token


class NotReplicated(DebounceOutcomeUnknown):
    """A worker's mark (``claim``, ``finish``) ran on the master but fewer replicas than
    ``debounce_redis_wait_replicas`` acknowledged it (``WAIT``): a failover may discard
    it. ``reply``: the script's reply."""

    def __init__(self, message: str, reply: Any = None) -> None:
        super().__init__(message)
        self.reply = reply


def _lost(operation: str, exc: BaseException) -> DebounceOutcomeUnknown:
    """The reply of a command that reached Redis was lost: say that it may have run."""
    return DebounceOutcomeUnknown(redact(
        f"debounce Redis unreachable during {operation}, its reply lost ({exc}); the "
        "outcome is unknown: it may or may not have run, and it was not sent again"))


def _refused_by_a_replica(exc: BaseException) -> bool:
    """Sentinel's connection turns a demoted master's READONLY (the command did not
    run) into a ConnectionError; True for that one."""
    return isinstance(exc.__context__, redis.exceptions.ReadOnlyError)


def is_outage(exc: BaseException) -> bool:
    """True for an outage (worth retrying), False for an error Redis answered with."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return isinstance(cause, (redis.ConnectionError, redis.TimeoutError, OSError))


#: redis-py's "unreachable" errors (a Redis broker's kombu transport raises them too).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
#: Every redis-py error.
REDIS_ERROR: type[Exception] = redis.RedisError


def is_error_reply(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps) is an error reply from a Redis server."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.ResponseError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


#: redis-py classes whose message has lost its Redis error code (MasterDownError, a
#: ClusterDownError, first)
_CODE_OF_CLASS: tuple[tuple[type[BaseException], str], ...] = (
    (redis.exceptions.OutOfMemoryError, "OOM"),
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.AuthenticationError, "NOAUTH"),
    (redis.exceptions.NoPermissionError, "NOPERM"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
)
#: redis-py annotates a pipeline's first error: "Command # <n> (...) of pipeline caused
#: error: <reply>"
_PIPELINE_ERROR = re.compile(r"^Command # (\d+) \(.*\) of pipeline caused error: (.*)$", re.S)


def reply_code(exc: BaseException) -> str | None:
    """The Redis error code of ``exc`` or of what it wraps (kombu wraps a batch's
    error), e.g. ``"OOM"``; None when no Redis error reply is in the chain."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if isinstance(seen, (redis.ResponseError, redis.exceptions.BusyLoadingError,
                             redis.exceptions.AuthenticationError)):
            for cls, code in _CODE_OF_CLASS:
                if isinstance(seen, cls):
                    return code
            text = str(seen.args[0]) if seen.args else ""
            match = _PIPELINE_ERROR.match(text)
            if match:
                text = match.group(2)
            return text.split(" ", 1)[0].upper() or None
        seen = seen.__cause__ or seen.__context__
    return None


def pipeline_failed_at(exc: BaseException) -> int | None:
    """The number (from 1) of the first command of a pipeline that failed, as redis-py
    annotates it (commands before it ran); None when ``exc`` is not such an error."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if isinstance(seen, redis.RedisError) and seen.args:
            match = _PIPELINE_ERROR.match(str(seen.args[0]))
            if match:
                return int(match.group(1))
        seen = seen.__cause__ or seen.__context__
    return None


# -- Sentinel ----------------------------------------------------------------------------

#: The channel on which every sentinel announces a new master.
SWITCH_CHANNEL = "+switch-master"


def sentinel_client(config: SentinelConfig, timeout_s: float, retry: Retry) -> redis.Redis:
    """A client of the current master: each new connection asks the sentinels where it is,
    and a connection to a demoted master (READONLY) is dropped and re-resolved."""
    # The sentinels get the master's timeouts and no retry of their own (unless
    # sentinel_kwargs says otherwise): finding the master already tries each sentinel
    # in turn, and redis-py's default retry (3, backing off to 10 s) made a call with
    # no sentinel reachable fail only after 25 s.
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": timeout_s, "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        **dict(config.sentinel_kwargs or ()),
    }
    manager = Sentinel(
        list(config.sentinels),
        min_other_sentinels=config.min_other_sentinels,
        sentinel_kwargs=sentinel_kwargs,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )
    client: redis.Redis = manager.master_for(
        config.master_name,
        db=config.db,
        username=config.username,
        password=config.password,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=retry,
    )
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    SwitchWatcher(config, sentinel_kwargs, pool).start()
    return client


class SwitchWatcher:
    """Moves a client's pool to the new master as soon as a sentinel announces it.

    redis-py asks the sentinels where the master is only when a connection
    connects, and Sentinel demotes the old master seconds after a failover (it
    waits to see it report its old role). Pooled connections opened before the
    switch would go on writing to the old master until then, and its demotion
    discards those writes (measured: docs/guarantees.md, "Failover"). One daemon
    thread per sentinel listens on its ``+switch-master`` and then re-reads the
    master's address, which drops the pool's idle connections; a connection in use
    is dropped when it is released. Each switch (counted once, whichever sentinels
    announce it) bumps :attr:`switches` (the dispatcher re-subscribes its wake
    channel). The threads end when the pool is garbage-collected.

    Every sentinel, not one: a sentinel that hangs with its connection open (a host
    gone without a reset, a process stopped, a minority partition) never announces
    the switch the others make. Each subscription is pinged after
    :attr:`KEEPALIVE` seconds of silence and dropped (then made again, backing off)
    when the answer does not come within the sentinels' socket timeout. The sentinel
    that announced the switch is asked first for the new address (a sentinel left
    in a minority may still name the old master).
    """

    #: Longest wait between two looks at whether the pool still exists (seconds).
    TICK = 1.0
    #: Silence (seconds) after which a subscription is pinged.
    KEEPALIVE = 2.0

    def __init__(self, config: SentinelConfig, sentinel_kwargs: dict[str, Any],
                 pool: SentinelConnectionPool) -> None:
        self.config = config
        self.sentinel_kwargs = sentinel_kwargs
        self._pool = weakref.ref(pool)
        pool.debounce_switch_watcher = self  # type: ignore[attr-defined]
        self.switches = 0
        self._lock = threading.RLock()  # _refresh runs in every listener thread
        self._announced: str | None = None  # the last new master announced
        self._timeout = float(sentinel_kwargs.get("socket_timeout") or 2.0)
        #: the last re-read of the master's address failed: every listener tries again
        self._unsure = False

    def start(self) -> None:
        for host, port in self.config.sentinels:
            threading.Thread(
                target=self._listen, args=(host, port), daemon=True,
                name=f"debounce-sentinel-{self.config.master_name}-{host}:{port}",
            ).start()

    def _listen(self, host: str, port: int) -> None:
        delay = 0.1
        while self._pool() is not None:
            client = redis.Redis(host=host, port=port, **self.sentinel_kwargs)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(SWITCH_CHANNEL)
                self._refresh()  # a switch announced while this was not subscribed
                delay = 0.1
                heard, pinged = time.monotonic(), 0.0
                while self._pool() is not None:
                    if self._unsure:  # a re-read failed (no sentinel answered): again
                        self._refresh()
                    message = pubsub.get_message(timeout=self.TICK)
                    now = time.monotonic()
                    if message is not None:
                        heard, pinged = now, 0.0
                        if message.get("type") == "message":
                            self._on_message(message["data"], (host, port))
                    elif pinged and now - pinged > self._timeout:
                        raise redis.TimeoutError(
                            f"no answer to a keepalive PING within {self._timeout:g}s")
                    elif not pinged and now - heard >= self.KEEPALIVE:
                        pubsub.ping()
                        pinged = now
            except (redis.RedisError, OSError) as exc:
                _logger.debug("debounce: sentinel %s:%s: %s", host, port, exc)
                threading.Event().wait(delay)
                delay = min(delay * 2, 5.0)
            finally:
                pubsub.close()
                client.close()

    def _on_message(self, data: Any, sentinel: tuple[str, int] | None = None) -> None:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        parts = text.split(" ")
        if parts[0] != self.config.master_name:
            return
        new = " ".join(parts[3:5])
        with self._lock:
            if new and new == self._announced:
                return  # the same switch, announced by another sentinel
            self._announced = new
            _logger.warning("debounce: Sentinel switched master %s", text)
            if sentinel is not None:
                self._ask_first(sentinel)
            if not self._refresh():
                # counted whatever the pool's address was: a connection opened
                # meanwhile may have found the new master already, a wake
                # subscription opened before it has not
                self.switches += 1

    def _ask_first(self, sentinel: tuple[str, int]) -> None:
        """Put ``sentinel`` (it announced the switch) first in the order redis-py asks."""
        pool = self._pool()
        manager = getattr(pool, "sentinel_manager", None)
        clients = getattr(manager, "sentinels", None)
        if not clients:
            return
        for i, client in enumerate(clients):
            kwargs = client.connection_pool.connection_kwargs
            if (kwargs.get("host"), kwargs.get("port")) == sentinel:
                clients[0], clients[i] = clients[i], clients[0]
                return

    def _refresh(self) -> bool:
        """Re-read the master's address; True (and a switch counted) if it moved."""
        pool = self._pool()
        if pool is None:
            return False
        with self._lock:
            before = pool.master_address
            try:
                after = pool.get_master_address()  # drops idle connections if it moved
            except (redis.ConnectionError, redis.TimeoutError):  # no sentinel answered
                self._unsure = True
                return False
            self._unsure = False
            if before is not None and after != before:
                self.switches += 1
                return True
            return False


def master_switches(pool: object) -> int:
    """How many master switches the pool's watcher has seen (0 without Sentinel)."""
    watcher = getattr(pool, "debounce_switch_watcher", None)
    return watcher.switches if watcher is not None else 0


class _Lease(threading.local):
    """One pooled connection per thread, kept across calls (the gate's hot path).

    Checked out from the pool once per thread and process; released to the pool when
    the thread ends. Each :meth:`checkout` checks it as ``ConnectionPool.get_connection``
    checks a connection it hands out: connected, and nothing waiting to be read (a
    connection the server closed reads as EOF: it is reconnected before use).
    """

    conn: Any = None
    held: _Held | None = None
    pid = 0
    #: threads of this process holding a kept connection (of any store): with one,
    #: its calls cannot meet another's, and the gate skips the combiner
    holders = 0

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    @staticmethod
    def suits(pool: Any) -> bool:
        """Only redis-py's plain pool, RESP2, without client-side caching (Sentinel's
        pool drops a demoted master's connections on release: it keeps the per-call
        checkout)."""
        if type(pool) is not redis.ConnectionPool or getattr(pool, "cache", None) is not None:
            return False
        # RESP2 only: no push messages (RESP3 maintenance notifications) can be waiting
        # on a kept connection, so "something to read" always means a dead or dirty one
        return str(pool.connection_kwargs.get("protocol") or 2) == "2"

    def checkout(self) -> Any:
        conn = self.conn
        if conn is None or self.pid != os.getpid():  # first call of a thread, or a fork
            conn = self.pool.get_connection(*_checkout_args())
            self.conn, self.pid = conn, os.getpid()
            self.held = _Held(self.pool, conn)
            return conn
        try:
            if conn._sock is None:
                conn.connect()
            if conn.can_read():
                raise redis.ConnectionError("Connection has data")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()
            conn.connect()
            if conn.can_read():
                raise redis.ConnectionError("Connection not ready") from None
        return conn


class _Held:
    """A thread's kept connection, given back to its pool when this is dropped: when
    the thread ends (its ``_Lease`` attributes go) or the store is dropped."""

    __slots__ = ("conn", "pid", "pool")

    def __init__(self, pool: Any, conn: Any) -> None:
        self.pool, self.conn, self.pid = pool, conn, os.getpid()
        with _holders_lock:
            _Lease.holders += 1

    def __del__(self) -> None:
        if self.pid != os.getpid():
            return  # a thread of the parent, dropped in a forked child
        with _holders_lock:
            _Lease.holders -= 1
        try:
            self.pool.release(self.conn)
        except Exception:  # noqa: S110 - at interpreter exit the pool may be half gone
            pass


#: reentrant: a collection may drop a _Held (and take it) while this thread holds it
_holders_lock = threading.RLock()


def _forked() -> None:  # in a forked child only the forking thread runs: none holds one
    global _holders_lock
    _holders_lock = threading.RLock()
    _Lease.holders = 0


os.register_at_fork(after_in_child=_forked)


def _checkout_args() -> tuple[str, ...]:
    """redis-py < 5.3 requires a command name for ``get_connection``; later ones warn."""
    name = inspect.signature(redis.ConnectionPool.get_connection).parameters.get(
        "command_name")
    return ("EVALSHA",) if name is not None and name.default is inspect.Parameter.empty else ()


_HiredisPacker: Any = getattr(redis.connection, "HiredisRespSerializer", None)
_hiredis_pack: Any = None
if _HiredisPacker is not None:
    try:
        from hiredis import pack_command as _hiredis_pack
    except ImportError:  # pragma: no cover - hiredis is optional
        pass


def _pack(conn: Any, command: tuple[Any, ...]) -> Any:
    """The command's bytes: hiredis' packer directly when redis-py packs with it
    (what ``conn.pack_command`` ends in, without its per-call argument scan; our
    arguments are str, bytes and int), else the connection's own packer."""
    if _hiredis_pack is not None and type(getattr(conn, "_command_packer", None)) is _HiredisPacker:
        return [_hiredis_pack(command)]
    return conn.pack_command(*command)


class _NotSent(Exception):
    """A lone call's command could not be written: nothing reached Redis."""


class _Slot:
    """One call in a :class:`_Combiner`: its command, then its reply or error."""

    __slots__ = ("command", "done", "error", "lead", "reply")

    def __init__(self, command: bytes, waits: bool) -> None:
        self.command = command
        self.reply: Any = None
        self.error: BaseException | None = None
        self.lead = False  # woken to send the next batch, not with a reply
        if waits:  # released when answered (or handed the next batch)
            self.done = threading.Lock()
            self.done.acquire()

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.reply


class _Combiner:
    """Gate calls made at the same time by threads of one process share round trips.

    A call that finds nobody sending sends its command alone. Calls arriving while a
    batch is in flight queue up; when it is answered, the first of them sends all
    that queued in one write on its own connection and reads their replies in order
    (auto-pipelining, as ioredis does). Each call gets its own reply or error: an
    error reply concerns only its call (it did not run); a connection lost while
    reading makes every call still unanswered :class:`DebounceOutcomeUnknown` (each
    may have run; nothing is sent again); a write that fails sends a lone call once
    more on a fresh connection, as before, but makes every call of a larger batch an
    unknown outcome (a part of the write may have reached Redis).
    """

    def __init__(self, lease: _Lease) -> None:
        self.lease = lease
        self.lock = threading.Lock()
        self.waiting: list[_Slot] = []
        self.busy = False

    def call(self, name: str, command: bytes) -> Any:
        lock = self.lock
        lock.acquire()
        if not self.busy:  # nobody is sending: this call goes alone, at once
            self.busy = True
            lock.release()
            try:
                return self._send_alone(name, command)
            finally:
                self._hand_over()
        try:
            slot = _Slot(command, True)
            self.waiting.append(slot)
        finally:
            lock.release()
        try:
            slot.done.acquire()  # answered, or handed the next batch
        except BaseException:  # interrupted while queued (a signal in the main thread)
            self._abandon(slot)
            raise
        if not slot.lead:
            return slot.result()
        with lock:
            batch, self.waiting = self.waiting, []
        try:
            self._send(name, batch)
        finally:
            for other in batch:
                if other.reply is None and other.error is None:  # interrupted
                    other.error = DebounceOutcomeUnknown(
                        f"debounce Redis: {name} interrupted while its reply was "
                        "awaited; the outcome is unknown")
            for other in batch:
                if other is not slot:
                    other.done.release()
            self._hand_over()
        return slot.result()

    def _hand_over(self) -> None:
        """After a batch: the first queued call sends the next one, or nobody is sending."""
        with self.lock:
            successor = self.waiting[0] if self.waiting else None
            if successor is None:
                self.busy = False
                return
            successor.lead = True  # under the lock: see _abandon
        successor.done.release()

    def _send_alone(self, name: str, command: bytes) -> Any:
        """One call's command, nobody else's: as ``WindowStore._evalsha_once`` sends it."""
        conn = self.lease.checkout()
        try:
            conn.send_packed_command([command])
        except (redis.ConnectionError, OSError):
            conn.disconnect()
            raise _NotSent() from None
        try:
            reply = conn.read_response()
        except (redis.ResponseError, redis.exceptions.BusyLoadingError):
            raise  # an error reply (LOADING too): it did not run
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            conn.disconnect()  # the reply may still come: never reuse
            raise _lost(name, exc) from exc
        except BaseException:  # interrupted: the reply may still come
            conn.disconnect()
            raise
        return _NIL if reply is None else reply

    def _abandon(self, slot: _Slot) -> None:
        """A queued call left before its turn: it is never sent; if it was handed the
        next batch, the batch goes to the next queued call (or nobody is sending)."""
        with self.lock:
            if slot not in self.waiting:
                return  # in flight or answered: its reply is dropped
            self.waiting.remove(slot)
            if slot.lead:
                successor = self.waiting[0] if self.waiting else None
                if successor is None:
                    self.busy = False
                else:
                    successor.lead = True
                    successor.done.release()

    def _send(self, name: str, batch: list[_Slot]) -> None:
        try:
            conn = self.lease.checkout()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            for slot in batch:  # no connection: nothing was sent
                slot.error = exc
            return
        try:
            conn.send_packed_command(
                [batch[0].command if len(batch) == 1 else b"".join(s.command for s in batch)])
        except (redis.ConnectionError, OSError) as exc:
            conn.disconnect()
            for slot in batch:
                slot.error = _NotSent() if len(batch) == 1 else _lost(name, exc)
            return
        for i, slot in enumerate(batch):
            try:
                slot.reply = conn.read_response()
            except redis.exceptions.BusyLoadingError as exc:
                for rest in batch[i:]:  # a loading server refused them all
                    rest.error = exc
                return
            except redis.ResponseError as exc:
                slot.error = exc  # an error reply: this call did not run
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                conn.disconnect()  # the replies may still come: never reuse
                for rest in batch[i:]:
                    rest.error = _lost(name, exc)
                return
            except BaseException:
                conn.disconnect()
                raise
            if slot.reply is None:
                slot.reply = _NIL


#: A nil reply, told apart from "not answered yet" in a :class:`_Slot`.
_NIL: Any = object()


# -- the store -------------------------------------------------------------------------------

#: Pools whose connections :meth:`WindowStore._evalsha` may use directly.
_DIRECT_POOLS = (redis.ConnectionPool, SentinelConnectionPool)


class WindowStore:
    """One app's windows in Redis, for the current process.

    Scripts run with EVALSHA and are reloaded on NOSCRIPT.
    """

    _direct = False  # see __init__ and _evalsha
    _lease: _Lease | None = None
    _combiner: _Combiner | None = None
    _checkout_args: tuple[str, ...] = ()
    #: A Redis Cluster client (``debounce_redis_cluster``): commands go to the master of
    #: their key's slot, wake-ups use sharded pub/sub where every master has it.
    cluster = False
    #: Scripts publish wake-ups with SPUBLISH to ``<tag>:wake`` (one channel per shard).
    sharded_wake = False
    #: The server's version was read and is supported (or cannot be read: see
    #: :meth:`check_server`); :func:`store_for` checks until it is.
    server_checked = False
    _check_after = 0.0
    _refusal: DebounceBackendError | None = None

    def __init__(self, settings: Settings, client: Any = None) -> None:
        self.settings = settings
        timeout = settings.redis_timeout_s
        # One retry after a dropped connection. No health_check_interval: a dead
        # pooled connection already fails over to the retry, and redis-py 5
        # recursed in its health check when a TLS handshake failed.
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 1)
        if client is None and settings.sentinel is not None:
            client = sentinel_client(settings.sentinel, timeout, retry)
        options: dict[str, Any] = dict(  # the same for a single node and a cluster
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=retry,
        )
        if client is None and settings.redis_cluster:
            # reads the topology now (a single-node client connects on first use)
            try:
                client = redis.RedisCluster.from_url(settings.redis_url, **options)
            except (redis.RedisError, RedisClusterException) as exc:
                raise DebounceBackendError(redact(
                    f"debounce Redis Cluster unreachable at {settings.redis_url}: {exc}"
                )) from exc
            except ValueError:
                raise _unreadable_url(settings.redis_url) from None
        if client is None:
            try:
                client = redis.Redis.from_url(settings.redis_url, **options)
            except ValueError:
                raise _unreadable_url(settings.redis_url) from None
        self.client: Any = client
        self.cluster = isinstance(self.client, redis.RedisCluster)
        if self.cluster:
            self.sharded_wake = _every_master_has_sharded_pubsub(self.client)
        #: per shard: (open_key(tag, "") , due_key(tag)), for gate.gate_keys on the hot path
        self.gate_prefixes: tuple[tuple[str, str], ...] = tuple(
            (open_key(tag, ""), due_key(tag)) for tag in settings.tags)
        self.scripts: dict[str, Script] = {
            name: self.client.register_script(script_source(name, self.sharded_wake))
            for name in SCRIPT_NAMES
        }
        # The direct path below needs redis-py's own client and pool (not fakeredis,
        # or a single-connection client); on a cluster, the pool of the key's master.
        # Sentinel's pool qualifies: its connections find the master when they
        # connect, turn a demoted master's READONLY into a ConnectionError (the
        # command did not run: _evalsha sends it again through the client's retry)
        # and are dropped on release once the master moved (docs/design.md, "Sentinel").
        self._direct = self.cluster or (
            type(self.client) is redis.Redis
            and type(self.client.connection_pool) in _DIRECT_POOLS
            and self.client.connection is None
        )
        pool = getattr(self.client, "connection_pool", None)
        self._lease = _Lease(pool) if (
            self._direct and not self.cluster and _Lease.suits(pool)) else None
        # concurrent gate calls share round trips (needs hiredis' packer: one bytes each)
        self._combiner = _Combiner(self._lease) if (
            self._lease is not None and _hiredis_pack is not None
            and not self._lease.pool.connection_kwargs.get("command_packer")) else None
        if settings.wait_replicas:
            self.run_gate = self._run_gate_waited  # type: ignore[method-assign]
            self.gate = self._gate_waited  # type: ignore[method-assign]
            self.claim = self._claim_waited  # type: ignore[method-assign]
            self.finish = self._finish_waited  # type: ignore[method-assign]
            self.run_mark = self._run_mark_waited  # type: ignore[method-assign]
        # redis-py < 5.3 requires a command name here; later versions warn if given one
        name = inspect.signature(redis.ConnectionPool.get_connection).parameters.get(
            "command_name"
        )
        self._checkout_args = (
            ("EVALSHA",) if name is not None and name.default is inspect.Parameter.empty else ()
        )

    @property
    def direct(self) -> bool:
        """True when commands may be sent on pooled connections directly (see _evalsha)."""
        return self._direct

    @property
    def master_switches(self) -> int:
        """Master switches Sentinel announced since this client was built (0 without it)."""
        return master_switches(getattr(self.client, "connection_pool", None))  # none on a cluster

    def tag(self, shard: Shard) -> str:
        """The tag of ``shard``: a number of this process's layout, or a tag as it is
        (a message's ``debounce_tag``, a layout drained)."""
        if isinstance(shard, str):
            return shard
        return self.settings.tag(shard)  # shards + i: a legacy shard (settings.legacy_shards)

    def pool_for(self, key: str) -> Any:
        """The connection pool serving ``key``: the client's, or on a cluster the pool
        of the master that redis-py's slot table names for the key's slot."""
        if not self.cluster:
            return self.client.connection_pool
        client = self.client
        # redis-py's slot table read without its lock (the hot path): a dict and a list
        # read, each atomic; a stale entry is answered with MOVED, which is followed
        nodes = client.nodes_manager.slots_cache.get(key_slot(key))
        node = nodes[0] if nodes else client.nodes_manager.get_node_from_slot(key_slot(key))
        return (node.redis_connection or client.get_redis_connection(node)).connection_pool

    def refresh_topology(self) -> None:
        """On a cluster, read the slot table again (after a failover or resharding)."""
        if not self.cluster:
            return
        try:
            self.client.nodes_manager.initialize()
        except Exception as exc:  # no node answers: the caller's error says so
            logger.debug("debounce: cluster topology refresh failed: %r", exc)

    # -- server version ----------------------------------------------------------------------
    def check_server(self, outage_raises: bool = False) -> None:
        """Refuse a server older than :data:`MIN_REDIS` with a clear error, before any
        script can fail on it (``ZADD GT``) with a Lua error.

        Reads the version once (``HELLO``, which every user may run, else ``INFO
        server``; on a cluster, of every master) and remembers the answer. Redis
        unreachable: no answer yet, read again a second later; raised as
        :class:`DebounceBackendError` with ``outage_raises`` (a call, which would fail
        on it too: so it waits one timeout, not two), else left to the operation. A
        refusal is raised again for a second, then read again (the server may have
        been upgraded or failed over). A version that cannot be read (both commands
        refused) is not refused.
        """
        if self.server_checked:
            return
        now = time.monotonic()
        if now < self._check_after:
            if self._refusal is not None:
                raise self._refusal
            return
        self._check_after = now + 1.0
        try:
            found = self.server_versions()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if outage_raises:
                raise _translated("connect", exc) from exc
            return  # the caller's own command reports the outage
        except (OSError, RedisClusterException) as exc:
            if outage_raises:
                raise DebounceBackendError(f"debounce Redis unreachable: {exc}") from exc
            return
        except redis.RedisError as exc:
            _logger.debug("debounce: could not read the Redis version: %r", exc)
            found = []
        old = [(where, server, version) for where, server, version in found
               if not server_supported(server, version)]
        if old:
            where, server, version = old[0]
            self._refusal = DebounceBackendError(
                f"debounce Redis at {where} is {'Redis' if server == 'redis' else server} "
                f"{version}; celery_debounce needs "
                f"Redis >= {'.'.join(map(str, MIN_REDIS))} (its scripts use ZADD GT) or "
                f"Valkey: upgrade the server or point debounce_redis_url at another one"
            )
            raise self._refusal
        self._refusal = None
        self.server_checked = True

    def server_versions(self) -> list[tuple[str, str, str]]:
        """``(where, server name, version)`` of the windows' server (each master of a
        cluster); a server that answers neither ``HELLO`` nor ``INFO`` is left out."""
        if self.cluster:
            found = []
            for node in self.client.get_primaries():
                got = read_server_version(self.client.get_redis_connection(node))
                if got is not None:
                    found.append((f"{node.host}:{node.port}", *got))
            return found
        # on a pooled connection without redis-py's retry (as _evalsha): a server that
        # never answers costs one timeout
        client = _PooledCommands(self) if self._direct else self.client
        got = read_server_version(client)
        return [] if got is None else [(redact(self.settings.redis_url), *got)]

    # -- scripts ---------------------------------------------------------------------------
    def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` (its raw reply); redis-py errors leave translated.

        Only for scripts a repeat cannot change (``list``, ``find``, ``census``, ``ack``,
        ``release``): after a lost reply redis-py's retry may send them again. A script
        that must not run twice goes through :meth:`run_once`.
        """
        script = self.scripts[name]
        try:  # plain try rather than translate_errors
            try:
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:  # server restarted or SCRIPT FLUSH: load and run again
                script.sha = self.client.script_load(script.script)
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.RedisError as exc:
            raise _translated(name, exc) from exc

    def run_once(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run a script that must not run twice (every script that writes windows but
        ``ack`` and ``release``): it is sent at most once.

        A command that could not be written (a pooled connection the server closed) is
        sent once more on a fresh connection; NOSCRIPT (it did not run) loads the script
        and sends it again; a connection lost or timed out while waiting for the reply
        raises :class:`~celery_debounce.DebounceOutcomeUnknown` (it may have run). This
        is every call's hot path: one EVALSHA on a pooled connection, without redis-py's
        per-command wrapper (retry closure, operation metrics: about a fifth of a call),
        which would also send the command again after a lost reply.
        """
        script = self.scripts[name]
        if not self._direct:  # fakeredis, or a client of the caller's: its own policy
            return self.run(name, keys, args)
        try:
            if self.cluster:  # the master of the keys' slot, following redirections
                return self.send_on_node(
                    keys[0], [("EVALSHA", script.sha, len(keys), *keys, *args)], name,
                    operation=name)[0]
            try:
                return self._evalsha_once(name, script.sha, len(keys), *keys, *args)
            except NoScriptError:  # server restarted or SCRIPT FLUSH: it did not run
                script.sha = self.client.script_load(script.script)
                return self._evalsha_once(name, script.sha, len(keys), *keys, *args)
        except redis.RedisError as exc:
            raise _translated(name, exc) from exc

    def _evalsha_once(self, name: str, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """``EVALSHA`` on a pooled connection of a single node, sent at most once.

        On a plain ``redis.ConnectionPool`` each thread keeps the connection it checked
        out (:class:`_Lease`) instead of taking it from the pool's locked list and
        giving it back on every call; it is checked as the pool checks a connection
        it hands out (connected, nothing unread: else reconnected), so a connection
        the server closed is replaced before anything is sent.
        """
        lease = self._lease
        attempts: tuple[int, ...] = (1, 2)
        if self._combiner is not None and name == "gate" and _Lease.holders > 1:
            try:
                reply = self._combiner.call(
                    name, _hiredis_pack(("EVALSHA", sha, numkeys, *keys_and_args)))
            except _NotSent:
                attempts = (2,)  # nothing reached Redis: once more, alone, on a fresh one
            else:
                return None if reply is _NIL else reply
        for attempt in attempts:
            if lease is not None:
                conn: Any = lease.checkout()
                pool = None
            else:
                pool = self.client.connection_pool
                conn = pool.get_connection(*self._checkout_args)
            try:
                try:
                    conn.send_packed_command(
                        _pack(conn, ("EVALSHA", sha, numkeys, *keys_and_args)))
                except (redis.ConnectionError, OSError):
                    conn.disconnect()
                    if attempt == 2:
                        raise
                    continue  # nothing reached Redis: a fresh connection, once more
                try:
                    return conn.read_response()
                except (redis.ResponseError, redis.exceptions.BusyLoadingError):
                    raise  # an error reply (LOADING too): it did not run
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    conn.disconnect()  # the reply may still come: never reuse
                    if _refused_by_a_replica(exc) and attempt == 1:
                        continue  # READONLY: it did not run; the pool finds the master
                    raise _lost(name, exc) from exc
                except BaseException:  # interrupted: the reply may still come
                    conn.disconnect()
                    raise
            finally:
                if pool is not None:
                    pool.release(conn)
        raise DebounceBackendError(f"debounce Redis: {name} could not be sent")  # unreachable

    def send_on_node(
        self, key: str, commands: list[tuple[Any, ...]], script: str = "",
        operation: str = "",
    ) -> list[Any]:
        """Send ``commands`` (the first an EVALSHA of ``script`` when given) in one write
        on one connection of the node serving ``key``; return their replies (error
        replies of later commands as exceptions, for the caller to read).

        Resent only while nothing ran: a redirection (MOVED, ASK, TRYAGAIN,
        CLUSTERDOWN: the command, or a queued one and so the whole MULTI, was refused),
        NOSCRIPT of the first command, or a connection that failed while writing. A
        connection lost or timed out after sending raises
        :class:`~celery_debounce.DebounceOutcomeUnknown` (nothing is sent twice).
        """
        asking: tuple[str, int] | None = None
        deadline = None
        for attempt in range(8):
            if asking is not None:
                pool = self.client.get_redis_connection(
                    self.client.get_node(*asking)).connection_pool
            else:
                pool = self.pool_for(key)
            try:
                conn: Any = pool.get_connection(*self._checkout_args)
            except (redis.ConnectionError, OSError):
                # refused (a dead master the slot table still names): nothing was sent;
                # read the slot table again, so a promoted replica is found
                self.refresh_topology()
                if attempt >= 2:
                    raise
                continue
            wire = [("ASKING",), *commands] if asking is not None else commands
            try:
                try:
                    conn.send_packed_command(conn.pack_commands(wire))
                except (redis.ConnectionError, OSError):
                    conn.disconnect()
                    self.refresh_topology()
                    if attempt >= 2:
                        raise
                    continue  # not sent: safe to send again
                replies: list[Any] = []
                demoted = False
                for _ in wire:
                    try:
                        replies.append(conn.read_response())
                    except redis.ResponseError as exc:
                        replies.append(exc)
                    except redis.exceptions.BusyLoadingError as exc:
                        # a loading server refuses every command (redis-py has closed
                        # the connection): the rest were refused too
                        replies.extend([exc] * (len(wire) - len(replies)))
                        break
                    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                        conn.disconnect()  # the replies may still come: never reuse
                        self.refresh_topology()
                        if not replies and _refused_by_a_replica(exc) and attempt < 2:
                            demoted = True  # READONLY (Sentinel): nothing ran
                            break
                        raise _lost(operation or script or commands[0][0], exc) from exc
                    except BaseException:
                        conn.disconnect()
                        raise
            finally:
                pool.release(conn)
            if demoted:
                continue  # the pool asks the sentinels for the master again
            if asking is not None:
                replies = replies[1:]
            asking = None
            error = next((r for r in replies if isinstance(r, Exception)), None)
            if error is None:
                return replies
            # A redirection anywhere means nothing ran: the command itself was refused,
            # or (MULTI) a queued one was and EXEC aborted.
            if isinstance(error, MovedError):
                manager = self.client.nodes_manager
                if hasattr(manager, "move_slot"):  # redis-py >= 6
                    manager.move_slot(error)
                else:  # redis-py 5: applied by the next slot lookup
                    manager.update_moved_exception(error)
                continue
            if isinstance(error, AskError):
                asking = (error.host, error.port)
                continue
            if isinstance(error, (TryAgainError, ClusterDownError)):
                if deadline is None:
                    deadline = time.monotonic() + self.settings.redis_timeout_s
                if time.monotonic() >= deadline:
                    raise error
                time.sleep(0.05)
                self.refresh_topology()
                continue
            if error is replies[0]:
                if isinstance(error, NoScriptError) and script:
                    sha = self.client.script_load(self.scripts[script].script)
                    self.scripts[script].sha = sha
                    commands = [(commands[0][0], sha, *commands[0][2:]), *commands[1:]]
                    continue
                raise error
            return replies
        raise DebounceBackendError("debounce Redis: too many redirections")

    # -- producers ---------------------------------------------------------------------------
    def gate(self, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
        """One call through ``gate.lua``: one EVALSHA round trip (the hot path). With
        ``debounce_redis_wait_replicas`` this is :meth:`_gate_waited` (see __init__), so
        the default path has nothing extra."""
        return parse_reply(self.run_once(
            "gate", gate_keys(self, call), gate_args(self, call, fixed)))

    def _gate_waited(self, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
        return parse_reply(self._run_gate_waited(
            gate_keys(self, call), gate_args(self, call, fixed)))

    def run_gate(self, keys: list[str], args: list[Any]) -> Any:
        """``gate.lua``'s raw reply (the waited variant replaces this, see __init__)."""
        return self.run_once("gate", keys, args)

    def _run_gate_waited(self, keys: list[str], args: list[Any]) -> Any:
        """``gate.lua`` then ``WAIT n timeout`` on the same connection, in one write.

        Fewer acknowledgements than ``n`` (within half of ``debounce_redis_timeout``)
        raise :class:`DebounceBackendError`: the call was written on the master but
        may not survive a failover. A redirection or a refused connection before
        anything was sent is retried on the current master; a connection lost after
        the command was sent is an error (the call may or may not be recorded).
        """
        wanted = self.settings.wait_replicas
        wait_ms = self.settings.wait_replicas_ms
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", self.scripts["gate"].sha, len(keys), *keys, *args),
            ("WAIT", wanted, wait_ms),
        ]
        with translate_errors("gate"):
            reply, acks = self.send_on_node(keys[0], commands, "gate")
        if isinstance(acks, redis.RedisError):  # NOPERM without +wait, ...: the call ran
            raise DebounceOutcomeUnknown(
                f"debounce Redis refused WAIT after the call was written on the master "
                f"({type(acks).__name__}: {acks}); whether it survives a failover is "
                "unknown (it was not sent again)") from acks
        if int(acks) < wanted:
            raise DebounceOutcomeUnknown(
                f"debounce_redis_wait_replicas={wanted}: only {int(acks)} replica(s) "
                f"acknowledged the call within {wait_ms} ms; it was written on the master "
                "but may not survive a failover"
            )
        return reply

    def _wait_command(self) -> tuple[tuple[Any, ...], ...]:
        """``WAIT n timeout`` after each bulk chunk with ``debounce_redis_wait_replicas``."""
        wanted = self.settings.wait_replicas
        return (("WAIT", wanted, self.settings.wait_replicas_ms),) if wanted else ()

    def _chunk_commands(
        self, sha: str, calls: Sequence[PreparedCall], chunk: Sequence[int], marker: str,
        waited: tuple[tuple[Any, ...], ...],
    ) -> list[tuple[Any, ...]]:
        """One bulk chunk: its gate calls and its marker in one ``MULTI``/``EXEC``, then
        the ``WAIT`` of ``debounce_redis_wait_replicas`` if set."""
        return [
            ("MULTI",),
            *(("EVALSHA", sha, 2, *gate_keys(self, calls[i]), *gate_args(self, calls[i]))
              for i in chunk),
            ("SET", marker, 1, "PX", _MARKER_TTL_MS),
            ("EXEC",),
            *waited,
        ]

    def _check_acks(self, acks: Any, chunk: Sequence[int], outcomes: list[Any]) -> None:
        """Fewer replicas than ``debounce_redis_wait_replicas`` acknowledged a chunk: its
        written calls may not survive a failover (retrying them may count them twice)."""
        wanted = self.settings.wait_replicas
        if isinstance(acks, Exception):  # NOPERM without +wait, ...: the chunk ran
            error = DebounceOutcomeUnknown(
                f"debounce Redis refused WAIT after this chunk was written on the master "
                f"({type(acks).__name__}: {acks}); whether its calls survive a failover "
                "is unknown")
            error.__cause__ = acks
        elif int(acks) >= wanted:
            return
        else:
            error = DebounceOutcomeUnknown(
                f"debounce_redis_wait_replicas={wanted}: only {int(acks)} replica(s) "
                "acknowledged this chunk; its calls were written on the master but may not "
                "survive a failover")
        for i in chunk:
            if isinstance(outcomes[i], GateResult):
                outcomes[i] = error

    def gate_many(
        self, calls: Sequence[PreparedCall], chunk_size: int = 1000,
        on_chunk: Callable[[range], None] | None = None, into: list[Outcome] | None = None,
    ) -> list[Outcome]:
        """Run ``gate.lua`` for each call, in order, pipelined on one connection.

        Each chunk is one ``MULTI``/``EXEC`` transaction that also sets a short-lived
        marker key, so a chunk runs entirely or not at all, and after a connection
        error the marker tells whether an unanswered chunk ran. Chunk ``k + 1`` is
        sent before the replies of chunk ``k`` are read, so the client's work overlaps
        Redis running the scripts. NOSCRIPT replies are run again once the script is
        loaded. Returns one outcome per call: its :class:`GateResult`, :data:`WRITTEN`
        (ran, reply lost, window id not found), or the exception that kept it out.
        ``on_chunk(indexes)`` runs after a chunk's replies were read while the next
        chunk is already on its way (``into``, if given, is the list filled in).
        """
        script = self.scripts["gate"]
        client = self.client
        outcomes: list[Any] = into if into is not None else []
        outcomes[:] = [None] * len(calls)
        missing: list[int] = []
        if self.cluster:
            self._gate_many_cluster(calls, chunk_size, on_chunk, outcomes, missing)
            self._rerun_missing(calls, outcomes, missing)
            _translate_outcomes(outcomes)
            return outcomes
        pool = client.connection_pool
        waited = self._wait_command()
        marker_prefix = bulk_marker_prefix(self.tag(0), uuid.uuid4().hex)
        sent: list[tuple[str, range]] = []  # (marker, chunk) sent and not answered
        answered: list[str] = []  # markers of the chunks whose replies were read
        failure: BaseException | None = None
        with translate_errors("gate (bulk)"):
            if not getattr(script, "_loaded_by_bulk", False):  # spare a chunk of NOSCRIPT
                script.sha = client.script_load(script.script)
                setattr(script, "_loaded_by_bulk", True)  # noqa: B010
            conn: Any = pool.get_connection(*self._checkout_args)  # refused: nothing sent
        try:
            for start in range(0, len(calls), chunk_size):
                chunk = range(start, min(start + chunk_size, len(calls)))
                marker = f"{marker_prefix}{start}"
                conn.send_packed_command(conn.pack_commands(
                    self._chunk_commands(script.sha, calls, chunk, marker, waited)))
                sent.append((marker, chunk))
                if len(sent) > 1:
                    _read_chunk(conn, sent[0][1], outcomes, missing)
                    if waited:
                        self._check_acks(_reply_or_error(conn), sent[0][1], outcomes)
                    marker, done = sent.pop(0)
                    answered.append(marker)
                    if on_chunk is not None:
                        on_chunk(done)
            while sent:
                _read_chunk(conn, sent[0][1], outcomes, missing)
                if waited:
                    self._check_acks(_reply_or_error(conn), sent[0][1], outcomes)
                answered.append(sent.pop(0)[0])
            # every reply arrived: the markers served their purpose (else they expire)
            conn.send_command("DEL", *answered)
            _reply_or_error(conn)  # refused (no +del): they expire
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            conn.disconnect()
            failure = exc
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if failure is not None:
            self._settle(calls, sent, outcomes, failure)
        self._rerun_missing(calls, outcomes, missing)
        _translate_outcomes(outcomes)
        return outcomes

    def _rerun_missing(
        self, calls: Sequence[PreparedCall], outcomes: list[Any], missing: list[int],
    ) -> None:
        """Run again, one by one, the bulk calls that met NOSCRIPT (a restart, SCRIPT
        FLUSH, a promoted replica)."""
        if not missing:
            return
        script = self.scripts["gate"]
        try:
            with translate_errors("gate (bulk)"):
                script.sha = self.client.script_load(script.script)
                for i in missing:  # one by one: each reply is known
                    try:
                        argv: list[Any] = gate_args(self, calls[i])
                        outcomes[i] = parse_reply(self.run_gate(gate_keys(self, calls[i]), argv))
                    except DebounceOutcomeUnknown as exc:  # this one may have run
                        outcomes[i] = exc
                        raise DebounceBackendError(
                            "debounce Redis: not sent (an earlier reply was lost)") from exc
                    except DebounceBackendError as exc:
                        if not isinstance(exc.__cause__, redis.ResponseError):
                            raise
                        outcomes[i] = exc.__cause__
        except DebounceBackendError as exc:
            for i in missing:
                if outcomes[i] is None:
                    outcomes[i] = exc

    def _gate_many_cluster(
        self, calls: Sequence[PreparedCall], chunk_size: int,
        on_chunk: Callable[[range], None] | None, outcomes: list[Any], missing: list[int],
    ) -> None:
        """:meth:`gate_many` on a Redis Cluster: a ``MULTI``/``EXEC`` may hold one slot
        only, so calls are grouped by shard (in order within a shard: a window's calls
        are all in one shard) and each chunk goes to its shard's master, one chunk at a
        time; the marker key carries the shard's tag."""
        script = self.scripts["gate"]
        token = uuid.uuid4().hex
        waited = self._wait_command()
        by_shard: dict[int, list[int]] = {}
        for i, call in enumerate(calls):
            by_shard.setdefault(call.shard, []).append(i)
        markers: list[str] = []
        for shard, indexes in by_shard.items():
            prefix = bulk_marker_prefix(self.tag(shard), token)
            for start in range(0, len(indexes), chunk_size):
                chunk = indexes[start : start + chunk_size]
                marker = f"{prefix}{shard}:{start}"
                commands = self._chunk_commands(script.sha, calls, chunk, marker, waited)
                try:
                    with translate_errors("gate (bulk)"):
                        replies = self.send_on_node(marker, commands)
                except DebounceBackendError as exc:
                    if is_outage(exc):  # the chunk may have run: its marker says
                        self._settle(calls, [(marker, chunk)], outcomes, exc)
                    else:
                        for i in chunk:
                            outcomes[i] = exc
                    continue
                executed = replies[len(chunk) + 2]
                if isinstance(executed, Exception):  # EXECABORT: nothing of this chunk ran
                    for i in chunk:
                        outcomes[i] = executed
                    continue
                for i, reply in zip(chunk, executed, strict=False):
                    if isinstance(reply, NoScriptError):
                        missing.append(i)
                    elif isinstance(reply, Exception):
                        outcomes[i] = reply
                    else:
                        outcomes[i] = parse_reply(reply)
                if waited:
                    self._check_acks(replies[-1], chunk, outcomes)
                markers.append(marker)
                if on_chunk is not None:
                    for i in chunk:
                        on_chunk(range(i, i + 1))
        if markers:
            try:
                self.client.delete(*markers)  # split by slot by the cluster client
            except redis.RedisError:
                pass  # they expire

    def _settle(
        self, calls: Sequence[PreparedCall], unanswered: Sequence[tuple[str, Sequence[int]]],
        outcomes: list[Any], failure: BaseException,
    ) -> None:
        """After a connection error: find out which unanswered chunks ran (their marker
        exists)."""
        error = DebounceBackendError(f"debounce Redis unreachable during gate (bulk): {failure}")
        pending = [i for i in range(len(calls)) if outcomes[i] is None and
                   not any(i in chunk for _, chunk in unanswered)]
        for i in pending:  # never sent
            outcomes[i] = error
        try:
            with translate_errors("gate (bulk) check"):
                with self.client.pipeline(transaction=False) as pipe:
                    for marker, _ in unanswered:
                        pipe.exists(marker)
                    ran = pipe.execute()
                for (_, chunk), did_run in zip(unanswered, ran, strict=True):
                    if not did_run:
                        for i in chunk:
                            outcomes[i] = error
                        continue
                    with self.client.pipeline(transaction=False) as pipe:
                        for i in chunk:
                            pipe.hget(open_key(self.tag(calls[i].shard), calls[i].ident), F_ID)
                        ids = pipe.execute()
                    for i, tid in zip(chunk, ids, strict=True):
                        outcomes[i] = WRITTEN if tid is None else GateResult(
                            as_text(tid), False, 0, 0, 0)
        except DebounceBackendError:
            for _, chunk in unanswered:
                for i in chunk:
                    if outcomes[i] is None:
                        outcomes[i] = UNKNOWN_OUTCOME

    # -- dispatchers -------------------------------------------------------------------------
    def take(self, shard: Shard, limit: int, observer: str = "",
             lapse_upto: int | None = None) -> TakeResult:
        """Atomically take up to ``limit`` due windows (and expired leases) of ``shard``.

        ``take.lua`` is not idempotent (it leases what it returns), so it is sent once
        (:meth:`run_once`). With ``observer`` (the dispatcher's name), a pass that takes
        windows also records the name and time in ``<tag>:dispatchers`` and calls per
        ident in ``<tag>:hot``. ``lapse_upto``: the latest claim expiry (Redis ms) that
        may lapse in this pass (after a step forward of Redis's clock; None: up to now).
        """
        settings = self.settings
        tag = self.tag(shard)
        reply = self.run_once(
            "take",
            [due_key(tag), leased_key(tag), stats_key(tag)],
            [tag, limit, settings.dispatch_lease_ms, settings.record_ttl_ms,
             settings.history_ttl_ms, observer, HOT_KEYS_KEPT,
             "" if lapse_upto is None else lapse_upto, *LATE_BUCKETS_MS],
        )
        now_ms = int(reply[0])
        result = TakeResult(now_ms, int(reply[1]), [])
        for row in reply[2:]:
            if len(row) == 2:  # a key of the wrong type, set aside by take.lua
                result.skipped.append((as_text(row[0]), as_text(row[1])))
                continue
            try:
                result.windows.append(_taken(shard, now_ms, row))
            except (TypeError, ValueError, UnicodeDecodeError) as exc:  # missing or garbled
                tid = as_text(row[0]) if row[0] is not None else "?"
                result.unreadable.append((tid, f"unreadable record: {type(exc).__name__}: {exc}"))
        return result

    def ack(self, shard: Shard, task_ids: Sequence[str]) -> int:
        """Mark published windows queued; returns how many were."""
        tag = self.tag(shard)
        return int(self.run("ack", [leased_key(tag), active_key(tag)], [tag, *task_ids])[0])

    def release(self, shard: Shard, delay_ms: int, windows: Sequence[tuple[str, int | str]]
                ) -> int:
        """Hand ``(task id, tries)`` windows back: their lease ends in ``delay_ms``
        (``tries`` as ``"<tries>!"``: also count a publish failure against it, ``fl``)."""
        tag = self.tag(shard)
        pairs = [x for pair in windows for x in pair]
        return int(self.run("release", [leased_key(tag)], [delay_ms, tag, *pairs])[0])

    def quarantine(self, shard: Shard, task_id: str, reason: str) -> list[Any] | None:
        """Set a taken record aside; its raw aliases, or None if it was not quarantined."""
        tag = self.tag(shard)
        reply = self.run_once("quarantine", [leased_key(tag), quarantine_key(tag)],
                              [tag, task_id, reason])
        return list(reply[1:]) if int(reply[0]) else None

    def expiring(self, shard: Shard, windows: Sequence[tuple[str, int]]) -> int:
        """Remember when the messages of ``(task id, ms left)`` windows, just published,
        expire (from Redis's now); returns how many."""
        tag = self.tag(shard)
        pairs = [x for pair in windows for x in pair]
        slack = EXPIRY_GRACE_MS + self.settings.history_ttl_ms
        return int(self.run("expiring", [expiring_key(tag)], [slack, *pairs])[1])

    def expire(self, shard: Shard, limit: int = 100) -> list[tuple[str, list[Any]]]:
        """Finish as REVOKED the queued windows whose message expired more than
        :data:`EXPIRY_GRACE_MS` ago, on Redis's clock and on this process's (a Redis
        clock stepped forward revokes nothing early); ``(task id, raw aliases)`` of each
        one finished, and of those finished earlier whose outcome :meth:`expired` has
        not confirmed."""
        tag = self.tag(shard)
        reply = self.run("expire", [expiring_key(tag), active_key(tag)],
                         [tag, EXPIRY_GRACE_MS, self.settings.history_ttl_ms, limit,
                          int(time.time() * 1000)])
        return [(as_text(row[0]), list(row[1:])) for row in reply[1:]]

    def expired(self, shard: Shard, task_ids: Sequence[str]) -> None:
        """The outcome of these windows :meth:`expire` finished is stored: forget them."""
        if task_ids:
            with translate_errors("expired"):
                self.client.zrem(expiring_key(self.tag(shard)), *task_ids)

    def layouts(self, write: Sequence[str] = ()) -> tuple[int, dict[str, int]]:
        """Write the layout names ``write`` (now), drop those not written for the
        history TTL; ``(now ms, every layout remembered -> ms last written)``."""
        reply = self.run("layouts", [layouts_key(self.settings.key_prefix)],
                         [self.settings.history_ttl_ms, *write])
        items = reply[1:]
        return int(reply[0]), {as_text(items[i]): int(items[i + 1])
                               for i in range(0, len(items) - 1, 2)}

    def wake_listener(self) -> WakeListener:
        """A subscription to the wake channel (one per dispatcher)."""
        return WakeListener(self)

    # -- workers ---------------------------------------------------------------------------
    def record_keys(self, shard: Shard, task_id: str) -> list[str]:
        """KEYS of claim.lua and finish.lua: the record, the lease, active and claims sets."""
        tag = self.tag(shard)
        return [win_key(tag, task_id), leased_key(tag), active_key(tag), claims_key(tag)]

    def claim_args(self, task_id: str, task_name: str, retry: bool) -> list[Any]:
        return [task_id, self.settings.claim_lease_ms, "1" if retry else "0", task_name,
                self.settings.history_ttl_ms]

    def claim(self, shard: Shard, task_id: str, task_name: str = "",
              retry: bool = False, ident: str = "") -> tuple[str, bool]:
        """Claim a window's run for one claim lease: ``(state before ("" if the record
        is gone), run)``; ``run`` False: a duplicate delivery (finished, or claimed under
        a live lease), which must not run. With ``debounce_redis_wait_replicas`` this is
        :meth:`_claim_waited` (see __init__); ``ident`` is read only there."""
        before, _, run = self.run_once("claim", self.record_keys(shard, task_id),
                                       self.claim_args(task_id, task_name, retry))
        return as_text(before), bool(int(run))

    def _run_waited(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Script ``name`` then ``WAIT n timeout`` on the same connection, in one write
        (as the gate's). Fewer acknowledgements than ``n`` (or WAIT refused) raise
        :class:`NotReplicated` carrying the script's reply: it ran on the master, a
        failover may discard it."""
        wanted = self.settings.wait_replicas
        wait_ms = self.settings.wait_replicas_ms
        with translate_errors(name):
            reply, acks = self.send_on_node(keys[0], [
                ("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args),
                ("WAIT", wanted, wait_ms)], name)
        if isinstance(acks, Exception) or int(acks) < wanted:
            said = (f"WAIT refused ({type(acks).__name__}: {acks})"
                    if isinstance(acks, Exception) else
                    f"only {int(acks)} replica(s) acknowledged it within {wait_ms} ms")
            raise NotReplicated(
                f"debounce_redis_wait_replicas={wanted}: {name} ran on the master but "
                f"{said}; a failover may discard it", reply)
        return reply

    def run_mark(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Send a kept worker mark again (marks.py): :meth:`run_once`; with
        ``debounce_redis_wait_replicas`` :meth:`_run_mark_waited` (see __init__)."""
        return self.run_once(name, keys, args)

    def _run_mark_waited(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """A kept ``finish`` is waited for (sent again until acknowledged: idempotent); a
        kept ``claim`` (its run went ahead during an outage) is sent once, as without
        ``WAIT``: sent again, it would find its own first copy live and mark a duplicate."""
        if name == "finish":
            return self._run_waited(name, keys, args)
        return self.run_once(name, keys, args)

    def _claim_waited(self, shard: Shard, task_id: str, task_name: str = "",
                      retry: bool = False, ident: str = "") -> tuple[str, bool]:
        """:meth:`claim` followed by ``WAIT`` (``debounce_redis_wait_replicas``): a claim
        that would run the body and that fewer replicas acknowledged is undone on the
        master it ran on (``unclaim.lua``, only if the claim is still that one) and
        raised as :class:`NotReplicated`: its run must wait (a failover may discard the
        claim, and the promoted replica's copy of the window would run a second time).
        A skip, or a record that is gone (nothing written), is answered as is.
        ``ident``: the window's ident the dispatcher sent (header ``debounce_ident``): a
        record that is gone while the window is still open here under this id (its take
        was lost with a failover) is a skip (state ``pending``): this master's
        dispatcher publishes it."""
        keys = self.record_keys(shard, task_id)
        try:
            before, at, run = self._run_waited(
                "claim", keys, [*self.claim_args(task_id, task_name, retry), ident])
        except NotReplicated as exc:
            before, at, run = exc.reply
            if not int(run) or not before:
                return as_text(before), bool(int(run))
            try:
                self.run_once("unclaim", keys, [task_id, int(at), as_text(before)])
            except DebounceBackendError as undo:  # a demoted master: it is discarded anyway
                logger.debug("debounce: could not undo the claim of %s: %s", task_id, undo)
            raise
        return as_text(before), bool(int(run))

    def renew(self, held: dict[str, list[str]]) -> None:
        """Renew the claims ``held`` (claims key -> task ids) for one claim lease: one
        pipelined round trip (one ``EVALSHA`` per claims key; per node on a cluster)."""
        script = self.scripts["renew"]
        lease = self.settings.claim_lease_ms
        with translate_errors("renew"):
            try:
                self._renew(script.sha, held, lease)
            except NoScriptError:
                script.sha = self.client.script_load(script.script)
                self._renew(script.sha, held, lease)

    def _renew(self, sha: str, held: dict[str, list[str]], lease: int) -> None:
        if self.cluster:  # one write per master (redis-py's cluster pipeline refuses EVALSHA)
            by_node: dict[str, list[str]] = {}
            for key in held:
                by_node.setdefault(self.client.get_node_from_key(key).name, []).append(key)
            for keys in by_node.values():
                self.send_on_node(keys[0], [("EVALSHA", sha, 1, key, lease, *held[key])
                                            for key in keys], "renew", operation="renew")
            return
        with self.client.pipeline(transaction=False) as pipe:
            for key, ids in held.items():
                pipe.evalsha(sha, 1, key, lease, *ids)
            pipe.execute()

    def claims_key(self, shard: Shard) -> str:
        return claims_key(self.tag(shard))

    def held(self, shard: Shard) -> dict[str, tuple[int, str | None]]:
        """Exclusive windows held on ``shard`` (take.lua): ident -> (held since ms, the
        id of the window in progress it waits for, None if that one just ended)."""
        tag = self.tag(shard)
        with translate_errors("inspect"):
            rows = self.client.zrange(held_key(tag), 0, -1, withscores=True)
            if not rows:
                return {}
            idents = [as_text(ident) for ident, _ in rows]
            with self.client.pipeline(transaction=False) as pipe:
                for ident in idents:
                    pipe.hget(run_key(tag, ident), "id")
                runners = pipe.execute(raise_on_error=False)
        return {ident: (int(score), as_text(runner) if isinstance(runner, bytes) else None)
                for ident, (_, score), runner in zip(idents, rows, runners, strict=True)}

    def finish_args(self, task_id: str, state: str) -> list[Any]:
        return [task_id, state, self.settings.history_ttl_ms]

    def finish(self, shard: Shard, task_id: str, state: str) -> list[Any]:
        """Mark a window finished with ``state``; the raw aliases it returns. With
        ``debounce_redis_wait_replicas`` this is :meth:`_finish_waited` (see __init__)."""
        reply = self.run_once("finish", self.record_keys(shard, task_id),
                              self.finish_args(task_id, state))
        return list(reply[2:])

    def _finish_waited(self, shard: Shard, task_id: str, state: str) -> list[Any]:
        """:meth:`finish` followed by ``WAIT``: a finish fewer replicas acknowledged
        raises :class:`NotReplicated` (its ``reply`` the script's: the caller keeps the
        mark to be sent again, ``finish.lua`` is idempotent)."""
        reply = self._run_waited("finish", self.record_keys(shard, task_id),
                                 self.finish_args(task_id, state))
        return list(reply[2:])

    # -- operators -------------------------------------------------------------------------
    def ping(self) -> bool:
        """True when Redis answers (errors leave as DebounceBackendError)."""
        with translate_errors("ping"):
            return bool(self.client.ping())

    def time_ms(self, operation: str = "time") -> int:
        """The Redis clock, ms (``operation`` names the caller in an error)."""
        with translate_errors(operation):
            secs, micros = self.client.time()
        return int(secs) * 1000 + int(micros) // 1000

    def pending(self, shard: int, ident: str) -> Record | None:
        """The pending window of ``ident``: one HMGET and one ZSCORE (its deadline)."""
        tag = self.tag(shard)
        with translate_errors("inspect"), self.client.pipeline(transaction=False) as pipe:
            pipe.hmget(open_key(tag, ident), *INSPECT_FIELDS)
            pipe.zscore(due_key(tag), ident)
            row, deadline = pipe.execute()
        if deadline is None:
            return None
        return decode_record(INSPECT_FIELDS, row, ident=ident, deadline=deadline)

    def taken(self, task_id: str) -> tuple[int, Record] | None:
        """``(shard, record)`` of the taken window ``task_id``: one lookup per shard."""
        with translate_errors("inspect"), self.client.pipeline(False) as pipe:
            for tag in self.settings.tags:
                pipe.hmget(win_key(tag, task_id), *INSPECT_FIELDS)
            rows = pipe.execute()
        for shard, row in enumerate(rows):
            record = decode_record(INSPECT_FIELDS, row)
            if record is not None:
                return shard, record
        return None

    def list_step(self, shard: int, start: str, skip: int, budget: int, want: int,
                  prefix: str, pattern: bytes) -> ListStep:
        """One ``list.lua`` step: pending windows along the due set, filtered in Redis."""
        tag = self.tag(shard)
        reply = self.run("list", [due_key(tag)], [tag, start, skip, budget, want, prefix, pattern])
        examined, last, at_last, done = reply[:4]
        windows = []
        for ident, *row in reply[4:]:
            record = decode_record(LIST_FIELDS, row, ident=as_text(ident))
            if record is not None:
                windows.append(record)
        return ListStep(int(examined), as_text(last), int(at_last), bool(int(done)), windows)

    def taken_page(self, shard: int, set_name: str, start: int, count: int) -> list[TakenEntry]:
        """Members ``start .. start+count-1`` of a taken set (layout.TAKEN_SETS), in score
        order, with their records."""
        tag = self.tag(shard)
        client = self.client
        with translate_errors("inspect"):
            ids = [as_text(m) for m in client.zrange(taken_set_key(tag, set_name), start,
                                                     start + count - 1)]
        if not ids:
            return []
        with translate_errors("inspect"), client.pipeline(transaction=False) as pipe:
            for tid in ids:
                pipe.hmget(win_key(tag, tid), *INSPECT_FIELDS)
            rows = pipe.execute(raise_on_error=False)
        out = []
        for tid, row in zip(ids, rows, strict=True):
            if isinstance(row, Exception):  # not a hash: see take.lua's wrong-type rule
                out.append(TakenEntry(tid, None, f"{win_key(tag, tid)}: {row}"))
            else:
                out.append(TakenEntry(tid, decode_record(INSPECT_FIELDS, row), None))
        return out

    def quiet_ends(self, shard: int, leading: Sequence[Record]) -> dict[str, int]:
        """Task id -> end (ms) of the quiet period each leading run of ``leading`` still
        owns (``quiet_key`` of its ident holds its id): one pipelined HMGET per run."""
        tag = self.tag(shard)
        runs = [r for r in leading if r.leading and r.ident is not None]
        if not runs:
            return {}
        with translate_errors("inspect"), self.client.pipeline(transaction=False) as pipe:
            for record in runs:
                pipe.hmget(quiet_key(tag, record.ident), "id", "dl")  # type: ignore[arg-type]
            rows = pipe.execute(raise_on_error=False)
        ends = {}
        for record, row in zip(runs, rows, strict=True):
            if isinstance(row, list) and row[0] is not None and row[1] is not None and \
                    as_text(row[0]) == record.task_id:
                ends[record.task_id] = int(row[1])
        return ends

    def find_step(self, shard: int, cursor: str, task_id: str,
                  count: int) -> tuple[str, str | None]:
        """One ``find.lua`` step: ``(next cursor, ident of the pending window with this id
        or None)``."""
        tag = self.tag(shard)
        next_cursor, ident = self.run("find", [due_key(tag)], [tag, cursor, count, task_id])
        return as_text(next_cursor), as_text(ident) if ident else None

    def _flush_call(self, shard: int, ident: str, task_id: str) -> tuple[list[str], list[Any]]:
        tag = self.tag(shard)
        channel = shard_wake_channel(tag) if self.sharded_wake else self.settings.wake_channel
        return ([open_key(tag, ident), due_key(tag), leased_key(tag)],
                [ident, channel, task_id, self.settings.record_ttl_ms])

    def flush(self, shard: int, ident: str, task_id: str = "") -> Record | None:
        """Run ``flush.lua``: close the pending window of ``ident`` (with ``task_id`` if
        given) and make it due now. The window as flushed, or None if none was open."""
        reply = self.run_once("flush", *self._flush_call(shard, ident, task_id))
        return decode_record(FLUSH_FIELDS, reply, ident=ident) if reply else None

    def flush_many(self, shard: int, windows: Sequence[tuple[str, str]]) -> int:
        """Flush ``(ident, task id)`` windows in one pipeline; how many were flushed."""
        if self.cluster:  # redis-py refuses scripts in a cluster pipeline: one by one
            return sum(1 for ident, task_id in windows if self.flush(shard, ident, task_id))
        if not self._direct:  # fakeredis, or a client of the caller's
            return sum(1 for ident, task_id in windows if self.flush(shard, ident, task_id))
        calls = [self._flush_call(shard, ident, task_id) for ident, task_id in windows]
        return sum(1 for r in self._pipeline_once("flush", calls) if r)

    def _pipeline_once(self, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """Script ``name`` once per ``(keys, args)`` in one write on one pooled connection
        of a single node, each sent at most once (like :meth:`run_once`): the calls that
        met NOSCRIPT (they did not run) are sent again once the script is loaded; a
        lost reply raises :class:`~celery_debounce.DebounceOutcomeUnknown`. An error
        reply of one call is raised after every reply was read."""
        script = self.scripts[name]
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        pool = self.client.connection_pool
        with translate_errors(name):
            for _ in (1, 2):
                conn: Any = pool.get_connection(*self._checkout_args)
                try:
                    conn.send_packed_command(conn.pack_commands(
                        [("EVALSHA", script.sha, len(calls[i][0]), *calls[i][0], *calls[i][1])
                         for i in todo]))
                    for k, i in enumerate(todo):
                        replies[i] = _reply_or_error(conn)
                        if isinstance(replies[i], redis.exceptions.BusyLoadingError):
                            for j in todo[k:]:  # refused too (redis-py closed the connection)
                                replies[j] = replies[i]
                            break
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    conn.disconnect()
                    raise _lost(name, exc) from exc
                except BaseException:
                    conn.disconnect()
                    raise
                finally:
                    pool.release(conn)
                todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
                if not todo:
                    break
                script.sha = self.client.script_load(script.script)
            error = next((r for r in replies if isinstance(r, redis.RedisError)), None)
            if error is not None:
                raise error
        return replies

    def cancel(self, shard: int, ident: str, task_id: str = "") -> Cancelled | None:
        """Run ``cancel.lua``: drop the pending window of ``ident`` (with ``task_id`` if
        given); what was dropped, or None."""
        tag = self.tag(shard)
        # cancel.lua keeps its reply under a per-call token: after a lost reply the same
        # call is sent again and gets the first answer (a repeat never acts twice), so a
        # caller learns which window it dropped and can revoke its result
        token = uuid.uuid4().hex
        keys = [open_key(tag, ident), due_key(tag), stats_key(tag)]
        args = [ident, task_id, self.settings.history_ttl_ms, token]
        deadline = time.monotonic() + max(self.settings.redis_timeout_s, 1.0) * 3
        lost: DebounceOutcomeUnknown | None = None
        while True:
            try:
                reply = self.run_once("cancel", keys, args)
                break
            except DebounceBackendError as exc:
                if isinstance(exc, DebounceOutcomeUnknown):
                    lost = lost or exc
                elif lost is None:
                    raise  # nothing ran: a plain error
                if time.monotonic() >= deadline:
                    raise CancelOutcomeUnknown(str(lost), shard, ident, token) from (
                        lost.__cause__ or lost)
                time.sleep(0.05)
        return self._cancel_result(shard, ident, token, reply)

    def _cancel_result(self, shard: int, ident: str, token: str, reply: Any) -> Cancelled | None:
        if not reply:
            return None
        try:
            with translate_errors("cancel"):
                self.client.delete(cancel_marker_key(self.tag(shard), token))
        except DebounceBackendError:
            pass  # it expires
        record = decode_record(CANCEL_FIELDS, reply, ident=ident)
        assert record is not None
        return Cancelled(record, list(reply[len(CANCEL_FIELDS):]))

    def cancelled_by(self, lost: CancelOutcomeUnknown) -> Cancelled | None:
        """After :class:`CancelOutcomeUnknown`: the window that cancel dropped (read from
        its token's key, a read only), or None if it did not run. Raises
        DebounceBackendError while Redis does not answer."""
        with translate_errors("cancel check"):
            reply = self.client.lrange(cancel_marker_key(self.tag(lost.shard), lost.token), 0, -1)
        return self._cancel_result(lost.shard, lost.ident, lost.token, reply)

    def census_step(self, shard: int, cursor: str, count: int,
                    now_ms: int) -> tuple[str, list[CensusRow]]:
        """One ``census.lua`` step of per-task counts of pending windows."""
        tag = self.tag(shard)
        reply = self.run("census", [due_key(tag)], [tag, cursor, count, now_ms])
        rows = [CensusRow(as_text(task), int(n_open), int(n_due), int(oldest), int(waiting))
                for task, n_open, n_due, oldest, waiting in reply[1:]]
        return as_text(reply[0]), rows

    def counts(self, shard: int, now_ms: int) -> ShardCounts:
        """Open and due windows of ``shard`` and its counters."""
        tag = self.tag(shard)
        with translate_errors("stats"), self.client.pipeline(False) as pipe:
            pipe.zcard(due_key(tag))
            pipe.zcount(due_key(tag), "-inf", now_ms)
            pipe.hgetall(stats_key(tag))
            zcard, zcount, counters = pipe.execute()
        return ShardCounts(int(zcard), int(zcount),
                           {as_text(k): int(v) for k, v in counters.items()})

    def reset_counters(self, shard: int) -> dict[str, int]:
        """Zero the shard's counters atomically; the counters removed.

        The hash is RENAMEd away (one atomic step: later increments start a new hash),
        read, then deleted; the renamed copy keeps the hash's TTL, so a crash in between
        leaves nothing forever.
        """
        tag = self.tag(shard)
        held = stats_reset_key(tag, uuid.uuid4().hex)  # same hash tag, same slot
        client = self.client
        with translate_errors("stats reset"):
            try:
                client.rename(stats_key(tag), held)
            except redis.ResponseError as exc:
                # "no such key": nothing to reset, unless redis-py sent the RENAME again
                # after its reply was lost (the first one moved the hash to ``held``)
                if "no such key" in str(exc).lower() and not client.exists(held):
                    return {}
                if "no such key" not in str(exc).lower():
                    raise
            removed = {as_text(k): int(v) for k, v in client.hgetall(held).items()}
            client.delete(held)
        return removed

    # -- liveness ----------------------------------------------------------------------------
    def heartbeat(self, name: str, alive: bool = True) -> int:
        """Record that dispatcher ``name`` runs (``alive``) or stopped cleanly
        (``alive.lua``, on shard 0's tag); returns the Redis time, ms."""
        tag = self.tag(0)
        return int(self.run("alive", [alive_key(tag), stopped_key(tag)],
                            [name, "1" if alive else "0", self.settings.history_ttl_ms]))

    def liveness(self) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
        """``(Redis time ms, [(name, last heartbeat ms)], [(name, stopped at ms)])``."""
        tag = self.tag(0)
        now_ms = self.time_ms("ping")
        with translate_errors("ping"), self.client.pipeline(False) as pipe:
            pipe.zrange(alive_key(tag), 0, -1, withscores=True)
            pipe.zrange(stopped_key(tag), 0, -1, withscores=True)
            alive, stopped = pipe.execute()
        return (now_ms, [(as_text(n), int(ms)) for n, ms in alive],
                [(as_text(n), int(ms)) for n, ms in stopped])

    #: Redis commands :meth:`snapshot` sends per shard.
    SNAPSHOT_COMMANDS = 13
    #: Held windows a snapshot lists (the longest held first); the others are counted.
    HELD_LISTED = 8

    def snapshot(self, shard: int, now_ms: int) -> ShardSnapshot:
        """One pipeline of O(1)/O(log N) reads (``top``, the store gauges)."""
        tag = self.tag(shard)
        with translate_errors("top"), self.client.pipeline(False) as pipe:
            pipe.zcard(due_key(tag))
            pipe.zcount(due_key(tag), "-inf", now_ms)
            pipe.zrange(due_key(tag), 0, 0, withscores=True)
            pipe.zcard(leased_key(tag))
            pipe.zcard(active_key(tag))
            pipe.zcard(quarantine_key(tag))
            pipe.hgetall(stats_key(tag))
            pipe.zrevrange(hot_key(tag), 0, HOT_KEYS_KEPT - 1, withscores=True)
            pipe.zrange(dispatchers_key(tag), 0, -1, withscores=True)
            pipe.zrange(alive_key(tag), 0, -1, withscores=True)  # written on shard 0 only
            pipe.zrange(stopped_key(tag), 0, -1, withscores=True)
            pipe.zcard(held_key(tag))
            pipe.zrange(held_key(tag), 0, self.HELD_LISTED - 1, withscores=True)
            replies = pipe.execute(raise_on_error=False)
        # A key of the wrong type (someone wrote it by hand) must not blind the view.
        (z_open, z_due, first, z_leased, z_active, z_quar, counters, hot_rows, seen, alive,
         stopped, z_held, held_rows) = (r if not isinstance(r, Exception) else None
                                        for r in replies)
        kept: dict[str, int] = {}
        for name, value in (counters or {}).items():
            try:
                kept[as_text(name)] = int(value)
            except ValueError:
                continue
        return ShardSnapshot(
            int(z_open or 0), int(z_due or 0), int(first[0][1]) if first else None,
            int(z_leased or 0), int(z_active or 0), int(z_quar or 0), kept,
            [(as_text(i), int(c)) for i, c in hot_rows or []],
            [(as_text(n), int(ms)) for n, ms in seen or []],
            [(as_text(n), int(ms)) for n, ms in alive or []],
            [(as_text(n), int(ms)) for n, ms in stopped or []],
            int(z_held or 0), [(as_text(i), int(ms)) for i, ms in held_rows or []],
        )

    def waits_for(self, shard: Shard, idents: Sequence[str]) -> list[tuple[str | None,
                                                                         str | None]]:
        """For held windows' idents: (id, state) of the window in progress each waits
        for (``<tag>:run:<ident>``), None where it just ended. One pipeline per step."""
        if not idents:
            return []
        tag = self.tag(shard)
        with translate_errors("top"):
            with self.client.pipeline(transaction=False) as pipe:
                for ident in idents:
                    pipe.hget(run_key(tag, ident), "id")
                runners = [as_text(r) if isinstance(r, bytes) else None
                           for r in pipe.execute(raise_on_error=False)]
            with self.client.pipeline(transaction=False) as pipe:
                for runner in runners:
                    pipe.hget(win_key(tag, runner or ""), F_STATE)
                states = [as_text(r) if isinstance(r, bytes) else None
                          for r in pipe.execute(raise_on_error=False)]
        return [(runner, state if runner else None)
                for runner, state in zip(runners, states, strict=True)]

    def maxmemory_policy(self) -> str:
        """The server's ``maxmemory-policy`` (see checks.py), "unknown" if unreadable."""
        from .checks import combined_policy, maxmemory_policy

        if self.cluster:  # every master: the worst answer wins
            return combined_policy([
                maxmemory_policy(self.client.get_redis_connection(node))
                for node in self.client.get_primaries()])
        return maxmemory_policy(self.client)

    # -- tests -------------------------------------------------------------------------------
    def pending_payloads(self, shard: int, prefix: str | None = None) -> Iterator[Record]:
        """Every pending window of ``shard`` (whose ident starts with ``prefix``) with its
        payload and options, in deadline order."""
        tag = self.tag(shard)
        with translate_errors("inspect"):
            due: list[Any] = self.client.zrange(due_key(tag), 0, -1, withscores=True)
        for member, deadline in due:  # a pending window's deadline is its due score
            ident = as_text(member)
            if prefix is not None and not ident.startswith(prefix):
                continue
            with translate_errors("inspect"):
                row = self.client.hmget(open_key(tag, ident), *PAYLOAD_FIELDS)
            record = decode_record(PAYLOAD_FIELDS, row, ident=ident, deadline=deadline)
            if record is not None:
                yield record

    def collected(self, shard: int, collect_list: str) -> list[bytes]:
        """The call elements of a pending debounce_collect window (record field ``cl``),
        in call order."""
        with translate_errors("inspect"):
            return list(self.client.lrange(calls_key(self.tag(shard), collect_list), 0, -1))

    def delete_all(self) -> int:
        """Delete every key under the app's ``debounce_key_prefix``; how many."""
        with translate_errors("clear"):
            keys = list(self.client.scan_iter(
                match=all_keys_pattern(self.settings.key_prefix), count=1000))
            # the one key outside every hash tag (all_keys_pattern matches tagged keys)
            keys.append(layouts_key(self.settings.key_prefix))
            return int(self.client.delete(*keys))


def _taken(shard: Shard, now_ms: int, row: list[Any]) -> TakenWindow:
    record = decode_record(TAKE_FIELDS, row, strict=True)
    if record is None:
        raise ValueError("no task id")
    assert record.ident is not None
    split_ident(record.ident)  # raises on a malformed ident
    if record.payload is None:
        raise ValueError("no payload")
    return TakenWindow(
        shard=shard,
        task_id=record.task_id,
        ident=record.ident,
        first_seen_ms=record.first_seen_ms,
        deadline_ms=record.deadline_ms,
        ceiling_ms=record.ceiling_ms,
        calls=record.calls,
        content_type=record.content_type,
        payload=record.payload,
        options_json=record.options_json,
        tries=record.tries,
        taken_ms=now_ms,
        capped=record.capped,
        leading=record.leading,
        failures=int(row[len(TAKE_FIELDS)] or 0) if len(row) > len(TAKE_FIELDS) else 0,
        held_ms=int(row[len(TAKE_FIELDS) + 1]) if len(row) > len(TAKE_FIELDS) + 1 else 0,
    )


def _translate_outcomes(outcomes: list[Any]) -> None:
    """Every redis-py error a bulk call met leaves as a DebounceBackendError (its cause)."""
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, redis.RedisError):
            outcomes[i] = _translated("gate (bulk)", outcome)
            outcomes[i].__cause__ = outcome


def _reply_or_error(conn: Any) -> Any:
    """The next reply on ``conn``; an error reply as the exception (not raised)."""
    try:
        return conn.read_response()
    except (redis.ResponseError, redis.exceptions.BusyLoadingError) as exc:  # LOADING: a reply
        return exc


def _read_chunk(conn: Any, chunk: range, outcomes: list[Any], missing: list[int]) -> None:
    """Read one chunk's MULTI/QUEUED.../EXEC replies into ``outcomes``."""
    queue_error: redis.ResponseError | None = None
    for _ in range(len(chunk) + 2):  # MULTI's OK, then QUEUED per command (+ the marker)
        try:
            conn.read_response()
        except redis.ResponseError as exc:  # refused at queue time (OOM, ...): EXEC aborts
            queue_error = queue_error or exc
    try:
        replies = conn.read_response()
    except redis.ResponseError as exc:  # EXECABORT: nothing of this chunk ran
        for i in chunk:
            outcomes[i] = queue_error or exc
        return
    for i, reply in zip(chunk, replies, strict=False):
        if isinstance(reply, NoScriptError):
            missing.append(i)
        elif isinstance(reply, Exception):  # this script failed; the others ran
            outcomes[i] = reply
        else:
            outcomes[i] = parse_reply(reply)


class WakeListener:
    """A dispatcher's subscription to the wake channel (gate.lua and flush.lua publish
    on it when a deadline earlier than every other appears)."""

    def __init__(self, store: WindowStore) -> None:
        self.store = store
        self._pubsub: Any = None

    def subscribe(self) -> None:
        """Subscribe and wait until Redis confirms it (no-op when subscribed)."""
        if self._pubsub is not None:
            return
        if self.store.sharded_wake:
            self._subscribe_sharded()
            return
        settings = self.store.settings
        with translate_errors("wake subscription"):
            pubsub = self.store.client.pubsub()
            pubsub.subscribe(settings.wake_channel)
            deadline = time.monotonic() + max(settings.redis_timeout_s, 1.0)
            while time.monotonic() < deadline:
                message = pubsub.get_message(timeout=0.2)
                if message is not None and message["type"] == "subscribe":
                    self._pubsub = pubsub
                    return
        pubsub.close()
        raise DebounceBackendError("debounce Redis did not confirm the wake subscription")

    def _subscribe_sharded(self) -> None:
        """SSUBSCRIBE to every shard's ``<tag>:wake`` on the master serving it (cluster).

        One connection per master holding shards (redis-py's ``ClusterPubSub``). A
        master that fails, or a slot that moves (the server ends the subscription with
        ``sunsubscribe``), ends the wait; the dispatcher subscribes again on the new owner.
        """
        settings = self.store.settings
        channels = [settings.shard_wake_channel(s) for s in range(settings.shards)]
        with translate_errors("wake subscription"):
            pubsub: Any = self.store.client.pubsub()
            try:
                pubsub.ssubscribe(*channels)
                confirmed: set[Any] = set()
                deadline = time.monotonic() + max(settings.redis_timeout_s, 1.0)
                while time.monotonic() < deadline and len(confirmed) < len(channels):
                    message = pubsub.get_sharded_message(timeout=0.05)
                    if message is not None and message["type"] == "ssubscribe":
                        confirmed.add(message["channel"])
            except BaseException:
                pubsub.close()
                raise
        if len(confirmed) < len(channels):
            pubsub.close()
            raise DebounceBackendError("debounce Redis did not confirm the wake subscription")
        self._pubsub = pubsub

    def _next(self, timeout: float) -> Any:
        if self.store.sharded_wake:
            # round robin over the masters' connections, a short wait on each
            message = self._pubsub.get_sharded_message(timeout=min(timeout, 0.02))
            if message is not None and message["type"] == "sunsubscribe":
                self.close()  # the slot moved: subscribe again on its new owner
                return {"type": "message"}
            return message
        return self._pubsub.get_message(timeout=timeout)

    @property
    def subscribed(self) -> bool:
        return self._pubsub is not None

    def wait(self, seconds: float, stop: threading.Event) -> None:
        """Sleep up to ``seconds`` or until a wake-up arrives or ``stop`` is set."""
        if seconds <= 0:
            return
        deadline = time.monotonic() + seconds
        self.subscribe()
        switches = self.store.master_switches
        with translate_errors("wake subscription"):
            while not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                if self.store.master_switches != switches:  # Sentinel moved the master:
                    self.close()  # subscribe there (the old one may live on)
                    return
                message = self._next(min(remaining, 0.5))
                if message is not None and message["type"] in ("message", "smessage"):
                    while self._pubsub is not None and self._next(0) is not None:
                        pass
                    return

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except Exception:  # noqa: S110 - closing a broken connection
                pass
            self._pubsub = None


def _unreadable_url(url: str) -> Exception:
    """redis-py could not read ``url``: its own error is not shown (it quotes the part it
    could not read, a password holding '/' or ';' unencoded included)."""
    from .errors import DebounceConfigError  # (kept off the import block other edits touch)

    return DebounceConfigError(redact(
        f"the windows' Redis URL {url!r} cannot be read (a password holding "
        "'/', ';', '@' or ':' must be percent-encoded, e.g. quote(password, safe=''))"
    ))


class _PooledCommands:
    """``execute_command``/``info`` of a store's client, sent once on a pooled
    connection (no retry; a connection that failed is dropped)."""

    def __init__(self, store: WindowStore) -> None:
        self.store = store
        self.connection_pool = store.client.connection_pool

    def execute_command(self, *args: Any) -> Any:
        pool = self.connection_pool
        conn: Any = pool.get_connection(*self.store._checkout_args)
        try:
            conn.send_command(*args)
            return conn.read_response()
        except redis.ResponseError:
            raise
        except BaseException:
            conn.disconnect()  # the reply may still come: never reuse
            raise
        finally:
            pool.release(conn)

    def info(self, section: str) -> dict[str, str]:
        text = as_text(self.execute_command("INFO", section))
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


#: The oldest Redis the scripts run on: ``ZADD ... GT`` arrived in Redis 6.2.
MIN_REDIS = (6, 2)


def read_server_version(client: Any) -> tuple[str, str] | None:
    """``(server name, version)`` from ``HELLO`` (no arguments: nothing changes; any
    authenticated user may send it), else from ``INFO server``; None when the server
    answers neither (both refused). Connection errors are raised."""
    reply = None
    # fakeredis's HELLO without arguments drops the connection to RESP2 under a RESP3
    # client (redis-py 8's default), so every later reply is parsed wrongly: INFO there
    if not type(client).__module__.startswith("fakeredis"):
        try:
            reply = client.execute_command("HELLO")
        except redis.ConnectionError:
            raise
        except redis.ResponseError:  # Redis < 6.2 (HELLO needs an argument there), a proxy
            reply = None
    fields = _pairs(reply)
    version = fields.get("version")
    if version is not None:
        return fields.get("server", "redis"), version
    try:
        info = client.info("server")
    except redis.ConnectionError:
        raise
    except redis.ResponseError:  # INFO refused (the documented ACL user lacks +info)
        return None
    if not isinstance(info, dict) or "redis_version" not in info:
        return None
    return "redis", str(info["redis_version"])


def _pairs(reply: Any) -> dict[str, str]:
    """HELLO's reply (a map with RESP3, a flat list with RESP2), scalars as text."""
    if isinstance(reply, (list, tuple)):
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    if not isinstance(reply, dict):
        return {}
    return {as_text(k): as_text(v) for k, v in reply.items() if isinstance(v, (bytes, str))}


def server_supported(server: str, version: str) -> bool:
    """Redis >= 6.2; Valkey (forked from Redis 7.2) and other servers are not refused."""
    if server.lower() != "redis":
        return True
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= MIN_REDIS


def _every_master_has_sharded_pubsub(client: Any) -> bool:
    """True when every master runs Redis >= 7.0 (SPUBLISH/SSUBSCRIBE)."""
    try:
        replies = client.info("server", target_nodes=redis.RedisCluster.PRIMARIES)
    except redis.RedisError:
        return False
    rows = replies.values() if isinstance(replies, dict) and "redis_version" not in replies \
        else [replies]
    for row in rows:
        version = str(row.get("redis_version", "0")) if isinstance(row, dict) else "0"
        if int(version.split(".")[0] or 0) < 7:
            return False
    return True


_lock = threading.Lock()


def store_for(app: Celery, call: bool = False) -> WindowStore:
    """The app's store in this process (a forked child builds its own).

    Until the server's version was read (:meth:`WindowStore.check_server`), each use
    reads it; ``call``: a producer's call, which raises an outage found there."""
    pid = os.getpid()
    cached: tuple[int, WindowStore] | None = getattr(app, "_debounce_backend", None)
    if cached is not None and cached[0] == pid and cached[1].server_checked:
        return cached[1]
    with _lock:
        cached = getattr(app, "_debounce_backend", None)
        if cached is None or cached[0] != pid:
            cached = (pid, WindowStore(settings_for(app)))
            app._debounce_backend = cached  # type: ignore[attr-defined, unused-ignore]
    store = cached[1]
    if not store.server_checked:  # the first call, dispatcher or worker of this process
        store.check_server(outage_raises=call)
    return store
