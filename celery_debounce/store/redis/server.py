"""The server's version (refused when older than :data:`MIN_REDIS`: :class:`ServerCheck`)
and its ``maxmemory-policy``."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import RedisClusterException

from ...errors import DebounceBackendError
from ..records import as_text
from .checks import UNKNOWN
from .translate import _translated, unreachable
from .transport import checkout

if TYPE_CHECKING:  # pragma: no cover
    from ...settings import Settings
    from .. import WindowStore
    from .transport import Transport

_logger = logging.getLogger("celery_debounce.store")


class _PooledCommands:
    """``execute_command``/``info`` of a store's (or a transport's) client, sent once on
    a pooled connection (no retry; a connection that failed is dropped)."""

    def __init__(self, store: WindowStore | Transport) -> None:
        self.store = store
        self.connection_pool = store.client.connection_pool

    def execute_command(self, *args: Any) -> Any:
        pool = self.connection_pool
        conn: Any = checkout(pool)
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


class ServerCheck:
    """:meth:`check_server`, a part of :class:`~celery_debounce.store.WindowStore`."""

    #: The server's version was read and is supported (or cannot be read: see
    #: :meth:`check_server`); :func:`store_for` checks until it is.
    server_checked = False
    _check_after = 0.0
    _refusal: DebounceBackendError | None = None

    settings: Settings
    transport: Transport

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
                raise unreachable(f"debounce Redis unreachable: {exc}", exc) from exc
            return
        except redis.RedisError as exc:
            _logger.debug("debounce: could not read the Redis version: %r", exc)
            found = []
        old = [
            (where, server, version)
            for where, server, version in found
            if not server_supported(server, version)
        ]
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
        found = []
        for where, client in self.transport.servers():
            got = read_server_version(client)
            if got is not None:
                found.append((where, *got))
        return found


def maxmemory_policy(client: Any) -> str:
    """The server's ``maxmemory-policy``, or ``"unknown"`` if it cannot be read.

    ``CONFIG GET`` is often refused to a least-privilege ACL user or by managed
    services; that is never an error here.
    """
    try:
        reply = client.config_get("maxmemory-policy")
    except Exception:  # NOPERM, unknown command, outage: say unknown, never fail
        return UNKNOWN
    value = reply.get("maxmemory-policy", reply.get(b"maxmemory-policy")) if reply else None
    if value is None:
        return UNKNOWN
    return value.decode() if isinstance(value, bytes) else str(value)
