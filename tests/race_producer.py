"""Run in spawned processes by the racing-producers test."""

from __future__ import annotations

from typing import Any

from helpers import make_app

from celery_debounce import DebouncedTask
from celery_debounce.store import store_for


def produce(
    redis_url: str,
    app_name: str,
    barrier: Any,
    started: Any,
    producers: int,
    calls_after_all_started: int,
    out: Any,
) -> None:
    """Call ``race.task("same", i)`` from this process, overlapping with the others.

    After a warm-up call (connection and scripts loaded), every process waits at
    ``barrier``, then keeps calling until every process has made its first racing
    call, and then ``calls_after_all_started`` more. Puts (ids, Redis time of its
    first racing call, Redis time after its last) on ``out``.
    """
    app = make_app(redis_url, name=app_name)

    @app.task(
        base=DebouncedTask,
        shared=False,
        name="race.task",
        debounce="30s",
        debounce_key="k:{0}",
        debounce_max_wait="60s",
    )
    def task(x: str, n: int) -> None:
        pass

    client = store_for(app).client
    task.delay("warm-up", 0)
    barrier.wait(30)
    ids: list[str] = []
    first = _redis_ms(client)
    ids.append(task.delay("same", 0).id)
    with started.get_lock():
        started.value += 1
    while started.value < producers:
        ids.append(task.delay("same", len(ids)).id)
    for _ in range(calls_after_all_started):
        ids.append(task.delay("same", len(ids)).id)
    out.put((ids, first, _redis_ms(client)))


def _redis_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000
