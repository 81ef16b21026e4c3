"""A Node call by task name is the call ``.delay()`` makes (issue 41): the Node producer
reads the task's definition the worker published, and a burst mixing Node and Python
calls makes exactly the runs a Python-only burst makes, with the same arguments, on the
same queue, against a real ``celery -A node_burst_app worker -Q reports`` (prefork), on
each store (a redis-server; a PostgreSQL database, directly and through PgBouncer, from
Node through a node-postgres Pool)."""

from __future__ import annotations

import importlib
import json
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
import redis
from celery import Celery
from helpers import celery_worker, wait_until
from node_producer import NODE, node_calls

from celery_debounce.ops.read_view import list_windows
from celery_debounce.settings import settings_for
from celery_debounce.store import build_store, store_for
from celery_debounce.testing.postgres import LocalPostgres

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


@dataclass(frozen=True)
class Store:
    """Where the windows are: the environment of the app, and where Node writes."""

    env: dict[str, str]
    node_url: str
    postgres_url: str | None = None


@pytest.fixture(
    params=["redis", "postgres", pytest.param("pgbouncer", marks=pytest.mark.pgbouncer)]
)
def store(request: pytest.FixtureRequest, redis_server: str) -> Iterator[Store]:
    """The windows' store: a redis-server, or a new migrated PostgreSQL database, reached
    directly or through PgBouncer in transaction mode (by the worker and by Node)."""
    redis.Redis.from_url(f"{redis_server}/0").flushall()
    base = {"DEBOUNCE_TEST_REDIS_URL": redis_server}
    if request.param == "redis":
        yield Store(base, f"{redis_server}/0")
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
    yield Store({**base, "DEBOUNCE_TEST_STORE_URL": url}, "", url)
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _app_module(store: Store, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """tests/node_burst_app.py as the worker loads it, imported here for Python's calls."""
    for key, value in store.env.items():
        monkeypatch.setenv(key, value)
    if "DEBOUNCE_TEST_STORE_URL" not in store.env:
        monkeypatch.delenv("DEBOUNCE_TEST_STORE_URL", raising=False)
    sys.modules.pop("node_burst_app", None)
    return importlib.import_module("node_burst_app")


def _node(
    package: Path, store: Store, user: str, calls: list[tuple[str, dict[str, Any]]]
) -> list[Any]:
    """The Node calls, by task name with no options, for ``user``: their task ids."""
    made = [
        [task, json.loads(json.dumps(call).replace("USER", user)), None] for task, call in calls
    ]
    ids = node_calls(package, store.node_url, made, postgres=store.postgres_url)
    assert all(isinstance(i, str) for i in ids), ids
    return ids


def _python(app: Celery, user: str, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    out = []
    for task, call in calls:
        shaped = json.loads(json.dumps(call).replace("USER", user))
        out.append(app.tasks[task].apply_async(shaped.get("args"), shaped.get("kwargs")).id)
    return out


#: The burst, step by step: Node first for the leading and exclusive tasks (a Node
#: opener must make the leading run and carry the exclusive header), Python first for
#: the others; the default-key task gets its arguments in every shape; the collect task
#: gets a Node call among Python ones.
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

NAMES = ["proj.digest", "proj.capped", "proj.lead", "proj.excl", "proj.gather"]


def test_a_burst_mixing_node_and_python_makes_the_runs_of_a_python_only_burst(
    store: Store, node_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _app_module(store, monkeypatch)
    app: Celery = module.app
    windows = store_for(app)
    env = {**os.environ, **store.env}
    # a run left on queue celery never runs: the worker consumes only the routed queue
    with celery_worker("node_burst_app", tmp_path / "worker.log", env, "prefork", queues="reports"):
        wait_until(lambda: all(windows.task_definition(n) for n in NAMES), timeout=20)
        # M: the mixed burst (Node at steps 1 and 3), P: the same burst from Python alone
        ids = {"M": _node(node_package, store, "M", STEP1), "P": _python(app, "P", STEP1)}
        (opened,) = windows.pending_payloads(0, "9:proj.excl:x:M")
        assert json.loads(opened.options_json or "{}")["headers"] == {"debounce_exclusive": 1}
        for user, step in (("M", STEP2), ("P", STEP2)):
            ids[user] += _python(app, user, step)
        ids["M"] += _node(node_package, store, "M", STEP3)
        ids["P"] += _python(app, "P", STEP3)
        for user in ("M", "P"):
            ids[user] += _python(app, user, STEP4)
        # each distinct id is one run: digest 1, capped 1, lead 2 (the leading run, then
        # its quiet period's), excl 1, gather 1
        runs = {
            user: [app.AsyncResult(i).get(timeout=60) for i in dict.fromkeys(ids[user])]
            for user in ("M", "P")
        }
        wait_until(lambda: not list_windows(app), timeout=20)

    def shape(user: str) -> list[Any]:
        text = json.dumps(sorted(runs[user], key=json.dumps)).replace(f'"{user}"', '"U"')
        return list(json.loads(text))

    assert shape("M") == shape("P")
    assert all(run[4] == "reports" for user in runs for run in runs[user]), runs
    assert sorted((run[0], run[3]) for run in shape("M")) == [
        ("proj.capped", 3),  # closed by its cap at the third call
        ("proj.digest", 4),  # one window: four calls, positional, by name, default given
        ("proj.excl", 3),
        ("proj.gather", 3),  # a collect window: the Node call among the calls its run got
        ("proj.lead", 1),  # the Node opener's leading run
        ("proj.lead", 2),  # the calls of its quiet period
    ]


def test_a_node_cancel_never_runs_the_window_and_its_ids_are_revoked_by_the_dispatcher(
    store: Store, node_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cancelWindow: the window a Node call opened, joined by a Python call with its own
    task id, is dropped; the worker's dispatcher stores REVOKED for the window's id and
    for the Python caller's (Node reaches no result backend), so no caller waits
    forever; nothing runs; a second cancel finds nothing."""
    from celery.exceptions import TaskRevokedError

    module = _app_module(store, monkeypatch)
    app: Celery = module.app
    windows = store_for(app)
    env = {**os.environ, **store.env}
    with celery_worker("node_burst_app", tmp_path / "worker.log", env, "prefork", queues="reports"):
        wait_until(lambda: windows.task_definition("proj.digest") is not None, timeout=20)
        (opened,) = _node(node_package, store, "C", [("proj.digest", {"args": ["USER"]})])
        mine = f"mine-{uuid.uuid4().hex}"
        app.tasks["proj.digest"].apply_async(["C"], task_id=mine)
        cancelled, again = node_calls(
            node_package,
            store.node_url,
            [["proj.digest", {"args": ["C"]}, None, "cancel"]] * 2,
            postgres=store.postgres_url,
        )
        assert cancelled["taskId"] == opened and cancelled["calls"] == 2, cancelled
        assert again is None
        assert not list_windows(app)
        for result in (app.AsyncResult(opened), app.AsyncResult(mine)):
            wait_until(lambda r=result: r.state == "REVOKED", timeout=20)
            with pytest.raises(TaskRevokedError):
                result.get(timeout=5)
        # the hand-off outlives a dispatcher outage of hours: kept the record TTL (the
        # app's debounce_record_ttl, 7 days), not the history TTL (1 h)
        if store.postgres_url is None:
            kept_ms = redis.Redis.from_url(store.node_url).pttl(f"debounce:{{0}}:win:{opened}")
        else:
            with psycopg.connect(store.postgres_url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT (extract(epoch FROM until - clock_timestamp()) * 1000)::bigint "
                    "FROM debounce_taken WHERE task_id = %s",
                    (opened,),
                ).fetchone()
            kept_ms = row[0] if row else 0
        assert kept_ms > 6 * 86_400_000, kept_ms
    assert "succeeded" not in (tmp_path / "worker.log").read_text()  # nothing ran


def test_with_on_outage_publish_a_node_call_the_store_cannot_take_runs_once_plainly(
    store: Store, node_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onOutage: "publish" with redisBroker: once the store's client is gone, each call
    of a task whose definition was read before is published as a plain message on the
    task's route, in kombu's Redis format, and a real worker consuming only that queue
    runs each once with its arguments (a collect task's run gets a list of that one
    call); a task whose definition was never read is not published (its route and shape
    are unknown): the outage is raised, nothing sent."""
    module = _app_module(store, monkeypatch)
    app: Celery = module.app
    windows = store_for(app)
    broker = f"{store.env['DEBOUNCE_TEST_REDIS_URL']}/1"
    env = {**os.environ, **store.env}
    outage = {"publish": "__broker__", "onOutage": "publish", "timeout": "1s"}
    with celery_worker("node_burst_app", tmp_path / "worker.log", env, "prefork", queues="reports"):
        wait_until(lambda: windows.task_definition("proj.gather") is not None, timeout=20)
        calls = [
            ["proj.digest", {"args": ["O"]}, None, "pending"],  # reads the definitions
            ["proj.gather", {"args": ["O"]}, None, "pending"],
            ["__close__", {}, None],
            ["proj.digest", {"args": ["O", 7]}, outage],
            ["proj.gather", {"kwargs": {"user_id": "O", "n": 2}}, outage],
            ["proj.capped", {"args": ["O"]}, outage],
        ]
        _, _, digest, gather, unread = node_calls(
            node_package, store.node_url, calls, postgres=store.postgres_url, broker=broker
        )
        assert unread["error"] == "DebounceBackendError", unread
        assert "not published plainly either" in unread["message"]
        ran = [app.AsyncResult(i).get(timeout=60) for i in (digest, gather)]
    assert ran[0] == ["proj.digest", ["O"], {"n": 7}, None, "reports"], ran
    task, ids, kwargs, _, queue = ran[1]
    assert (task, ids, kwargs, queue) == (
        "proj.gather",
        ["O"],
        [{"user_id": "O", "n": 2}],
        "reports",
    ), ran
    assert not list_windows(app)  # no window: each ran plainly, once
