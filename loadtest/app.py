"""The load test's Celery app: one debounced task that records each run in Redis."""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

from celery_debounce import DebouncedTask

REDIS = os.environ.get("LOAD_REDIS", "redis://127.0.0.1:6379")

app = Celery("loadtest", set_as_current=False)
app.conf.update(
    broker_url=f"{REDIS}/1",
    debounce_redis_url=f"{REDIS}/0",
    debounce_history_ttl=float(os.environ.get("LOAD_HISTORY_TTL", "5")),
    debounce_poll_interval=0.5,
    task_ignore_result=True,
    worker_prefetch_multiplier=32,
    worker_hijack_root_logger=False,
)
_client: redis.Redis | None = None


@app.task(base=DebouncedTask, name="load.touch", bind=True, debounce="200ms",
          debounce_key="k:{0}", debounce_max_wait="1s")
def touch(self: DebouncedTask, key: str, seq: int) -> None:
    """Record this run: run count and first start time (ms) per window id."""
    global _client
    start_ms = time.time() * 1000
    if _client is None:
        _client = redis.Redis.from_url(f"{REDIS}/3")
    pipe = _client.pipeline(transaction=False)
    pipe.hincrby("load:runs", self.request.id, 1)
    pipe.hsetnx("load:start", self.request.id, f"{start_ms:.3f}")
    pipe.execute()
