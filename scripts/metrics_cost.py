#!/usr/bin/env python3
"""What the metrics add to one call, without Redis: ``gate.enter`` against a store whose
``gate`` answers at once, with the metrics off and on (docs/monitoring.md quotes it).

    PYTHONPATH=. .venv/bin/python scripts/metrics_cost.py

The round trip to Redis (about 0.1-0.3 ms on loopback) is left out on purpose: what
is measured is only the Python the metrics put around it.
"""

from __future__ import annotations

import timeit
from typing import Any

from prometheus_client import CollectorRegistry

from celery_debounce.ops import metrics
from celery_debounce.producer import gate
from celery_debounce.producer.gate import GateResult


class _Call:  # what enter() and announce() read of a PreparedCall
    task_name = "bench.task"
    key = "k"


class _Store:
    reply = GateResult("id", False, 1000, 2, 900)

    def gate(self, call: Any, fixed: Any = None) -> GateResult:
        return self.reply


def per_call_ns(n: int = 200_000) -> float:
    store, call = _Store(), _Call()
    best = min(timeit.repeat(lambda: gate.enter(store, call), number=n, repeat=7))  # type: ignore[arg-type]
    return best / n * 1e9


def main() -> None:
    off = per_call_ns()
    enabled = metrics.enable(CollectorRegistry())
    try:
        on = per_call_ns()
    finally:
        enabled.disable()
    print(f"gate.enter without Redis: metrics off {off:.0f} ns, on {on:.0f} ns per call")


if __name__ == "__main__":
    main()
