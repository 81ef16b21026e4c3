"""Benchmark 11 (issue 21, item 4): what run-aware windows cost a worker.

* runs/s of one prefork worker process for a trivial task, debounced (a claim and a
  finish per run, the claim lease renewed) and debounced with ``debounce_exclusive``
  (the key's in-progress hold written at take, freed at finish), against a plain
  task on the **same** worker, rounds interleaved. Each round fills the broker with
  ``n`` messages while the worker's consumer is cancelled (remote control), then adds
  the consumer back and times how fast the backlog drains (from 90 % to 10 % left),
  so the figure is the worker's alone: the dispatcher published everything before.
* deadline -> task start at 200 runs/s against Celery's ``countdown`` (ETA -> start)
  on the same worker, rounds interleaved (bench/lateness.py does the measuring).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import redis
from celery import Celery

from bench.harness import Row, compare
from bench.lateness import countdown_lateness, debounce_lateness, summary
from celery_debounce.ops.admin import DebounceAdmin

QUEUE = "celery"


def _left(broker: redis.Redis) -> int:
    """Messages not yet started: in the queue, or prefetched and not yet acked."""
    with broker.pipeline(transaction=False) as pipe:
        pipe.llen(QUEUE)
        pipe.hlen("unacked")
        queued, unacked = pipe.execute()
    return int(queued) + int(unacked)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _drain_rate(app: Celery, broker: redis.Redis, n: int) -> float:
    """Add the consumer back; runs/s while the backlog went from 90 % to 10 % left."""
    reply = app.control.add_consumer(QUEUE, reply=True, limit=1, timeout=10)
    if not reply:
        raise RuntimeError("the worker did not answer add_consumer")
    hi, lo = 0.9 * n, 0.1 * n
    t_hi = t_lo = None
    deadline = time.monotonic() + 300
    while t_lo is None:
        left = _left(broker)
        now = time.perf_counter()
        if t_hi is None and left <= hi:
            t_hi = now
        if t_hi is not None and left <= lo:
            t_lo = now
        if time.monotonic() > deadline:
            raise RuntimeError(f"backlog did not drain ({left} left)")
        time.sleep(0.005)
    _wait(lambda: _left(broker) == 0, 120, "the backlog's end")
    return (hi - lo) / (t_lo - t_hi) if t_lo > t_hi else float("nan")


def _pause(app: Celery, broker: redis.Redis) -> None:
    reply = app.control.cancel_consumer(QUEUE, reply=True, limit=1, timeout=10)
    if not reply:
        raise RuntimeError("the worker did not answer cancel_consumer")
    _wait(lambda: _left(broker) == 0, 120, "prefetched messages to run")
    time.sleep(0.3)  # the last run's finish


def worker_run_rates(app: Celery, url: str, rounds: int, n: int) -> list[Row]:
    """Rows for runs/s debounced and exclusive vs plain (call inside celery_worker)."""
    broker = redis.Redis.from_url(f"{url}/1")
    windows = redis.Redis.from_url(f"{url}/0")
    admin = DebounceAdmin(app)
    tag = time.time_ns()

    def fill_plain(r: int) -> None:
        plain = app.tasks["bench.plain"]
        with app.producer_or_acquire() as producer:
            for i in range(n):
                plain.apply_async((f"p{tag}-{r}-{i}",), producer=producer)

    def fill_windows(name: str, r: int) -> None:
        task = app.tasks[name]
        for i in range(n):
            task.delay(f"{name[6]}{tag}-{r}-{i}")
        admin.flush_all(name)  # the worker's embedded dispatcher publishes them now
        _wait(lambda: broker.llen(QUEUE) >= n, 120, f"{n} windows published")

    out: dict[str, list[float]] = {"plain": [], "debounced": [], "exclusive": []}
    fills = {
        "plain": fill_plain,
        "debounced": lambda r: fill_windows("bench.debounced", r),
        "exclusive": lambda r: fill_windows("bench.exclusive", r),
    }
    for r in range(rounds):
        for name, fill in fills.items():
            _pause(app, broker)
            fill(r)
            out[name].append(_drain_rate(app, broker, n))
    windows.flushdb()
    note = (
        f"{n} runs a round, {rounds} rounds interleaved (plain, debounced, exclusive); "
        "one prefork worker process (-c 1); rate while the backlog went from 90% to 10%"
    )
    rows = [
        Row("11", "plain task runs/s, prefork -c 1", "runs/s", out["plain"], note=note),
        compare(
            "11",
            "debounced task runs/s, same worker",
            out["debounced"],
            "plain runs/s",
            out["plain"],
            0.8,
            unit="runs/s",
        ),
        compare(
            "11",
            "debounced + debounce_exclusive runs/s, same worker",
            out["exclusive"],
            "plain runs/s",
            out["plain"],
            0.8,
            unit="runs/s",
        ),
    ]
    return rows


def start_lateness(
    app: Celery, url: str, rounds: int, seconds: float, rate: int = 200
) -> list[Row]:
    """deadline -> task start at ``rate`` runs/s vs countdown's ETA -> start, on the
    same worker, rounds interleaved (call inside celery_worker, consumer active)."""
    start: list[dict[str, float]] = []
    eta: list[dict[str, float]] = []
    for _ in range(rounds):
        start.append(summary(debounce_lateness(app, url, rate, seconds)["started"]))
        eta.append(summary(countdown_lateness(app, url, rate, seconds)))
    rows = []
    for q in ("p50", "p99"):
        row = Row(
            "11",
            f"deadline -> task start {q}, {rate} runs/s",
            "ms",
            [s[q] for s in start],
            f"countdown ETA -> start {q}",
            statistics.median([e[q] for e in eta]),
            target="<= 1.5x",
        )
        row.ratio = row.median / row.baseline_value if row.baseline_value else None
        row.passed = row.ratio is not None and row.ratio <= 1.5
        row.extra["baseline_samples"] = [e[q] for e in eta]
        rows.append(row)
    rows[0].note = (
        f"{rounds} rounds x {seconds:g} s, interleaved with countdown=0.5 tasks "
        "at the same rate; 500 ms windows; start = claim time (Redis clock) - "
        "deadline; countdown: start (worker clock) - ETA"
    )
    return rows
