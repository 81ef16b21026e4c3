"""A Node call by task name is the call ``.delay()`` makes (issue 41): the Node producer
reads the task's definition the worker published, and a burst mixing Node and Python
calls makes exactly the runs a Python-only burst makes, with the same arguments, on the
same queue, against a real Celery worker, on each store (a redis-server; a PostgreSQL
database, from Node through a node-postgres Pool)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from celery import Celery
from helpers import running_worker, wait_until
from node_producer import NODE, node_calls

from celery_debounce import DebouncedCall, DebouncedTask
from celery_debounce.ops.read_view import list_windows
from celery_debounce.settings import settings_for
from celery_debounce.store import build_store, store_for
from celery_debounce.testing.postgres import LocalPostgres

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

#: Long enough that a burst's three steps (two of them a Node process each) land in
#: one window on a loaded machine.
WINDOW = "5s"


def _tasks(app: Celery, runs: list[tuple[str, Any, Any, int, str]]) -> None:
    """One task per kind the issue names, every one routed to queue ``reports``."""

    def record(task: Any, args: Any, kwargs: Any) -> None:
        runs.append(
            (
                task.name,
                args,
                kwargs,
                task.request.debounce_calls,
                (task.request.delivery_info or {}).get("routing_key"),
            )
        )

    common: dict[str, Any] = {"base": DebouncedTask, "shared": False, "bind": True}

    @app.task(name="proj.digest", debounce=WINDOW, debounce_max_wait="1m", **common)
    def digest(self: Any, user_id: str, n: int = 0) -> None:
        record(self, [user_id], {"n": n})

    @app.task(
        name="proj.capped",
        debounce=WINDOW,
        debounce_max_wait="1m",
        debounce_key="c:{0}",
        debounce_max_calls=3,
        **common,
    )
    def capped(self: Any, user_id: str, n: int = 0) -> None:
        record(self, [user_id], {"n": n})

    @app.task(
        name="proj.lead",
        debounce=WINDOW,
        debounce_max_wait="1m",
        debounce_key="l:{user_id}",
        debounce_leading=True,
        **common,
    )
    def lead(self: Any, user_id: str, n: int = 0) -> None:
        record(self, [user_id], {"n": n})

    @app.task(
        name="proj.excl",
        debounce=WINDOW,
        debounce_max_wait="1m",
        debounce_key="x:{0}",
        debounce_exclusive=True,
        **common,
    )
    def excl(self: Any, user_id: str, n: int = 0) -> None:
        record(self, [user_id], {"n": n})

    @app.task(
        name="proj.gather",
        debounce=WINDOW,
        debounce_max_wait="1m",
        debounce_key="g:{user_id}",
        debounce_collect=True,
        **common,
    )
    def gather(self: Any, calls: list[DebouncedCall]) -> None:
        record(self, [c.kwargs.get("user_id") for c in calls], [c.kwargs for c in calls])


@dataclass(frozen=True)
class Store:
    """Where the windows are: the app's settings, and where the Node producer writes."""

    conf: dict[str, Any]
    redis_url: str
    postgres_url: str | None = None


@pytest.fixture(
    params=["redis", "postgres", pytest.param("pgbouncer", marks=pytest.mark.pgbouncer)]
)
def store(request: pytest.FixtureRequest, redis_server: str) -> Iterator[Store]:
    """The windows' store: a redis-server, or a new migrated PostgreSQL database, reached
    directly or through PgBouncer in transaction mode (by the worker and by Node)."""
    if request.param == "redis":
        yield Store({}, f"{redis_server}/0")
        return
    server: LocalPostgres = request.getfixturevalue("postgres_server")
    name = f"node_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a name made here, not user data
    direct = Celery("migrate", set_as_current=False)
    direct.conf.debounce_store_url = server.url(name)
    migrating = build_store(settings_for(direct))
    migrating.migrate()
    migrating.close()
    url = server.url(name)
    if request.param == "pgbouncer":
        url = request.getfixturevalue("pgbouncer_server").url(name)
    yield Store({"debounce_store_url": url, "debounce_redis_url": None}, "", url)
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _node(
    package: Path, store: Store, user: str, calls: list[tuple[str, dict[str, Any]]]
) -> list[Any]:
    """The Node calls, by task name with no options, for ``user``."""
    made = [
        [task, json.loads(json.dumps(call).replace("USER", user)), None] for task, call in calls
    ]
    return node_calls(package, store.redis_url, made, postgres=store.postgres_url)


def _python(app: Celery, user: str, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    out = []
    for task, call in calls:
        shaped = json.loads(json.dumps(call).replace("USER", user))
        out.append(app.tasks[task].apply_async(shaped.get("args"), shaped.get("kwargs")).id)
    return out


#: The burst, step by step: Node first for the leading and exclusive tasks (a Node
#: opener must make the leading run and carry the exclusive header), Python first for
#: the others; the default-key task gets its arguments in every shape.
STEP1 = [("proj.lead", {"args": ["USER"]}), ("proj.excl", {"args": ["USER"]})]
STEP2 = [
    ("proj.digest", {"args": ["USER"]}),
    ("proj.capped", {"args": ["USER"]}),
    ("proj.lead", {"kwargs": {"user_id": "USER", "n": 2}}),
    ("proj.excl", {"args": ["USER", 2]}),
    ("proj.gather", {"kwargs": {"user_id": "USER"}}),
]
STEP3 = [
    ("proj.gather", {"kwargs": {"user_id": "USER", "n": 3}}),
    ("proj.digest", {"kwargs": {"user_id": "USER"}}),
    ("proj.digest", {"args": ["USER", 0]}),
    ("proj.capped", {"args": ["USER", 3]}),
    ("proj.lead", {"args": ["USER", 3]}),
    ("proj.excl", {"args": ["USER", 3]}),
]
STEP4 = [
    ("proj.digest", {"kwargs": {"user_id": "USER", "n": 0}}),
    ("proj.capped", {"args": ["USER", 4]}),
    ("proj.gather", {"kwargs": {"user_id": "USER"}}),
]


def test_a_burst_mixing_node_and_python_makes_the_runs_of_a_python_only_burst(
    app_factory: Any, store: Store, node_package: Path
) -> None:
    app = app_factory(task_routes={"proj.*": {"queue": "reports"}}, **store.conf)
    runs: list[tuple[str, Any, Any, int, str]] = []
    _tasks(app, runs)
    windows = store_for(app)
    names = ["proj.digest", "proj.capped", "proj.lead", "proj.excl", "proj.gather"]
    url = store
    with running_worker(app, queues=["reports"]):  # a run left on queue celery never runs
        wait_until(lambda: all(windows.task_definition(n) for n in names))
        # M: the mixed burst (Node at steps 1 and 3), P: the same burst from Python alone
        node_first = _node(node_package, url, "M", STEP1)
        assert all(isinstance(i, str) for i in node_first), node_first
        _python(app, "P", STEP1)
        (opened,) = windows.pending_payloads(0, "9:proj.excl:x:M")
        assert json.loads(opened.options_json or "{}")["headers"] == {"debounce_exclusive": 1}
        _python(app, "M", STEP2)
        _python(app, "P", STEP2)
        joined = _node(node_package, url, "M", STEP3)
        assert all(isinstance(i, str) for i in joined), joined
        _python(app, "P", STEP3)
        _python(app, "M", STEP4)
        _python(app, "P", STEP4)
        # per user: digest 1, capped 1, lead 2 (the leading run, then its quiet period's),
        # excl 1, gather 1
        wait_until(lambda: len(runs) >= 12, timeout=40)
        wait_until(lambda: not list_windows(app), timeout=20)
    assert len(runs) == 12, runs

    def shape(user: str) -> list[tuple[Any, ...]]:
        mine = [r for r in runs if user in json.dumps(r[1])]
        text = json.dumps(sorted(mine, key=json.dumps)).replace(f'"{user}"', '"U"')
        return [tuple(r) for r in json.loads(text)]

    assert shape("M") == shape("P")
    assert all(queue == "reports" for *_, queue in runs), runs
    by_task = {(r[0], r[3]) for r in shape("M")}
    assert by_task == {
        ("proj.digest", 4),  # one window: four calls, positional, by name and default given
        ("proj.capped", 3),  # closed by its cap at the third call
        ("proj.lead", 1),  # the Node opener's leading run
        ("proj.lead", 2),  # the calls of its quiet period
        ("proj.excl", 3),
        ("proj.gather", 3),  # a collect window: the Node call among the calls its run gets
    }
