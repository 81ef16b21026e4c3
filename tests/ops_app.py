"""The app the operations tests drive through ``celery -A ops_app ...``.

Its Redis comes from $DEBOUNCE_OPS_REDIS (set by the ``ops_app`` fixture, and
passed to subprocesses with tests/ on PYTHONPATH); $DEBOUNCE_OPS_STORE, a postgresql://
URL, puts its windows in PostgreSQL (the ``store`` fixture's postgres case).
"""

from __future__ import annotations

import os

from helpers import make_app

from celery_debounce import DebouncedTask

_store = os.environ.get("DEBOUNCE_OPS_STORE") or None
app = make_app(
    os.environ["DEBOUNCE_OPS_REDIS"],
    name="ops_app",
    **({"debounce_store_url": _store, "debounce_redis_url": None} if _store else {}),
)
runs: list[tuple[str, object]] = []


@app.task(
    base=DebouncedTask,
    shared=False,
    name="ops.report",
    debounce="1h",
    debounce_max_wait="2h",
    debounce_key="user:{user_id}",
)
def report(user_id: str, n: int = 0) -> str:
    runs.append(("report", user_id))
    return f"report {user_id}"


@app.task(
    base=DebouncedTask,
    shared=False,
    name="ops.sync",
    debounce="1h",
    debounce_max_wait="2h",
    debounce_key="{item}",
)
def sync(item: str) -> str:
    runs.append(("sync", item))
    return f"sync {item}"


@app.task(
    base=DebouncedTask,
    shared=False,
    name="ops.tick",
    debounce="200ms",
    debounce_max_wait="200ms",
    debounce_key="{0}",
)
def tick(item: str) -> str:
    """Window == max wait: every window is forced by its max wait."""
    runs.append(("tick", item))
    return item


@app.task(
    base=DebouncedTask,
    shared=False,
    name="ops.quick",
    debounce="200ms",
    debounce_max_wait="10s",
    debounce_key="{0}",
)
def quick(item: str) -> str:
    runs.append(("quick", item))
    return item
