"""Benchmarks 7 and 8: cost with 1,000 vs 1,000,000 open windows; producer RSS over many calls."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis
from celery import Celery

from bench.harness import percentile
from bench.memory import open_windows

_ids = itertools.count()


def call_latencies(app: Celery, calls: int) -> list[float]:
    """Per-call ms of ``.delay()``: half open a new window, half join a hot one."""
    debounced = app.tasks["bench.debounced"]
    run = next(_ids)
    out = []
    perf = time.perf_counter
    for i in range(calls):
        key = f"s{run}-{i}" if i % 2 else "hot"
        t0 = perf()
        debounced.delay(key, n=1)
        out.append((perf() - t0) * 1000)
    return out


def grow_to(app: Celery, url: str, count: int) -> None:
    """Make the open-window population ``count`` (1 h windows that never fall due here)."""
    client = redis.Redis.from_url(f"{url}/0")
    have = client.zcard("debounce:{0}:due")
    if have < count:
        open_windows(app, count - have, f"bg{next(_ids)}-", chunk=10000)
        time.sleep(2)  # let Redis finish rehashing its key space before measuring


def producer_rss(url: str, calls: int) -> list[tuple[int, int]]:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-m", "bench.rss_producer", url, str(calls)],
        env=dict(os.environ, PYTHONPATH=str(root)),
        cwd=str(root),
        check=True,
        capture_output=True,
        text=True,
    )
    return [tuple(x) for x in json.loads(out.stdout)]  # type: ignore[misc]


def p99(values: list[float]) -> float:
    return percentile(values, 99)
