"""The old path of :mod:`celery_debounce.testing.cluster` (a throwaway Redis Cluster)."""

from .testing.cluster import LocalCluster, redis_cli

__all__ = ["LocalCluster", "redis_cli"]
