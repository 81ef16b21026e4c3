"""The server's version (refused when older than :data:`MIN_REDIS`) and its features."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from ..checks import UNKNOWN
from ..layout import as_text
from .transport import CHECKOUT_ARGS

if TYPE_CHECKING:  # pragma: no cover
    from . import WindowStore
    from .transport import Transport


class _PooledCommands:
    """``execute_command``/``info`` of a store's (or a transport's) client, sent once on
    a pooled connection (no retry; a connection that failed is dropped)."""

    def __init__(self, store: WindowStore | Transport) -> None:
        self.store = store
        self.connection_pool = store.client.connection_pool

    def execute_command(self, *args: Any) -> Any:
        pool = self.connection_pool
        conn: Any = pool.get_connection(*CHECKOUT_ARGS)
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
