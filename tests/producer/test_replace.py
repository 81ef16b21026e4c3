"""Every id resolves through ``self.replace()`` (issue 19, item 6).

A window's run that replaces itself ends IGNORED; Celery runs the replacement under
the window's id, but the window's aliases (group, chord and chain members,
``task_id=`` callers) are ours: they get the replacement's outcome. Real worker,
Redis result backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group
from helpers import debounced, make_app, running_worker

TAG = "debounce:{0}"


@pytest.fixture
def rapp(redis_server: str, redis_client: redis.Redis) -> Iterator[Celery]:
    app = make_app(redis_server, result_expires=600)

    @app.task(shared=False, name="rep.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(shared=False, name="rep.boom")
    def boom(x: int) -> int:
        raise ValueError(f"boom {x}")

    @app.task(shared=False, name="rep.collect")
    def collect(results: list[int]) -> list[int]:
        return sorted(results)

    @debounced(
        app,
        name="rep.t",
        bind=True,
        debounce="300ms",
        debounce_max_wait="3s",
        debounce_key="{0}",
    )
    def t(self: Any, x: int, how: str = "task") -> Any:
        if how == "task":
            return self.replace(add.s(x, 1000))
        if how == "chain":
            return self.replace(chain(add.s(x, 1), add.s(1000)))
        if how == "group":
            return self.replace(group(add.s(x, 1), add.s(x, 2)))
        if how == "twice":
            return self.replace(app.tasks["rep.again"].s(x))
        if how == "debounced":  # the replacement goes through the gate itself
            return self.replace(app.tasks["rep.d"].s(x))
        return self.replace(boom.s(x))

    @debounced(
        app,
        name="rep.d",
        debounce="200ms",
        debounce_max_wait="1s",
        debounce_key="{0}",
    )
    def d(x: int) -> int:
        return x + 3000

    @app.task(shared=False, name="rep.again", bind=True)
    def again(self: Any, x: int) -> Any:
        return self.replace(add.s(x, 2000))

    yield app


def _finished(client: redis.Redis, task_id: str) -> bytes | None:
    return client.hget(f"{TAG}:win:{task_id}", "rs")  # type: ignore[return-value]


def test_a_group_whose_members_join_a_replaced_window_completes(
    rapp: Celery,
    redis_client: redis.Redis,
) -> None:
    t = rapp.tasks["rep.t"]
    with running_worker(rapp):
        result = group(t.s(5), t.s(5), t.s(6)).apply_async()
        assert result.get(timeout=15) == [1005, 1005, 1006]
        assert [r.get(timeout=5) for r in result.results] == [1005, 1005, 1006]


@pytest.mark.parametrize(
    ("how", "want"),
    [("task", 1007), ("chain", 1008), ("group", [8, 9]), ("twice", 2007), ("debounced", 3007)],
)
def test_every_id_of_a_replaced_window_resolves_to_the_replacements_result(
    rapp: Celery,
    redis_client: redis.Redis,
    how: str,
    want: Any,
) -> None:
    """A default call, a caller's task_id= and a chord member all join one window
    whose run replaces itself (with a task, a chain, a group, a task that replaces
    itself again): every id gets the replacement's result; the window finishes as
    SUCCESS, not IGNORED."""
    t = rapp.tasks["rep.t"]
    with running_worker(rapp):
        first = t.delay(7, how)
        fixed = t.apply_async((7, how), task_id="caller-chosen")
        body = chord([t.s(7, how), t.s(7, how)], rapp.tasks["rep.collect"].s()).apply_async()
        assert first.get(timeout=15) == want
        assert rapp.AsyncResult("caller-chosen").get(timeout=10) == want
        assert fixed.get(timeout=10) == want
        assert body.get(timeout=10) == [want, want]
    assert _finished(redis_client, first.id) == b"SUCCESS"


def test_a_chain_whose_head_is_replaced_runs_its_tail(rapp: Celery) -> None:
    t = rapp.tasks["rep.t"]
    add = rapp.tasks["rep.add"]
    with running_worker(rapp):
        result = chain(t.s(3), add.s(1)).apply_async()
        assert result.get(timeout=15) == 1004


def test_a_failed_replacement_fails_every_alias(rapp: Celery, redis_client: redis.Redis) -> None:
    t = rapp.tasks["rep.t"]
    with running_worker(rapp):
        first = t.delay(9, "boom")
        t.apply_async((9, "boom"), task_id="caller-boom")
        members = group(t.s(9, "boom"), t.s(9, "boom")).apply_async()
        with pytest.raises(ValueError, match="boom 9"):
            first.get(timeout=15)
        with pytest.raises(ValueError, match="boom 9"):
            rapp.AsyncResult("caller-boom").get(timeout=10)
        for member in members.results:
            with pytest.raises(ValueError, match="boom 9"):
                member.get(timeout=10)
    assert _finished(redis_client, first.id) == b"FAILURE"
