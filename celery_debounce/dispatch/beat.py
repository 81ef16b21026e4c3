"""Beat schedulers that also dispatch due debounce windows.

``celery -A proj beat -S celery_debounce.dispatch.beat:DebounceScheduler`` (or ``-S debounce``,
the ``celery.beat_schedulers`` entry point) runs the user's ordinary schedule,
stored like :class:`celery.beat.PersistentScheduler`, and publishes the windows
whose deadline passed.

Dispatching never holds up the schedule: each pass runs in a thread beside the
scheduler. A tick starts a pass (unless one is still running) and waits for it at
most until the next periodic task is due (and at most ``debounce_poll_interval``),
so a backlog of 20,000 flushed windows, or a debounce Redis that accepts
connections and never answers, delays no periodic task. When the pass finishes in
time, the tick returns the time until the next window deadline, so beat wakes
right when a window is due (never later than ``debounce_poll_interval``, since
beat's sleep cannot be woken by a new call, and never later than
``beat_max_loop_interval``).

With another scheduler class (redbeat, django-celery-beat), mix it in::

    from redbeat import RedBeatScheduler
    from celery_debounce.dispatch.beat import DebounceSchedulerMixin

    class RedBeatDebounceScheduler(DebounceSchedulerMixin, RedBeatScheduler):
        pass
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

from celery.beat import PersistentScheduler

from ..errors import DebounceError
from ..store.redis.checks import warn_if_evicting
from .dispatcher import Dispatcher

logger = logging.getLogger("celery_debounce.beat")

#: Shortest sleep returned, so a window that stays due (e.g. a failing publish) cannot spin beat.
MIN_INTERVAL = 0.01


class DispatchRunner:
    """Runs :meth:`Dispatcher.dispatch_once` in a daemon thread, one pass per :meth:`kick`."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stopped = False
        #: monotonic time of the next window deadline seen by the last pass (None: failed)
        self.next_at: float | None = None
        self.passes = 0
        self._thread = threading.Thread(target=self._loop, name="debounce-beat", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Start a pass unless one is running."""
        if self._idle.is_set():
            self._idle.clear()
            self._wake.set()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the running pass; True when none is running."""
        return self._idle.wait(max(0.0, timeout))

    def stop(self) -> None:
        self._stopped = True
        self.dispatcher.stop(timeout=0)  # a pass in hand stops after its batch
        self._wake.set()

    def _loop(self) -> None:
        warn_if_evicting(self.dispatcher.store, self.dispatcher.name, logger)
        failing = False
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stopped:
                return
            try:
                published, next_in_ms = self.dispatcher.dispatch_once()
                self.next_at = time.monotonic() + next_in_ms / 1000
                if failing:
                    logger.warning("debounce: beat dispatches windows again")
                failing = False
                if published:
                    logger.debug("debounce: beat dispatched %d window(s)", published)
            except Exception as exc:  # Redis down or hung, broker refusing: retried next tick
                self.next_at = None
                if not failing:
                    logger.warning("debounce: beat could not dispatch windows: %s", exc)
                failing = True
            finally:
                self.passes += 1
                self._idle.set()


class DebounceSchedulerMixin:
    """Adds window dispatch to any :class:`celery.beat.Scheduler` subclass (see module doc)."""

    app: Any
    max_interval: float
    _debounce_runner: DispatchRunner | None = None
    _debounce_broken: bool = False

    def tick(self, *args: Any, **kwargs: Any) -> float:
        interval = float(super().tick(*args, **kwargs))  # type: ignore[misc]
        runner = self._debounce_runner
        if runner is None:
            if self._debounce_broken:
                return interval
            try:
                runner = self._debounce_runner = DispatchRunner(Dispatcher(self.app, name="beat"))
            except DebounceError as exc:  # bad settings: keep the schedule running, say why
                logger.error("debounce: beat cannot dispatch windows: %s", exc)
                self._debounce_broken = True
                return interval
        started = time.monotonic()
        runner.kick()
        poll = runner.dispatcher.settings.poll_interval_ms / 1000
        # Wait for the pass only while no periodic task is due: it never delays one.
        if not runner.wait(min(interval, poll)):
            remaining = interval - (time.monotonic() - started)
            return max(MIN_INTERVAL, min(remaining, poll))  # still dispatching: check back
        now = time.monotonic()
        remaining = interval - (now - started)
        next_in = poll if runner.next_at is None else runner.next_at - now
        wake = min(remaining, next_in, poll, float(self.max_interval))
        return max(MIN_INTERVAL, wake) if math.isfinite(wake) else poll

    def close(self) -> None:
        if self._debounce_runner is not None:
            self._debounce_runner.stop()
            self._debounce_runner = None
        super().close()  # type: ignore[misc]


class DebounceScheduler(DebounceSchedulerMixin, PersistentScheduler):  # type: ignore[misc]
    """:class:`celery.beat.PersistentScheduler` that also dispatches debounce windows."""
