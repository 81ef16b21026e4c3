"""The max-wait ceiling measured where a window's run starts (``worker_signals._claim``):
a run later than its first call + max wait + :data:`MAX_WAIT_TOLERANCE_S` sends
``max_wait_exceeded`` (the metrics' ``max_wait_violations_total``)."""

from __future__ import annotations

import logging

from ..layout import F_DEADLINE, F_FIRST_SEEN, F_MAX_WAIT, F_OPTIONS, as_text, win_key
from ..signals import max_wait_exceeded
from ..store import WindowStore
from ..store.codec import Shard
from ..store.errors import translate_errors

logger = logging.getLogger("celery_debounce.worker")

#: A run that starts more than this after its window's ceiling (first call + max wait)
#: sends ``max_wait_exceeded`` (the dispatcher's poll, the broker and the pool's queue
#: stay within it on a healthy deployment).
MAX_WAIT_TOLERANCE_S = 5.0


#: The header a debounce_exclusive window's stored options carry (take.lua looks for it).
_EXCLUSIVE = '"debounce_exclusive"'


def lateness_ms(store: WindowStore, shard: Shard, task_id: str) -> int | None:
    """How many ms past its ceiling window ``task_id``'s run starts now (Redis time;
    None for a record without one). The ceiling is first call + max wait; for a
    ``debounce_exclusive`` window, or that end of the run it was held behind, whichever
    is later (docs/configuration.md): its deadline when taken (``dl``), which a hold's
    end sets to that moment."""
    with translate_errors("claim"):
        first_seen, max_wait, deadline, options = store.client.hmget(
            win_key(store.tag(shard), task_id), F_FIRST_SEEN, F_MAX_WAIT, F_DEADLINE, F_OPTIONS
        )
    if first_seen is None or max_wait is None:
        return None
    ceiling = int(first_seen) + int(max_wait)
    if deadline is not None and options is not None and _EXCLUSIVE in as_text(options):
        ceiling = max(ceiling, int(deadline))  # held behind a run until then
    return store.time_ms("claim") - ceiling


def check_ceiling(store: WindowStore, shard: Shard, task_name: str, task_id: str) -> None:
    """Measure when the run starts against its ceiling: one HMGET and TIME, made only
    while something listens (callers check ``max_wait_exceeded.receivers``)."""
    try:
        late_ms = lateness_ms(store, shard, task_id)
    except Exception as exc:  # a measure, never a reason to fail the run
        logger.debug("debounce: %s[%s]: no ceiling measure (%s)", task_name, task_id, exc)
        return
    if late_ms is not None and late_ms > MAX_WAIT_TOLERANCE_S * 1000:
        max_wait_exceeded.send(sender=task_name, task_id=task_id, late=late_ms / 1000)
