"""The load test's Celery app: one debounced task that records each run in Redis.

The windows live in Redis (``LOAD_REDIS``/0) or, with ``LOAD_STORE_URL``, in PostgreSQL;
the broker and the record of runs are Redis either way. Times are this machine's clock
in ms (the store's clock on one machine): ``load:published`` is written by
``after_task_publish`` in the dispatcher that published the window, ``load:claimed`` at
the start of the run's body.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import after_task_publish

from celery_debounce import DebouncedTask

REDIS = os.environ.get("LOAD_REDIS", "redis://127.0.0.1:6379")
STORE = os.environ.get("LOAD_STORE_URL")  # a postgresql:// URL, or None: Redis db 0

app = Celery("loadtest", set_as_current=False)
app.conf.update(
    broker_url=f"{REDIS}/1",
    debounce_history_ttl=float(os.environ.get("LOAD_HISTORY_TTL", "5")),
    debounce_poll_interval=0.5,
    # shorter than the default 30 s so that run.py can wait past it for duplicates
    debounce_dispatch_lease=float(os.environ.get("LOAD_LEASE", "5")),
    task_ignore_result=True,
    worker_prefetch_multiplier=32,
    worker_hijack_root_logger=False,
)
if STORE:
    app.conf.debounce_store_url = STORE
    app.conf.debounce_postgres_listen_url = os.environ.get("LOAD_LISTEN_URL") or None
else:
    app.conf.debounce_redis_url = f"{REDIS}/0"
_client: redis.Redis | None = None


def _runs() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(f"{REDIS}/3")
    return _client


def now_ms() -> int:
    return time.time_ns() // 1_000_000


_published: list[tuple[str, int]] = []
_writer: dict[str, object] = {"pid": None}


def _write_published() -> None:
    """Every 100 ms, the publish times noted since (one pipeline): a round trip per
    publish would slow the dispatcher under test."""
    while True:
        time.sleep(0.1)
        taken = _published[:]
        del _published[: len(taken)]
        if taken:
            pipe = _runs().pipeline(transaction=False)
            for task_id, at in taken:
                pipe.hsetnx("load:published", task_id, at)
            pipe.execute()


@after_task_publish.connect
def _note_publish(
    sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any
) -> None:
    """The window's message is with the broker: the first such time per window."""
    if sender == "load.touch" and headers:
        _published.append((headers["id"], now_ms()))
        if _writer["pid"] != os.getpid():
            _writer["pid"] = os.getpid()
            threading.Thread(target=_write_published, daemon=True).start()


@app.task(
    base=DebouncedTask,
    name="load.touch",
    bind=True,
    debounce="200ms",
    debounce_key="k:{0}",
    debounce_max_wait="1s",
)
def touch(self: DebouncedTask, key: str, seq: int) -> None:
    """Record this run: how many times its window ran, and when the first run started."""
    pipe = _runs().pipeline(transaction=False)
    pipe.hincrby("load:runs", self.request.id, 1)
    pipe.hsetnx("load:claimed", self.request.id, now_ms())
    pipe.execute()
