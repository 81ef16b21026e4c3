"""Celery-style signals for debounce events; connect like ``celery.signals``.

Every signal's ``sender`` is the task name, so ``window_dispatched.connect(f,
sender="app.tasks.report")`` listens to one task. Receivers get keyword
arguments (always accept ``**kwargs``). Sending with no receivers costs a
truth test, so unused signals are free on the hot path.

Where they fire:

* ``window_opened``, ``call_absorbed``: the producer process, right after the
  gate answered (``task_id, key, deadline, calls``; times are epoch seconds on
  the Redis clock).
* ``window_dispatched``, ``window_forced_by_max_wait``: the dispatcher process
  (worker, beat or ``celery debounce dispatch``); dispatched after publishing,
  forced once per window when it is first taken, as the stats count it
  (``task_id, key, calls, lateness`` in seconds; forced also gets ``max_wait_at``).
* ``window_closed_by_cap``: the dispatcher process, once per window its
  ``debounce_max_calls`` closed, when it is first taken (``task_id, key, calls,
  lateness``), as the stats count ``m|<task>``.
* ``leading_run``: the dispatcher process, once per leading run
  (``debounce_leading=True``), when it is first taken (``task_id, key, calls,
  lateness``), as the stats count ``e|<task>``.
* ``call_suppressed``: the producer process, for a call that a quiet period of
  ``debounce_leading=True, debounce_trailing=False`` suppressed (``task_id`` of the
  leading run it was folded into, ``key, deadline`` (the quiet period's end), ``calls``
  (the quiet period's, leading call included)), as the stats count ``s|<task>``.
* ``window_cancelled``: the process that cancelled it (``task_id, key, calls``).
* ``duplicate_skipped``: the worker process that got a duplicate delivery of a window
  (finished, or running under a live claim) and skipped it before the task's code
  (``task_id, state``: the window's state, ``finished`` or ``claimed``), as the stats
  count ``d|<task>``.
* ``window_held``: the dispatcher process, once per ``debounce_exclusive`` window that
  was held while a run of its key was in progress, when it is taken after that run
  (``task_id, key, calls, lateness, held`` in seconds), as the stats count ``h|<task>``
  and ``hm|<task>``.

Single calls (``.delay()``/``apply_async``, not ``enqueue_many``) also pass
``latency``: seconds from before the gate's round trip to its reply (measured
only when someone listens).

Errors, sent only if someone listens:

* ``call_failed``: the producer process, for a call the gate could not take
  (``key, error`` (the exception's class name: ``DebounceBackendError``,
  ``DebounceOutcomeUnknown``, ``DebounceBreakerOpen``), ``latency``); the call raised
  that exception, or, under ``debounce_on_outage="publish"``, fell back.
* ``outage_fallback``: the producer process, for a call published plainly (no window)
  because the windows' Redis could not take it (``debounce_on_outage="publish"``):
  ``task_id`` (the published message's), ``key``, ``reason`` (``"unreachable"``:
  nothing reached Redis; ``"unknown"``: the gate may have run, the work may run twice;
  ``"refused"``: an error reply such as OOM, READONLY or LOADING; ``"breaker"``: the
  call skipped Redis, the breaker being open), ``error`` (the exception's class name).
* ``publish_failed``: the dispatcher process, per window a pass took but could not
  publish (``task_id, key, kind, reason``): ``kind`` is ``"message"`` (counted
  against the window), ``"broker"`` (the broker as a whole failed; not counted),
  ``"uncertain"`` (a batch the broker answered in part) or ``"suspect"`` (refused,
  and nothing else got through in that pass).
* ``publish_refused``: the dispatcher process, per message an AMQP broker nacked
  (``task_id, key``); the window is retried (the metrics count it as a publish
  failure of kind ``nack``).
* ``window_quarantined``: the dispatcher process, per window set aside (``task_id,
  key, kind, reason``): ``kind`` is ``"message"`` (its message cannot be built),
  ``"publish_failed"`` (``MAX_TRIES`` failed publishes) or ``"record"`` (its record
  cannot be read; ``sender`` is ``"?"`` and ``key`` ``""``).
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "call_absorbed",
    "call_failed",
    "call_suppressed",
    "duplicate_skipped",
    "leading_run",
    "max_wait_exceeded",
    "outage_fallback",
    "publish_failed",
    "publish_refused",
    "window_cancelled",
    "window_closed_by_cap",
    "window_dispatched",
    "window_forced_by_max_wait",
    "window_held",
    "window_opened",
    "window_quarantined",
]

window_opened = Signal(name="window_opened", providing_args={"task_id", "key", "deadline", "calls"})
call_absorbed = Signal(name="call_absorbed", providing_args={"task_id", "key", "deadline", "calls"})
window_dispatched = Signal(
    name="window_dispatched", providing_args={"task_id", "key", "calls", "lateness"}
)
window_forced_by_max_wait = Signal(
    name="window_forced_by_max_wait",
    providing_args={"task_id", "key", "calls", "lateness", "max_wait_at"},
)
window_closed_by_cap = Signal(
    name="window_closed_by_cap", providing_args={"task_id", "key", "calls", "lateness"}
)
window_cancelled = Signal(name="window_cancelled", providing_args={"task_id", "key", "calls"})
leading_run = Signal(name="leading_run", providing_args={"task_id", "key", "calls", "lateness"})
call_suppressed = Signal(
    name="call_suppressed", providing_args={"task_id", "key", "deadline", "calls"}
)
duplicate_skipped = Signal(name="duplicate_skipped", providing_args={"task_id", "state"})
window_held = Signal(
    name="window_held", providing_args={"task_id", "key", "calls", "lateness", "held"}
)
call_failed = Signal(name="call_failed", providing_args={"key", "error", "latency"})
outage_fallback = Signal(
    name="outage_fallback", providing_args={"task_id", "key", "reason", "error"}
)
publish_failed = Signal(name="publish_failed", providing_args={"task_id", "key", "kind", "reason"})
publish_refused = Signal(name="publish_refused", providing_args={"task_id", "key"})
window_quarantined = Signal(
    name="window_quarantined", providing_args={"task_id", "key", "kind", "reason"}
)
#: A worker, when a window's run starts later than its ceiling (first call + max wait)
#: plus ``ceiling.MAX_WAIT_TOLERANCE_S`` (``late``: seconds past the ceiling,
#: Redis time). Sent only while something is connected to it.
max_wait_exceeded = Signal(name="max_wait_exceeded", providing_args={"task_id", "late"})
