"""Task definitions (producer/published.py): what a producer by name reads of a debounced
task, written by a worker as it starts and by ``celery debounce publish``."""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounce_command, debounced, make_app, running_worker, wait_until
from reads import open_payload

from celery_debounce.errors import DebounceConfigError
from celery_debounce.producer.by_name import DEFINITION_FORMAT
from celery_debounce.producer.published import definition, definitions, publish
from celery_debounce.store import store_for
from celery_debounce.store.results import CONTRACT_VERSION


def _app(app_factory: Callable[..., Celery], **conf: Any) -> Celery:
    conf.setdefault("task_routes", {"proj.routed": {"queue": "reports", "priority": 7}})
    app = app_factory(**conf)

    @debounced(
        app,
        name="proj.routed",
        debounce="2s",
        debounce_max_wait="1m",
        debounce_key="r:{user_id}",
        debounce_exclusive=True,
    )
    def routed(user_id: str, n: int = 0, *rest: Any, flag: bool = True, **extra: Any) -> None:
        pass

    @debounced(
        app,
        name="proj.leading",
        debounce=1.5,
        debounce_max_wait=10,
        debounce_leading=True,
        debounce_max_calls=3,
    )
    def leading(a: Any, when: Any = datetime.date(2026, 1, 1), f: float = 1.0) -> None:
        pass

    @app.task(shared=False, name="proj.plain")
    def plain() -> None:
        pass

    @debounced(app, name="proj.off")
    def off() -> None:
        pass

    return app


def test_a_definition_holds_the_options_signature_route_and_settings_of_its_task(
    app_factory: Callable[..., Celery],
) -> None:
    app = _app(app_factory, debounce_shards=3)
    found = json.loads(definition(app, app.tasks["proj.routed"]) or "null")
    version = found.pop("version")
    options = json.loads(found.pop("options"))
    assert options == {"queue": "reports", "priority": 7, "headers": {"debounce_exclusive": 1}}
    assert found == {
        "format": DEFINITION_FORMAT,
        "contract": CONTRACT_VERSION,
        "task": "proj.routed",
        "debounce_ms": 2000,
        "max_wait_ms": 60000,
        "key": "r:{user_id}",
        "replace_payload": False,
        "max_calls": None,
        "leading": False,
        "trailing": True,
        "collect": False,
        "exclusive": True,
        "accepts_json": True,
        "check_arguments": True,
        "signature": [
            {"name": "user_id", "kind": "positional_or_keyword"},
            {"name": "n", "kind": "positional_or_keyword", "default": 0},
            {"name": "rest", "kind": "var_positional"},
            {"name": "flag", "kind": "keyword_only", "default": True},
            {"name": "extra", "kind": "var_keyword"},
        ],
        "shards": 3,
        "max_key_length": 1024,
        "max_payload_bytes": 1048576,
        "history_ttl_ms": found["history_ttl_ms"],
        "record_ttl_ms": 7 * 86_400_000,
        "result_expires_ms": found["result_expires_ms"],
    }
    assert len(version) == 16


def test_a_default_no_other_language_can_hold_as_python_does_is_marked_unusable(
    app_factory: Callable[..., Celery],
) -> None:
    app = _app(app_factory)
    found = json.loads(definition(app, app.tasks["proj.leading"]) or "null")
    assert found["signature"] == [
        {"name": "a", "kind": "positional_or_keyword"},
        {"name": "when", "kind": "positional_or_keyword", "default_unusable": True},
        {"name": "f", "kind": "positional_or_keyword", "default_unusable": True},  # 1.0
    ]
    assert json.loads(found["options"]) == {}
    assert (found["leading"], found["trailing"], found["max_calls"]) == (True, True, 3)


def test_only_debounced_tasks_have_a_definition_and_a_change_is_a_new_version(
    app_factory: Callable[..., Celery],
) -> None:
    app = _app(app_factory)
    found = definitions(app)
    # (shared tasks of other test modules join every app: only this module's are looked at)
    assert sorted(n for n in found if n.startswith("proj.")) == ["proj.leading", "proj.routed"]
    before = json.loads(found["proj.routed"])["version"]
    changed = _app(app_factory, task_routes={"proj.routed": {"queue": "other"}})
    after = json.loads(definitions(changed)["proj.routed"])
    assert json.loads(after["options"])["queue"] == "other"
    assert after["version"] != before


def test_publish_writes_what_changed_and_a_worker_writes_them_as_it_starts(
    app_factory: Callable[..., Celery], redis_client: redis.Redis, redis_server: str
) -> None:
    app = _app(app_factory)
    with running_worker(app):
        # Redis only: no store read lists every definition stored
        published = wait_until(lambda: redis_client.hgetall("debounce:tasks"))
    assert {k.decode(): v.decode() for k, v in published.items()} == definitions(app)


def test_the_publish_command_writes_what_is_new_or_changed(
    redis_server: str, redis_client: redis.Redis
) -> None:
    env = {**os.environ, "DEBOUNCE_TEST_REDIS_URL": redis_server}
    first = debounce_command("cli_app", env, "publish", "--json")
    assert first.returncode == 0, first.stderr
    answer = json.loads(first.stdout)
    assert list(answer["tasks"]) == ["reports.build"] and answer["written"] == 1
    found = store_for(make_app(redis_server)).task_definition("reports.build")
    stored = json.loads(found or "null")
    assert stored["version"] == answer["tasks"]["reports.build"]
    assert stored["key"] == "report:{0}" and stored["max_wait_ms"] == 7_200_000
    again = debounce_command("cli_app", env, "publish")
    assert again.returncode == 0, again.stderr
    assert "1 task definition(s), 0 written." in again.stdout


def test_send_task_of_a_task_not_registered_here_makes_the_call_delay_makes(
    app_factory: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    """A producer by name in Python reads the definition as Node does: same window,
    same binding, same route, same options; refusals as Node's."""
    from celery_debounce import send_task

    worker_app = _app(app_factory)
    publish(worker_app)
    producer = app_factory()  # no task registered: the worker app's tasks by name only
    by_name = send_task(producer, "proj.routed", ["u1"])
    again = send_task(producer, "proj.routed", [], {"user_id": "u1", "n": 0})
    local = worker_app.tasks["proj.routed"].delay("u1", 0)
    assert by_name.id == again.id == local.id
    record = open_payload(producer, "proj.routed", "r:u1")
    assert record is not None and record.calls == 3
    stored = json.loads(record.options_json)
    assert stored == {"queue": "reports", "priority": 7, "headers": {"debounce_exclusive": 1}}
    with pytest.raises(DebounceConfigError, match="'when', whose default only"):
        send_task(producer, "proj.leading", ["a"], {"f": 2.5})
    with pytest.raises(DebounceConfigError, match="do not match the task's signature"):
        send_task(producer, "proj.routed", [], {"n": 1})
    assert send_task(producer, "proj.leading", ["a", "2026-01-01", 1.0]).id


def test_a_task_whose_definition_cannot_be_made_is_left_out_and_the_others_published(
    app_factory: Callable[..., Celery],
) -> None:
    """A router function that refuses a call without arguments (it reads args[0]) keeps
    its own task's definition out, named, and no other's."""

    def by_first_argument(name: str, args: Any, kwargs: Any, options: Any, **kw: Any) -> Any:
        if name == "proj.picky":
            return {"queue": f"q-{args[0]}"}
        return None

    app = _app(app_factory, task_routes=(by_first_argument,))

    @debounced(app, name="proj.picky", debounce=1, debounce_max_wait=2)
    def picky(x: Any) -> None:
        pass

    skipped: dict[str, str] = {}
    found = definitions(app, skipped)
    assert "proj.routed" in found and "proj.leading" in found
    assert list(skipped) == ["proj.picky"] and "IndexError" in skipped["proj.picky"]
