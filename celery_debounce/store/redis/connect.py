"""The store's client and transport, chosen once from the settings."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from ...redact import redact
from ...settings import Settings
from .cluster import ClusterTransport
from .node import NodeTransport, is_direct_node
from .sentinel import sentinel_client
from .translate import _unreadable_url, unreachable
from .transport import Transport


def connect(settings: Settings) -> Any:
    """A client of the windows' Redis: Sentinel's master, a cluster, or one node."""
    timeout = settings.redis_timeout_s
    # One retry after a dropped or refused connection, never after a timeout: a
    # server that does not answer would cost every command (and the handshake of
    # every new connection) two timeouts instead of one. No health_check_interval: a
    # dead pooled connection already fails over to the retry, and redis-py 5
    # recursed in its health check when a TLS handshake failed.
    retry = Retry(
        ExponentialBackoff(cap=0.5, base=0.05), 1, supported_errors=(redis.ConnectionError,)
    )
    if settings.sentinel is not None:
        return sentinel_client(settings.sentinel, timeout, retry)
    options: dict[str, Any] = dict(  # the same for a single node and a cluster
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=retry,
    )
    if settings.redis_cluster:
        # reads the topology now (a single-node client connects on first use)
        try:
            return redis.RedisCluster.from_url(settings.redis_url, **options)
        except (redis.RedisError, RedisClusterException) as exc:
            raise unreachable(
                redact(f"debounce Redis Cluster unreachable at {settings.redis_url}: {exc}"), exc
            ) from exc
        except ValueError:
            raise _unreadable_url(settings.redis_url) from None
    try:
        return redis.Redis.from_url(settings.redis_url, **options)
    except ValueError:
        raise _unreadable_url(settings.redis_url) from None


def transport_for(settings: Settings, client: Any = None) -> Transport:
    """The transport of ``client`` (built from the settings when None)."""
    if client is None:
        client = connect(settings)
    if isinstance(client, redis.RedisCluster):
        return ClusterTransport(client, settings)
    if is_direct_node(client):
        return NodeTransport(client, settings)
    return Transport(client, settings)
