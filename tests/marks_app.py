"""The worker app of the mark-retry fault test: windows in one redis-server, broker and
run log in another, so runs go on while the windows' Redis restarts.

URLs from $MARKS_WINDOWS and $MARKS_BROKER (redis://host:port, no database)."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from celery_debounce import DebouncedTask


def build(windows: str, broker: str) -> Celery:
    app = Celery("marks_app", set_as_current=False)
    app.conf.update(
        broker_url=f"{broker}/1",
        task_ignore_result=True,
        debounce_redis_url=f"{windows}/0",
        debounce_poll_interval=0.2,
        debounce_redis_timeout=1,
        debounce_dispatch_lease=2,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=4,
        worker_hijack_root_logger=False,
    )

    @app.task(
        base=DebouncedTask,
        name="marks.work",
        bind=True,
        shared=False,
        debounce="50ms",
        debounce_key="{0}",
        debounce_max_wait="200ms",
    )
    def work(self: DebouncedTask, key: str, n: int = 0) -> str:
        """Log this run's id in the broker's Redis (never the windows' one), take 20 ms."""
        client = redis.Redis.from_url(f"{broker}/2")
        client.rpush("runs", self.request.id)
        client.close()
        time.sleep(0.02)
        return key

    return app


app = build(
    os.environ.get("MARKS_WINDOWS", "redis://127.0.0.1:1"),
    os.environ.get("MARKS_BROKER", "redis://127.0.0.1:1"),
)
