"""The Redis connection that holds window state, and the Lua scripts run on it."""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import redis
from celery import Celery
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from .errors import DebounceBackendError
from .sentinel import master_client, switches
from .settings import Settings, settings_for

SCRIPT_NAMES = (
    "gate", "take", "ack", "release", "quarantine", "claim", "finish", "cancel", "flush",
    "list", "find", "census",
)


def as_text(value: Any) -> str:
    """A Redis reply field (bytes) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def script_source(name: str) -> str:
    lua = resources.files("celery_debounce").joinpath("lua")
    return lua.joinpath(f"{name}.lua").read_text("utf-8")

#: Pools whose connections :meth:`Backend._evalsha` may use directly.
_DIRECT_POOLS = (redis.ConnectionPool, SentinelConnectionPool)


class Backend:
    """One app's Redis client and registered scripts, for the current process.

    Scripts run with EVALSHA and are reloaded on NOSCRIPT.
    """

    _direct = False  # see __init__ and _evalsha
    _checkout_args: tuple[str, ...] = ()

    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        self.settings = settings
        timeout = settings.redis_timeout_s
        # One retry after a dropped connection. No health_check_interval: a dead
        # pooled connection already fails over to the retry, and redis-py 5
        # recursed in its health check when a TLS handshake failed.
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), 1)
        if client is None and settings.sentinel is not None:
            client = master_client(settings.sentinel, timeout, retry)
        self.client: redis.Redis = client or redis.Redis.from_url(
            settings.redis_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=retry,
        )
        self.scripts: dict[str, Script | AsyncScript] = {
            name: self.client.register_script(script_source(name)) for name in SCRIPT_NAMES
        }
        # The direct path below needs redis-py's own client and pool (not fakeredis,
        # a cluster or a single-connection client). Sentinel's pool qualifies: its
        # connections find the master when they connect, turn a demoted master's
        # READONLY into a ConnectionError (the command did not run: _evalsha sends it
        # again through the client's retry) and are dropped on release once the
        # master moved (docs/design.md, "Sentinel").
        self._direct = (
            type(self.client) is redis.Redis
            and type(self.client.connection_pool) in _DIRECT_POOLS
            and self.client.connection is None
        )
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

    @property
    def master_switches(self) -> int:
        """Master switches Sentinel announced since this client was built (0 without it)."""
        return switches(self.client.connection_pool)

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
        pool = self.client.connection_pool
        conn: Any = pool.get_connection(*self._checkout_args)
        try:
            conn.send_packed_command(conn.pack_command("EVALSHA", sha, numkeys, *keys_and_args))
            return conn.read_response()
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
