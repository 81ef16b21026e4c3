"""Run in spawned processes by the collect burst test (tests/producer/test_collect.py)."""

from __future__ import annotations

from typing import Any

from helpers import make_app

from celery_debounce import DebouncedCall, DebouncedTask


def produce(redis_url: str, producer: int, calls: int, barrier: Any, out: Any) -> None:
    """Call ``collect.report(user_id="u1", producer=..., seq=i)`` ``calls`` times, after
    every process is ready; puts the ids the calls returned on ``out``."""
    app = make_app(redis_url, name="collect-burst")

    @app.task(
        base=DebouncedTask,
        shared=False,
        name="collect.report",
        debounce="60s",
        debounce_max_wait="120s",
        debounce_key="{user_id}",
        debounce_collect=True,
    )
    def report(calls: list[DebouncedCall]) -> None:
        pass

    report.delay(user_id="warm-up", producer=producer, seq=-1)  # connection, scripts
    barrier.wait(60)
    ids = [report.delay(user_id="u1", producer=producer, seq=i).id for i in range(calls)]
    out.put((producer, ids))
