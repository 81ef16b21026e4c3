"""A worker app whose runs are killed mid-run without ``acks_late``
(tests/store/redis/test_bounded_keys.py).

The prefork child running ``killed.die`` exits at once: Celery acked the message
before the run, nothing redelivers it, and ``task_postrun`` never fires. The worker's
main process finishes the window FAILURE (``WorkerLostError``); whatever is left goes
with ``debounce_history_ttl`` / ``debounce_record_ttl`` (1 s / 3 s here).
Configured from $KILLED_REDIS (windows DB 0, broker DB 1).
"""

from __future__ import annotations

import os

from celery import Celery

from celery_debounce import DebouncedTask

redis_url = os.environ.get("KILLED_REDIS", "redis://127.0.0.1:6379")
app = Celery("killed_app", set_as_current=False)
app.conf.update(
    broker_url=f"{redis_url}/1",
    task_ignore_result=True,
    debounce_redis_url=f"{redis_url}/0",
    debounce_poll_interval=0.2,
    debounce_dispatch_lease=0.5,
    debounce_record_ttl=3,  # at least 4 leases (settings rule)
    debounce_claim_lease=1,  # the killed run's claim lapses (and leaves :claims) within the TTL
    debounce_history_ttl=1,
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    task_acks_late=False,
    worker_hijack_root_logger=False,
)


@app.task(
    base=DebouncedTask,
    name="killed.die",
    shared=False,
    debounce="100ms",
    debounce_key="k:{0}",
    debounce_max_wait="1s",
)
def die(key: str) -> None:
    os._exit(1)  # the worker child is killed mid-run
