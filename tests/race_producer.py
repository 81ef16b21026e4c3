"""Run in spawned processes by the racing-producers test."""

from __future__ import annotations

from helpers import make_app

from celery_debounce import DebouncedTask


def produce(redis_url: str, app_name: str, calls: int) -> list[str]:
    app = make_app(redis_url, name=app_name)

    @app.task(base=DebouncedTask, name="race.task", shared=False, debounce="30s",
              debounce_key="k:{0}", debounce_max_wait="60s")
    def task(x: str, n: int) -> None:
        pass

    return [task.delay("same", i).id for i in range(calls)]
