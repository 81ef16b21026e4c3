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
_windows: redis.Redis | None = None


@app.task(base=DebouncedTask, name="load.touch", bind=True, debounce="200ms",
          debounce_key="k:{0}", debounce_max_wait="1s")
def touch(self: DebouncedTask, key: str, seq: int) -> None:
    """Record this run: run count, start time (ms) and the window's deadline, ceiling,
    taken and published times (Redis ms, read from its record while it runs)."""
    global _client, _windows
    start_ms = time.time() * 1000
    if _client is None or _windows is None:
        _client = redis.Redis.from_url(f"{REDIS}/3")
        _windows = redis.Redis.from_url(f"{REDIS}/0")
    dl, fs, mw, ta, pa = _windows.hmget(f"debounce:{{0}}:win:{self.request.id}",
                                        "dl", "fs", "mw", "ta", "pa")
    ceiling = b"%d" % (int(fs) + int(mw)) if fs and mw else None  # mw: max wait from fs
    times = (dl, ceiling, ta, pa)
    pipe = _client.pipeline(transaction=False)
    pipe.hincrby("load:runs", self.request.id, 1)
    pipe.hsetnx("load:start", self.request.id, f"{start_ms:.3f}")
    pipe.hsetnx("load:times", self.request.id, b",".join(t or b"0" for t in times))
    pipe.execute()
