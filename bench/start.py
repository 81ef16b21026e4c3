"""Benchmark 5b (issue 23, item 5): deadline -> task start with the dispatcher embedded in
the worker as a thread, embedded as a child process (``debounce_dispatcher_process``), and
as a separate ``celery debounce dispatch`` process, at 200 and 500 due windows a second.

Rounds are interleaved over the three set-ups (each round starts its worker again), so
drift on the machine hits them alike. The separate process is the baseline."""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from typing import Any

from celery import Celery

from bench.harness import Row
from bench.lateness import debounce_lateness, summary
from bench.worker import celery_worker, dispatcher_process

SETUPS: dict[str, dict[str, Any]] = {
    "embedded thread": {},
    "embedded child process": {"debounce_dispatcher_process": "true"},
    "separate dispatcher process": {"separate": True},
}
RATES = (200, 500)


def start_latency(
    app: Celery, url: str, rounds: int, seconds: float
) -> dict[tuple[str, int], list[dict[str, float]]]:
    out: dict[tuple[str, int], list[dict[str, float]]] = {
        (name, rate): [] for name in SETUPS for rate in RATES
    }
    for _ in range(rounds):
        for name, setup in SETUPS.items():
            conf = {k: v for k, v in setup.items() if k != "separate"}
            with ExitStack() as stack:
                if setup.get("separate"):
                    stack.enter_context(dispatcher_process(url))
                    conf["debounce_dispatcher"] = "false"
                stack.enter_context(celery_worker(url, **conf))
                for rate in RATES:
                    got = debounce_lateness(app, url, rate, seconds)
                    out[(name, rate)].append(summary(got["started"]))
    return out


def rows(found: dict[tuple[str, int], list[dict[str, float]]]) -> list[Row]:
    result = []
    for rate in RATES:
        for q in ("p50", "p99"):
            base = statistics.median(r[q] for r in found[("separate dispatcher process", rate)])
            for name in ("embedded thread", "embedded child process"):
                row = Row(
                    "5b",
                    f"deadline -> task start {q}, {rate}/s, {name}",
                    "ms",
                    [r[q] for r in found[(name, rate)]],
                    f"separate dispatcher process {q}",
                    base,
                    target="<= 1.2x" if name == "embedded child process" else "",
                )
                row.ratio = row.median / base if base else None
                if row.target:
                    # within 1.2x, or within 2 ms of it (sub-ms medians make ratios noise)
                    row.passed = row.median <= 1.2 * base or row.median - base <= 2.0
                result.append(row)
    return result
