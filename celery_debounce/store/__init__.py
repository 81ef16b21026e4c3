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
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery
from redis.backoff import ExponentialBackoff
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
from redis.sentinel import SentinelConnectionPool

from ..errors import DebounceBackendError, DebounceOutcomeUnknown
from ..gate import GateResult, gate_args, gate_keys, parse_reply
from ..layout import (
    HOT_KEYS_KEPT,
    LATE_BUCKETS_MS,
    active_key,
    as_text,
    claims_key,
    due_key,
    expiring_key,
    held_key,
    key_slot,
    layouts_key,
    leased_key,
    open_key,
    quarantine_key,
    run_key,
    stats_key,
    win_key,
)
from ..sentinel import redact
from ..settings import Settings, settings_for
from .bulk import UNKNOWN_OUTCOME, WRITTEN, BulkGate, Outcome, is_unknown_outcome
from .codec import (
    EXPIRY_GRACE_MS,
    Cancelled,
    CensusRow,
    ListStep,
    Shard,
    ShardCounts,
    ShardSnapshot,
    TakenEntry,
    TakenWindow,
    TakeResult,
    _taken,
)
from .errors import (
    CONNECTION_ERRORS,
    REDIS_ERROR,
    CancelOutcomeUnknown,
    _lost,
    _refused_by_a_replica,
    _translated,
    _unreadable_url,
    is_error_reply,
    is_outage,
    pipeline_failed_at,
    reply_code,
    translate_errors,
)
from .node import _NIL, _Combiner, _hiredis_pack, _Lease, _NotSent, _pack
from .operators import Operators
from .scripts import SCRIPT_NAMES, script_source
from .sentinel import master_switches, sentinel_client
from .server import (
    MIN_REDIS,
    _every_master_has_sharded_pubsub,
    _PooledCommands,
    read_server_version,
    server_supported,
)
from .wake import WakeListener

_logger = logging.getLogger("celery_debounce")

if TYPE_CHECKING:  # pragma: no cover
    from ..aliases import FixedId
    from ..call import PreparedCall

__all__ = [
    "CONNECTION_ERRORS", "EXPIRY_GRACE_MS", "MIN_REDIS", "REDIS_ERROR", "SCRIPT_NAMES",
    "UNKNOWN_OUTCOME", "WRITTEN", "CancelOutcomeUnknown", "Cancelled", "CensusRow",
    "ListStep", "Outcome", "Shard", "ShardCounts", "ShardSnapshot", "TakeResult",
    "TakenEntry", "TakenWindow", "WakeListener", "WindowStore", "as_text",
    "is_error_reply", "is_outage", "is_unknown_outcome", "pipeline_failed_at",
    "read_server_version", "reply_code", "script_source", "server_supported", "store_for",
    "translate_errors",
]

logger = logging.getLogger("celery_debounce.store")


# -- the store -------------------------------------------------------------------------------

#: Pools whose connections :meth:`WindowStore._evalsha` may use directly.
_DIRECT_POOLS = (redis.ConnectionPool, SentinelConnectionPool)


class WindowStore(BulkGate, Operators):
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

    # -- dispatchers -------------------------------------------------------------------------
    def take(self, shard: Shard, limit: int, observer: str = "") -> TakeResult:
        """Atomically take up to ``limit`` due windows (and expired leases) of ``shard``.

        ``take.lua`` is not idempotent (it leases what it returns), so it is sent once
        (:meth:`run_once`). With ``observer`` (the dispatcher's name), a pass that takes
        windows also records the name and time in ``<tag>:dispatchers`` and calls per
        ident in ``<tag>:hot``.
        """
        settings = self.settings
        tag = self.tag(shard)
        reply = self.run_once(
            "take",
            [due_key(tag), leased_key(tag), stats_key(tag)],
            [tag, limit, settings.dispatch_lease_ms, settings.record_ttl_ms,
             settings.history_ttl_ms, observer, HOT_KEYS_KEPT, *LATE_BUCKETS_MS],
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
        :data:`EXPIRY_GRACE_MS` ago; ``(task id, raw aliases)`` of each one finished,
        and of those finished earlier whose outcome :meth:`expired` has not confirmed."""
        tag = self.tag(shard)
        reply = self.run("expire", [expiring_key(tag), active_key(tag)],
                         [tag, EXPIRY_GRACE_MS, self.settings.history_ttl_ms, limit])
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
              retry: bool = False) -> tuple[str, bool]:
        """Claim a window's run for one claim lease: ``(state before ("" if the record
        is gone), run)``; ``run`` False: a duplicate delivery (finished, or claimed under
        a live lease), which must not run."""
        before, _, run = self.run_once("claim", self.record_keys(shard, task_id),
                                       self.claim_args(task_id, task_name, retry))
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
        """Mark a window finished with ``state``; the raw aliases it returns."""
        reply = self.run_once("finish", self.record_keys(shard, task_id),
                              self.finish_args(task_id, state))
        return list(reply[2:])


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
