"""Log lines held while a full-screen view is live (``top``): a line printed on the
terminal would be drawn over and stay there until the next full redraw.

While :func:`held_logs` is active, the lines of the package's loggers and of psycopg's
(the PostgreSQL store's driver and pool) are kept instead of propagating to the
handlers; the view shows the last one, and they are printed once the screen is gone.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["HELD_LOGGERS", "held_logs"]

#: The loggers whose lines are held.
HELD_LOGGERS = ("celery_debounce", "psycopg")
#: The most lines kept (the oldest go first).
KEPT = 50


class _Keep(logging.Handler):
    def __init__(self, into: deque[str]) -> None:
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(f"{record.levelname} {record.name}: {record.getMessage()}")


@contextmanager
def held_logs() -> Iterator[deque[str]]:
    """Hold the lines of :data:`HELD_LOGGERS` (WARNING and above; lower ones are
    dropped) in the deque it yields, restored at exit."""
    kept: deque[str] = deque(maxlen=KEPT)
    handler = _Keep(kept)
    saved = []
    for name in HELD_LOGGERS:
        log = logging.getLogger(name)
        saved.append((log, log.propagate))
        log.addHandler(handler)
        log.propagate = False
    try:
        yield kept
    finally:
        for log, propagate in saved:
            log.removeHandler(handler)
            log.propagate = propagate
