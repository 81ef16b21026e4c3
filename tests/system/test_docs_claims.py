"""Behaviour the docs (faq.md, concepts.md) state, checked on a real Redis and worker."""

from __future__ import annotations

from typing import Any

from celery import Celery, chain
from helpers import debounced, running_worker

from celery_debounce.ops.read_view import list_windows
from celery_debounce.testing import debounce_windows


def test_signatures_go_through_the_gate(app: Celery) -> None:
    runs: list[int] = []

    @debounced(
        app,
        debounce="300ms",
        debounce_key="k:{0}",
        debounce_max_wait="5s",
    )
    def work(user: str, n: int) -> int:
        runs.append(n)
        return n

    first = work.s("u", 1).apply_async()
    assert work.s("u", 2).delay().id == first.id
    assert work.signature(("u", 3)).apply_async().id == first.id
    [window] = debounce_windows(app)
    assert window.calls == 3
    with running_worker(app):
        assert first.get(timeout=10) == 1
    assert runs == [1]


def test_chain_with_a_debounced_head_runs_its_tail_once(app: Celery) -> None:
    tails: list[Any] = []

    @debounced(app, debounce="300ms", debounce_key="k", debounce_max_wait="5s")
    def head(n: int) -> int:
        return n * 10

    @app.task(shared=False)
    def tail(value: int) -> int:
        tails.append(value)
        return value + 1

    opener = chain(head.s(1), tail.s()).apply_async()
    joiner = chain(head.s(2), tail.s()).apply_async()
    [window] = debounce_windows(app)
    assert window.calls == 2 and window.args == (1,)
    # a chain freezes its ids before calling the head: the opener's head id is the
    # window id; the joiner's head id is an alias of the window (docs/faq.md)
    assert opener.parent.id == window.task_id
    assert joiner.parent.id != window.task_id
    with running_worker(app):
        assert opener.get(timeout=10) == 11  # the opener's chain continues
        assert joiner.get(timeout=10) == 11  # so does the joiner's, after the one run
        assert joiner.parent.get(timeout=10) == 10
    assert tails == [10, 10]  # each chain's tail once, with the window's result


def test_later_calls_move_the_deadline_with_their_own_window_under_the_openers_ceiling(
    app: Celery,
) -> None:
    @debounced(app, debounce="10s", debounce_key="k", debounce_max_wait="20s")
    def work() -> None:
        pass

    opener = work.apply_async(task_id="chosen-by-opener", queue="opener-queue")
    joiner = work.apply_async(
        task_id="ignored", queue="ignored-queue", debounce="1h", debounce_max_wait="2h"
    )
    assert opener.id == joiner.id == "chosen-by-opener"
    [window] = debounce_windows(app)
    assert window.options == {"queue": "opener-queue"}  # a joiner's options are ignored
    # the joiner's 1 h window would be later than the opener's 20 s ceiling: the ceiling wins
    assert round(window.deadline - window.first_seen, 3) == 20.0
    work.apply_async(debounce="1s")  # a shorter window pulls the deadline in
    [window] = debounce_windows(app)
    assert window.deadline - window.first_seen < 10
    assert [w.task_id for w in list_windows(app)] == ["chosen-by-opener"]
