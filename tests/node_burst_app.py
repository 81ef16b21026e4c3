"""The app of the mixed Node and Python burst (tests/system/test_node_definitions.py),
run as ``celery -A node_burst_app worker -Q reports``: one debounced task per kind the
issue names, every one routed to queue ``reports`` by ``task_routes``. Each run returns
what it got: ``[task, args, kwargs, calls it stands for, the queue it came from]``.

Configured from the environment: DEBOUNCE_TEST_REDIS_URL (broker, results and, without
DEBOUNCE_TEST_STORE_URL, the windows), DEBOUNCE_TEST_STORE_URL (a PostgreSQL store).
"""

from __future__ import annotations

import os
from typing import Any

from helpers import make_app

from celery_debounce import DebouncedCall, DebouncedTask

#: Long enough that a burst's steps (two of them a Node process each) land in one
#: window on a loaded machine.
WINDOW = "5s"

_store = os.environ.get("DEBOUNCE_TEST_STORE_URL")
app = make_app(
    os.environ["DEBOUNCE_TEST_REDIS_URL"],
    name="node_burst_app",
    task_routes={"proj.*": {"queue": "reports"}},
    **({"debounce_store_url": _store, "debounce_redis_url": None} if _store else {}),
)


def _ran(task: Any, args: Any, kwargs: Any) -> list[Any]:
    queue = (task.request.delivery_info or {}).get("routing_key")
    return [task.name, args, kwargs, getattr(task.request, "debounce_calls", None), queue]


_common: dict[str, Any] = {"base": DebouncedTask, "shared": False, "bind": True}


@app.task(name="proj.digest", debounce=WINDOW, debounce_max_wait="1m", **_common)
def digest(self: Any, user_id: str, n: int = 0) -> list[Any]:
    return _ran(self, [user_id], {"n": n})


@app.task(
    name="proj.capped",
    debounce=WINDOW,
    debounce_max_wait="1m",
    debounce_key="c:{0}",
    debounce_max_calls=3,
    **_common,
)
def capped(self: Any, user_id: str, n: int = 0) -> list[Any]:
    return _ran(self, [user_id], {"n": n})


@app.task(
    name="proj.lead",
    debounce=WINDOW,
    debounce_max_wait="1m",
    debounce_key="l:{user_id}",
    debounce_leading=True,
    **_common,
)
def lead(self: Any, user_id: str, n: int = 0) -> list[Any]:
    return _ran(self, [user_id], {"n": n})


@app.task(
    name="proj.excl",
    debounce=WINDOW,
    debounce_max_wait="1m",
    debounce_key="x:{0}",
    debounce_exclusive=True,
    **_common,
)
def excl(self: Any, user_id: str, n: int = 0) -> list[Any]:
    return _ran(self, [user_id], {"n": n})


@app.task(
    name="proj.gather",
    debounce=WINDOW,
    debounce_max_wait="1m",
    debounce_key="g:{user_id}",
    debounce_collect=True,
    **_common,
)
def gather(self: Any, calls: list[DebouncedCall]) -> list[Any]:
    return _ran(self, [c.kwargs.get("user_id") for c in calls], [c.kwargs for c in calls])
