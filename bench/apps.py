"""The Celery app the benchmarks use (also loaded by worker subprocesses: ``-A bench.apps``).

Windows live in DB 0, the broker in DB 1, measurements in DB 3. No result
backend, so plain and debounced calls pay for the same things.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from typing import Any

import redis
from celery import Celery

from celery_debounce import DebouncedTask


def make_app(url: str, **conf: Any) -> Celery:
    app = Celery("bench", set_as_current=False)
    app.conf.update(
        broker_url=f"{url}/1",
        debounce_redis_url=f"{url}/0",
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_prefetch_multiplier=16,
        task_ignore_result=True,
    )
    app.conf.update(**conf)
    register(app, url)
    return app


def register(app: Celery, url: str) -> None:
    stats = redis.Redis.from_url(f"{url}/3")

    @app.task(name="bench.plain", shared=False)
    def plain(user_id: str, n: int = 0) -> None:
        return None

    @app.task(
        name="bench.debounced",
        base=DebouncedTask,
        shared=False,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="u:{user_id}",
    )
    def debounced(user_id: str, n: int = 0) -> None:
        return None

    @app.task(
        name="bench.exclusive",
        base=DebouncedTask,
        shared=False,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="u:{user_id}",
        debounce_exclusive=True,
    )
    def exclusive(user_id: str, n: int = 0) -> None:
        return None

    @app.task(name="bench.stamp", bind=True, shared=False)
    def stamp(self: Any, user_id: str, n: int = 0) -> None:
        """Countdown baseline: how late after its ETA this run started (ms)."""
        now = time.time()
        eta = self.request.eta
        if eta:
            when = datetime.fromisoformat(eta) if isinstance(eta, str) else eta
            stats.rpush("lat:countdown", f"{(now - when.timestamp()) * 1000:.3f}")


if os.environ.get("BENCH_REDIS_URL"):
    _conf: dict[str, Any] = {
        name[len("BENCH_CONF_") :].lower(): float(value)
        if value.replace(".", "").isdigit()
        else value
        for name, value in os.environ.items()
        if name.startswith("BENCH_CONF_")
    }
    app = make_app(os.environ["BENCH_REDIS_URL"], **_conf)

if os.environ.get("BENCH_SWITCH"):  # benchmark 5: a worker with a shorter GIL switch interval
    import sys

    sys.setswitchinterval(float(os.environ["BENCH_SWITCH"]))
