"""The max-wait ceiling measured where a window's run starts (``worker/receivers.py``,
``_claim``): a run later than its window's ceiling + :data:`MAX_WAIT_TOLERANCE_S`
sends ``max_wait_exceeded`` (the metrics' ``max_wait_violations_total``). The store
measures it (:meth:`WorkerStore.ceiling_lateness_ms
<celery_debounce.store.api.WorkerStore.ceiling_lateness_ms>`: first call + max wait,
or for a ``debounce_exclusive`` window held behind a run, that run's end if later)."""

from __future__ import annotations

import logging

from ..signals import max_wait_exceeded
from ..store.api import WorkerStore
from ..store.domain import ShardRef

logger = logging.getLogger("celery_debounce.worker")

#: A run that starts more than this after its window's ceiling (first call + max wait)
#: sends ``max_wait_exceeded`` (the dispatcher's poll, the broker and the pool's queue
#: stay within it on a healthy deployment).
MAX_WAIT_TOLERANCE_S = 5.0


def check_ceiling(store: WorkerStore, shard: ShardRef, task_name: str, task_id: str) -> None:
    """Measure when the run starts against its ceiling (on the Redis store one HMGET
    and TIME), made only while something listens (callers check
    ``max_wait_exceeded.receivers``)."""
    try:
        late_ms = store.ceiling_lateness_ms(shard, task_id)
    except Exception as exc:  # a measure, never a reason to fail the run
        logger.debug("debounce: %s[%s]: no ceiling measure (%s)", task_name, task_id, exc)
        return
    if late_ms is not None and late_ms > MAX_WAIT_TOLERANCE_S * 1000:
        max_wait_exceeded.send(sender=task_name, task_id=task_id, late=late_ms / 1000)
