"""The connection pool's log lines about the store's own pool, through the package's
logger and rate-limited.

psycopg_pool warns on every failed connection attempt, from its own threads, under the
``psycopg.pool`` logger: during an outage a producer's stderr fills with them, long
after the store raised its own error. Each of those about this package's pool (named
:data:`POOL_NAME`, or one of its connections) is logged instead under
``celery_debounce.store.postgres``, at most once per :data:`EVERY_S` per kind of line,
with how many were held back. Another application's pools are left alone.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["EVERY_S", "POOL_NAME", "route_pool_logs"]

#: The name of the store's pools (psycopg_pool's ``name``): it appears in their lines.
POOL_NAME = "celery-debounce"
#: The connection class of the store's pools (link.py): it appears in their lines too.
CONNECTION_NAME = "RecordedConnection"
#: The shortest time between two lines of the same kind (seconds).
EVERY_S = 30.0

logger = logging.getLogger("celery_debounce.store.postgres")


class _Routed(logging.Filter):
    """Keeps the pool's lines about this package's pool off ``psycopg.pool``: each kind
    (its format string) is logged under :data:`logger` at most once per
    :data:`EVERY_S`."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if POOL_NAME not in text and CONNECTION_NAME not in text:
            return True  # another application's pool
        kind = str(record.msg)
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(kind, -EVERY_S) < EVERY_S:
                self._held[kind] = self._held.get(kind, 0) + 1
                return False
            self._last[kind] = now
            held = self._held.pop(kind, 0)
        more = f" ({held} more like it in the last {EVERY_S:g}s)" if held else ""
        logger.log(record.levelno, "PostgreSQL store's pool: %s%s", text, more)
        return False


_routed = _Routed()


def route_pool_logs() -> None:
    """Route the pool's lines about this package's pools (idempotent)."""
    pool_logger = logging.getLogger("psycopg.pool")
    if _routed not in pool_logger.filters:
        pool_logger.addFilter(_routed)
