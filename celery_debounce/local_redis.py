"""The old path of :mod:`celery_debounce.testing.servers` (throwaway redis-servers)."""

from .testing.servers import (
    SERVER_ENV,
    LocalRedis,
    LocalSentinels,
    find_redis_server,
    find_valkey_server,
    free_port,
    server_supports_tls,
)

__all__ = [
    "SERVER_ENV", "LocalRedis", "LocalSentinels", "find_redis_server", "find_valkey_server",
    "free_port", "server_supports_tls",
]
