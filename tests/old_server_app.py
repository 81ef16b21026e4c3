"""A worker app whose windows' Redis reads as Redis 6.0.16
(tests/store/redis/test_server_version.py).

No server older than 6.2 installs here, so the version read is replaced; everything
else talks to the real server named by $OLD_SERVER_REDIS (windows DB 0, broker DB 1).
"""

from __future__ import annotations

import os

from celery import Celery

import celery_debounce.store.redis.server
from celery_debounce import DebouncedTask

celery_debounce.store.redis.server.read_server_version = lambda client: ("redis", "6.0.16")

redis_url = os.environ.get("OLD_SERVER_REDIS", "redis://127.0.0.1:6379")
app = Celery("old_server_app", set_as_current=False)
app.conf.update(
    broker_url=f"{redis_url}/1",
    task_ignore_result=True,
    debounce_redis_url=f"{redis_url}/0",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(base=DebouncedTask, debounce="1s", debounce_max_wait="5s")
def work() -> None:
    pass
