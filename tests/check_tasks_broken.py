"""A task module that fails to import (imported by tests/check_app.py)."""

from __future__ import annotations

from check_app import app

from celery_debounce import DebouncedTask


@app.task(base=DebouncedTask, name="check.broken", debounce="1h", debounce_max_wait="2h")
def broken(x: int) -> int:
    return x


settings_module_typo  # type: ignore[name-defined]  # noqa: F821  (raises NameError)
