"""The Redis connection that holds window state, and the Lua scripts run on it."""

from __future__ import annotations

import inspect
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import redis
from celery import Celery
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript, Script
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry

from .errors import DebounceBackendError
from .settings import Settings, settings_for

logger = logging.getLogger("celery_debounce.backend")

SCRIPT_NAMES = (
    "gate", "take", "ack", "release", "quarantine", "claim", "finish", "cancel", "flush",
    "list", "find", "census",
)


def as_text(value: Any) -> str:
    """A Redis reply field (bytes) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


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


#: Errors of a cluster node that mean "this command did not run here": the direct
#: cluster path hands the command to redis-py's cluster client, which follows them.
_REDIRECTS = (MovedError, AskError, TryAgainError, ClusterDownError, SlotNotCoveredError)


class Backend:
    """One app's Redis client and registered scripts, for the current process.

    Scripts run with EVALSHA and are reloaded on NOSCRIPT.
    """

    _direct = False  # see __init__ and _evalsha
    _checkout_args: tuple[str, ...] = ()

    #: A Redis Cluster client (``debounce_redis_cluster``): commands go to the node of
    #: their key's slot, wake-ups use sharded pub/sub where every master has it.
    cluster = False
    #: Scripts publish wake-ups with SPUBLISH to ``<tag>:wake`` (one per shard).
    sharded_wake = False

    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        self.settings = settings
        timeout = settings.redis_timeout_s
        options: dict[str, Any] = dict(  # the same for a single node and a cluster
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # One retry after a dropped connection. No health_check_interval: a
            # dead pooled connection already fails over to the retry, and redis-py 5
            # recursed in its health check when a TLS handshake failed.
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1),
        )
        if client is None and settings.redis_cluster:
            # reads the topology now (a single-node client connects on first use)
            try:
                client = redis.RedisCluster.from_url(  # type: ignore[assignment]
                    settings.redis_url, **options)
            except (redis.RedisError, RedisClusterException) as exc:
                raise DebounceBackendError(
                    f"debounce Redis Cluster unreachable at {_safe_url(settings.redis_url)}: "
                    f"{exc}") from exc
        self.client: redis.Redis = client or redis.Redis.from_url(settings.redis_url, **options)
        self.cluster = isinstance(self.client, redis.RedisCluster)
        if self.cluster:
            self.sharded_wake = _every_master_has_sharded_pubsub(self.client)
        self.scripts: dict[str, Script | AsyncScript] = {
            name: self.client.register_script(script_source(name, self.sharded_wake))
            for name in SCRIPT_NAMES
        }
        # The direct path below needs redis-py's own client and pool (not fakeredis,
        # or a single-connection client); on a cluster, the pool of the key's node.
        self._direct = self.cluster or (
            type(self.client) is redis.Redis
            and type(self.client.connection_pool) is redis.ConnectionPool
            and self.client.connection is None
        )
        if settings.wait_replicas:
            self.run_gate = self._run_gate_waited  # type: ignore[method-assign]
        # redis-py < 5.3 requires a command name here; later versions warn if given one
        name = inspect.signature(redis.ConnectionPool.get_connection).parameters.get(
            "command_name"
        )
        self._checkout_args: tuple[str, ...] = (
            ("EVALSHA",) if name is not None and name.default is inspect.Parameter.empty else ()
        )

    @property
    def direct(self) -> bool:
        """True when commands may be sent on pooled connections directly (see _evalsha)."""
        return self._direct

    def pool_for(self, key: str) -> Any:
        """The connection pool serving ``key``: the client's, or on a cluster the pool
        of the master that redis-py's slot table names for the key's slot."""
        if not self.cluster:
            return self.client.connection_pool
        client: Any = self.client
        # redis-py's slot table read without its lock (the hot path): a dict and a list
        # read, each atomic; a stale entry is answered with MOVED, which is followed
        nodes = client.nodes_manager.slots_cache.get(key_slot(key.encode()))
        if not nodes:
            node = client.nodes_manager.get_node_from_slot(key_slot(key.encode()))  # raises
        else:
            node = nodes[0]
        return (node.redis_connection or client.get_redis_connection(node)).connection_pool

    def run_gate(self, keys: list[str], args: list[Any]) -> Any:
        """``gate.lua`` (with ``debounce_redis_wait_replicas``: followed by WAIT)."""
        return self.run("gate", keys, args)

    def _run_gate_waited(self, keys: list[str], args: list[Any]) -> Any:
        """``gate.lua`` then ``WAIT n timeout`` on the same connection, in one write.

        Fewer acknowledgements than ``n`` (within ``debounce_redis_timeout``) raise
        :class:`DebounceBackendError`: the call was written on the master but may not
        survive a failover. A redirection (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) or a
        refused connection before anything was sent is retried on the current
        master; a connection lost after the command was sent is an error (the call
        may or may not be recorded).
        """
        wanted = self.settings.wait_replicas
        wait_ms = self.settings.wait_replicas_ms
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", self.scripts["gate"].sha, len(keys), *keys, *args),
            ("WAIT", wanted, wait_ms),
        ]
        with translate_errors("gate"):
            reply, acks = self.send_on_node(keys[0], commands, "gate")
            if isinstance(acks, redis.RedisError):
                raise acks
        if int(acks) < wanted:
            raise DebounceBackendError(
                f"debounce_redis_wait_replicas={wanted}: only {int(acks)} replica(s) "
                f"acknowledged the call within {wait_ms} ms; it was written on the master "
                "but may not survive a failover"
            )
        return reply

    def send_on_node(
        self, key: str, commands: list[tuple[Any, ...]], script: str = "",
    ) -> list[Any]:
        """Send ``commands`` (the first an EVALSHA of ``script`` when given) in one write
        on one connection of the node serving ``key``; return their replies.

        Safe to resend only while nothing ran: a redirection of the first command
        (the node does not serve the slot), NOSCRIPT, or a connection refused. A
        connection lost after sending raises (nothing is sent twice). At most a few
        attempts, bounded by the Redis timeout.
        """
        asking: tuple[str, int] | None = None
        deadline = None
        for attempt in range(8):
            if asking is not None:
                pool = self.client.get_redis_connection(  # type: ignore[attr-defined]
                    self.client.get_node(*asking)  # type: ignore[attr-defined]
                ).connection_pool
            else:
                pool = self.pool_for(key)
            conn: Any = pool.get_connection(*self._checkout_args)
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
                for _ in wire:
                    try:
                        replies.append(conn.read_response())
                    except redis.ResponseError as exc:
                        replies.append(exc)
                    except BaseException:
                        conn.disconnect()  # the replies may still come: never reuse
                        self.refresh_topology()
                        raise
            finally:
                pool.release(conn)
            if asking is not None:
                replies = replies[1:]
            asking = None
            error = next((r for r in replies if isinstance(r, Exception)), None)
            if error is None:
                return replies
            # A redirection anywhere means nothing ran: the command itself was refused,
            # or (MULTI) a queued one was and EXEC aborted.
            if isinstance(error, MovedError):
                manager: Any = self.client.nodes_manager  # type: ignore[attr-defined]
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
            return replies  # errors of later commands: the caller reads them
        raise DebounceBackendError("debounce Redis: too many redirections")

    def refresh_topology(self) -> None:
        """On a cluster, read the slot table again (a failover or resharding)."""
        if not self.cluster:
            return
        try:
            self.client.nodes_manager.initialize()  # type: ignore[attr-defined]
        except Exception as exc:  # no node answers: the caller's error says so
            logger.debug("debounce: cluster topology refresh failed: %r", exc)

    def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self.scripts[name]
        evalsha = self._evalsha if self._direct else self.client.evalsha
        try:  # plain try rather than translate_errors: this is every call's hot path
            try:
                return evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:  # server restarted or SCRIPT FLUSH: load and run again
                script.sha = self.client.script_load(script.script)
                return evalsha(script.sha, len(keys), *keys, *args)
        except redis.RedisError as exc:
            raise _translated(name, exc) from exc

    def _evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """``EVALSHA`` on a pooled connection, without redis-py's per-command wrapper.

        That wrapper (retry closure, operation metrics) costs about a fifth of a
        hot call. A connection error (say a pooled connection the server closed)
        hands the command to ``client.evalsha`` and its retry policy; a timeout
        is raised at once; an error reply (NOSCRIPT, a script error) leaves the
        connection usable.
        """
        pool = self.pool_for(keys_and_args[0]) if self.cluster else self.client.connection_pool
        conn: Any = pool.get_connection(*self._checkout_args)
        try:
            conn.send_packed_command(conn.pack_command("EVALSHA", sha, numkeys, *keys_and_args))
            return conn.read_response()
        except _REDIRECTS:  # not run on this node: the cluster client follows the redirection
            pool.release(conn)
            conn = None
            return self.client.evalsha(sha, numkeys, *keys_and_args)
        except redis.ResponseError:
            raise
        except redis.ConnectionError:
            conn.disconnect()
            pool.release(conn)
            conn = None
            return self.client.evalsha(sha, numkeys, *keys_and_args)
        except BaseException:  # timeout, interrupt: the reply may still come, drop it
            conn.disconnect()
            raise
        finally:
            if conn is not None:
                pool.release(conn)


def _safe_url(url: str) -> str:
    """``url`` without its password."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


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


def backend_for(app: Celery) -> Backend:
    """The app's backend in this process (a forked child builds its own)."""
    pid = os.getpid()
    cached: tuple[int, Backend] | None = getattr(app, "_debounce_backend", None)
    if cached is not None and cached[0] == pid:
        return cached[1]
    with _lock:
        cached = getattr(app, "_debounce_backend", None)
        if cached is None or cached[0] != pid:
            cached = (pid, Backend(settings_for(app)))
            app._debounce_backend = cached  # type: ignore[attr-defined, unused-ignore]
    return cached[1]


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
    return DebounceBackendError(f"debounce Redis refused {operation}: {exc}")
