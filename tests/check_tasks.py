"""Two refused debounced task definitions (imported by tests/check_app.py)."""

from __future__ import annotations

from check_app import app

from celery_debounce import DebouncedTask


@app.task(
    base=DebouncedTask,
    name="check.misspelt",
    debounce="1h",
    debounce_max_wait="2h",
    debounce_colect=True,
)
def misspelt(x: int) -> int:
    return x


@app.task(
    base=DebouncedTask,
    name="check.bad_key",
    debounce="1h",
    debounce_max_wait="2h",
    debounce_key="user:{user}",
)
def bad_key(x: int) -> int:
    return x
