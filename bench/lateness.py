"""Benchmark 5 (and 7's dispatch half): deadline -> broker lateness with the embedded dispatcher."""

from __future__ import annotations

import itertools
import time
from typing import Any

import redis
from celery import Celery

from bench.harness import percentile

_ids = itertools.count()


def paced(rate: int, seconds: float, call: Any) -> int:
    """Call ``call(i)`` ``rate`` times a second for ``seconds``, spread evenly (10 ms ticks)."""
    total = int(rate * seconds)
    start = time.monotonic()
    for i in range(total):
        due = start + i / rate
        wait = due - time.monotonic()
        if wait > 0.002:
            time.sleep(wait)
        call(i)
    return total


def debounce_lateness(
    app: Celery, url: str, rate: int, seconds: float, window: str = "500ms"
) -> dict[str, list[float]]:
    """Open ``rate`` windows a second; each falls due ``window`` later, once.

    Returns ms lists: deadline -> published (``pa``, or ``ca`` if a worker claimed
    before the ack landed) and deadline -> task start (``ca``).
    """
    debounced = app.tasks["bench.debounced"]
    windows = redis.Redis.from_url(f"{url}/0")
    run = next(_ids)
    ids: list[str] = []

    def call(i: int) -> None:
        ids.append(
            debounced.apply_async((f"l{run}-{i}",), debounce=window, debounce_max_wait="60s").id
        )

    paced(rate, seconds, call)
    pending = set(ids)
    deadline = time.monotonic() + 60
    published: list[float] = []
    started: list[float] = []
    while pending and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = list(pending)
        with windows.pipeline(transaction=False) as pipe:
            for tid in batch:
                pipe.hmget(f"debounce:{{0}}:win:{tid}", "dl", "pa", "ca", "st")
            rows = pipe.execute()
        for tid, (dl, pa, ca, st) in zip(batch, rows, strict=True):
            if st in (b"claimed", b"finished") and ca is not None:
                pending.discard(tid)
                broker = int(pa) if pa is not None else int(ca)
                published.append(broker - int(dl))
                started.append(int(ca) - int(dl))
    if pending:
        raise RuntimeError(f"{len(pending)} windows never ran")
    return {"published": published, "started": started}


def countdown_lateness(
    app: Celery, url: str, rate: int, seconds: float, countdown: float = 0.5
) -> list[float]:
    """Celery's own ``countdown``: ms from the ETA to the task starting on the worker."""
    stamp = app.tasks["bench.stamp"]
    stats = redis.Redis.from_url(f"{url}/3")
    stats.delete("lat:countdown")
    total = paced(rate, seconds, lambda i: stamp.apply_async((f"c{i}",), countdown=countdown))
    deadline = time.monotonic() + 60
    while stats.llen("lat:countdown") < total and time.monotonic() < deadline:
        time.sleep(0.2)
    return [float(v) for v in stats.lrange("lat:countdown", 0, -1)]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "n": len(values),
    }
