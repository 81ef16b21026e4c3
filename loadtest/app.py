"""The load test's Celery app: one debounced task that records each run in Redis."""

from __future__ import annotations

import os

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
    # shorter than the default 30 s so that run.py can wait past it for duplicates
    debounce_dispatch_lease=float(os.environ.get("LOAD_LEASE", "5")),
    task_ignore_result=True,
    worker_prefetch_multiplier=32,
    worker_hijack_root_logger=False,
)
_client: redis.Redis | None = None
_windows: redis.Redis | None = None


@app.task(
    base=DebouncedTask,
    name="load.touch",
    bind=True,
    debounce="200ms",
    debounce_key="k:{0}",
    debounce_max_wait="1s",
)
def touch(self: DebouncedTask, key: str, seq: int) -> None:
    """Record this run: how many times it ran, and its window's deadline, ceiling, taken,
    published and claimed times (Redis ms, read from its record while it runs; ``ca`` is
    set by the worker's ``task_prerun`` handler just before this body starts)."""
    global _client, _windows
    if _client is None or _windows is None:
        _client = redis.Redis.from_url(f"{REDIS}/3")
        _windows = redis.Redis.from_url(f"{REDIS}/0")
    dl, fs, mw, ta, pa, ca = _windows.hmget(
        f"debounce:{{0}}:win:{self.request.id}", "dl", "fs", "mw", "ta", "pa", "ca"
    )
    ceiling = b"%d" % (int(fs) + int(mw)) if fs and mw else None  # mw: max wait from fs
    times = (dl, ceiling, ta, pa, ca)
    pipe = _client.pipeline(transaction=False)
    pipe.hincrby("load:runs", self.request.id, 1)
    pipe.hsetnx("load:times", self.request.id, b",".join(t or b"0" for t in times))
    pipe.execute()
