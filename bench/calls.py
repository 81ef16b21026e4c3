"""Calls per hot ``.delay()``: the ``sys.setprofile`` count docs/benchmark-log.md cites.

``python -m bench.calls`` starts a fresh redis-server, warms a hot key, then counts
the function calls of one more ``.delay()`` of the same key (the median of 21
counts): Python and C calls (``"call"`` and ``"c_call"`` events, the figure the
performance notes give), and Python calls alone.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any


def count_calls(fn: Callable[[], object]) -> tuple[int, int]:
    """``(call + c_call events, call events)`` while ``fn()`` runs (fn's own call and
    the ``sys.setprofile(None)`` that ends the count left out)."""
    both = python = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal both, python
        if event == "call":
            both += 1
            python += 1
        elif event == "c_call":
            both += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return both - 2, python - 1


def main(argv: list[str] | None = None) -> int:
    from bench.apps import make_app
    from celery_debounce.testing.servers import LocalRedis

    with LocalRedis() as server:
        app = make_app(server.url)
        task = app.tasks["bench.debounced"]
        for _ in range(200):
            task.delay("hot", n=1)
        counts = [count_calls(lambda: task.delay("hot", n=1)) for _ in range(21)]
    both = [c[0] for c in counts]
    python = [c[1] for c in counts]
    print(
        f"calls per hot .delay(): {statistics.median(both)} Python and C "
        f"({statistics.median(python)} Python)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
