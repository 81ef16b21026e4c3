"""A Celery app module for CLI tests: ``celery -A cli_app debounce ...``."""

from __future__ import annotations

import os

from helpers import make_app

from celery_debounce import DebouncedTask

app = make_app(os.environ["DEBOUNCE_TEST_REDIS_URL"], name="cli_app")


@app.task(
    base=DebouncedTask,
    name="reports.build",
    shared=False,
    debounce="1h",
    debounce_max_wait="2h",
    debounce_key="report:{0}",
)
def build(user_id: str) -> str:
    return user_id
