"""Beat schedulers that also dispatch due debounce windows.

``celery -A proj beat -S celery_debounce.beat:DebounceScheduler`` (or ``-S debounce``,
the ``celery.beat_schedulers`` entry point) runs the user's ordinary schedule,
stored like :class:`celery.beat.PersistentScheduler`, and on every tick publishes
the windows whose deadline passed. The tick returns the time until the next
deadline, so beat wakes right when a window is due (never later than
``debounce_poll_interval``, since beat's sleep cannot be woken by a new call,
and never later than ``beat_max_loop_interval``).

With another scheduler class (redbeat, django-celery-beat), mix it in::

    from redbeat import RedBeatScheduler
    from celery_debounce.beat import DebounceSchedulerMixin

    class RedBeatDebounceScheduler(DebounceSchedulerMixin, RedBeatScheduler):
        pass
"""

from __future__ import annotations

import logging
from typing import Any

from celery.beat import PersistentScheduler

from .dispatcher import Dispatcher
from .errors import DebounceError

logger = logging.getLogger("celery_debounce.beat")

#: Shortest sleep returned, so a window that stays due (e.g. a failing publish) cannot spin beat.
MIN_INTERVAL = 0.01


class DebounceSchedulerMixin:
    """Adds window dispatch to any :class:`celery.beat.Scheduler` subclass's ``tick``."""

    app: Any
    max_interval: float
    _debounce_dispatcher: Dispatcher | None = None

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval = float(super().tick(*args, **kwargs))  # type: ignore[misc]
        try:
            if self._debounce_dispatcher is None:
                self._debounce_dispatcher = Dispatcher(self.app, name="beat")
            published, next_in_ms = self._debounce_dispatcher.dispatch_once()
        except DebounceError as exc:
            logger.warning("debounce: beat could not dispatch windows: %s", exc)
            return min(interval, 1.0)
        if published:
            logger.debug("debounce: beat dispatched %d window(s)", published)
        return max(MIN_INTERVAL, min(interval, next_in_ms / 1000, float(self.max_interval)))


class DebounceScheduler(DebounceSchedulerMixin, PersistentScheduler):  # type: ignore[misc]
    """:class:`celery.beat.PersistentScheduler` that also dispatches debounce windows."""
