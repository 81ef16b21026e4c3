"""Every id a caller holds resolves: canvas (group, chord, chain) members and
caller-chosen task ids whose calls join one window, with a real worker and the
Redis result backend; a reused caller id never overwrites a window."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group
from celery.exceptions import TaskRevokedError
from helpers import debounced, make_app, running_worker, wait_until

from celery_debounce.ops.admin import DebounceAdmin


@pytest.fixture
def capp(redis_server: str, redis_client: redis.Redis) -> Iterator[Celery]:
    app = make_app(redis_server, result_expires=600)
    app.runs = []  # type: ignore[attr-defined]
    app.gate = threading.Event()  # type: ignore[attr-defined]
    app.gate.set()  # type: ignore[attr-defined]

    @debounced(
        app,
        name="canvas.t",
        bind=True,
        debounce="500ms",
        debounce_max_wait="3s",
        debounce_key="{0}",
    )
    def t(self: Any, x: int) -> int:
        app.runs.append((self.request.id, x))  # type: ignore[attr-defined]
        assert app.gate.wait(20)  # type: ignore[attr-defined]
        if x < 0:
            raise ValueError(f"negative: {x}")
        return x * 10

    @app.task(shared=False, name="canvas.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(shared=False, name="canvas.collect")
    def collect(results: list[int]) -> list[int]:
        return sorted(results)

    yield app


def test_a_group_whose_members_join_one_window_completes(capp: Celery) -> None:
    t = capp.tasks["canvas.t"]
    with running_worker(capp):
        result = group(t.s(5), t.s(5), t.s(6)).apply_async()
        assert result.get(timeout=15) == [50, 50, 60]
        assert [r.get(timeout=5) for r in result.results] == [50, 50, 60]
    assert sorted(x for _, x in capp.runs) == [5, 6]  # type: ignore[attr-defined]


def test_a_chord_whose_members_join_one_window_runs_its_body(capp: Celery) -> None:
    t = capp.tasks["canvas.t"]
    with running_worker(capp):
        result = chord([t.s(5), t.s(5), t.s(7)], capp.tasks["canvas.collect"].s()).apply_async()
        assert result.get(timeout=15) == [50, 50, 70]
    assert sorted(x for _, x in capp.runs) == [5, 7]  # type: ignore[attr-defined]


def test_a_chain_whose_first_task_joins_a_window_runs_its_tail(capp: Celery) -> None:
    t = capp.tasks["canvas.t"]
    with running_worker(capp):
        plain = t.delay(5)  # opens the window
        chained = chain(t.s(5), capp.tasks["canvas.add"].s(1)).apply_async()  # joins it
        assert chained.get(timeout=15) == 51
        assert chained.parent.get(timeout=5) == 50
        assert plain.get(timeout=5) == 50
    assert [x for _, x in capp.runs] == [5]  # type: ignore[attr-defined]


def test_group_members_joining_a_window_opened_by_a_plain_call(capp: Celery) -> None:
    t = capp.tasks["canvas.t"]
    with running_worker(capp):
        plain = t.delay(8)
        result = group(t.s(8), t.s(8)).apply_async()
        assert result.get(timeout=15) == [80, 80]
        assert plain.get(timeout=5) == 80
    assert [x for _, x in capp.runs] == [8]  # type: ignore[attr-defined]


def test_a_failed_run_fails_every_alias(capp: Celery) -> None:
    t = capp.tasks["canvas.t"]
    with running_worker(capp):
        result = group(t.s(-1), t.s(-1)).apply_async()
        for member in result.results:
            with pytest.raises(ValueError, match="negative"):
                member.get(timeout=15)
    assert len(capp.runs) == 1  # type: ignore[attr-defined]


def test_a_caller_id_reused_during_a_run_opens_a_new_window(capp: Celery) -> None:
    """Window 1 runs under reindex-7 (held in its run); the same id called again opens
    window 2 under another id; both run, and reindex-7 resolves to the later run."""
    t = capp.tasks["canvas.t"]
    admin = DebounceAdmin(capp)
    capp.gate.clear()  # type: ignore[attr-defined]
    with running_worker(capp):
        first = t.apply_async((1,), task_id="reindex-7")
        assert first.id == "reindex-7"
        wait_until(lambda: capp.runs, timeout=10)  # type: ignore[attr-defined]
        assert admin.find("reindex-7").state == "claimed"  # type: ignore[union-attr]
        second = t.apply_async((1,), task_id="reindex-7")
        assert second.id != "reindex-7"
        capp.gate.set()  # type: ignore[attr-defined]
        assert second.get(timeout=15) == 10
        third = t.apply_async((1,), task_id="reindex-7")  # sequentially: record finished
        assert third.id not in ("reindex-7", second.id)
        assert third.get(timeout=15) == 10
    assert [tid for tid, _ in capp.runs] == ["reindex-7", second.id, third.id]  # type: ignore[attr-defined]
    assert admin.find("reindex-7").state == "finished"  # type: ignore[union-attr]


def test_cancelling_a_window_revokes_every_id_callers_hold(capp: Celery) -> None:
    t = capp.tasks["canvas.t"]
    plain = t.delay(9)
    members = group(t.s(9), t.s(9)).apply_async()
    chosen = t.apply_async((9,), task_id="mine")
    assert chosen.id == plain.id  # joined: "mine" is an alias
    DebounceAdmin(capp).cancel("canvas.t", "9")
    for held in [plain, *members.results, capp.AsyncResult("mine")]:
        with pytest.raises(TaskRevokedError):
            held.get(timeout=5)
