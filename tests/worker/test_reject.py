"""``Reject`` in a window's run (issue 19, suspected item): final unless requeued.

Celery's ``task_postrun`` reports ``REJECTED``, which is not a ready state, so the
window stayed ``claimed`` and every alias waited forever, although a message
rejected without requeue never runs again (Celery 5.7 stores FAILURE for its id).
Now: ``Reject(requeue=False)``, or a requeue of a message already acked (no
``acks_late``), finishes the window as FAILURE with the ``Reject`` and fails every
alias; a requeue with ``acks_late`` waits for the run that follows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery, group
from celery.exceptions import Reject
from helpers import StoreCase, debounced, running_worker
from reads import state_of

pytestmark = pytest.mark.usefixtures("store")

TAG = "debounce:{0}"


@pytest.fixture
def japp(app_factory: Callable[..., Celery]) -> Iterator[Celery]:
    app = app_factory(result_expires=600)
    app.runs = []  # type: ignore[attr-defined]

    @debounced(
        app,
        name="rej.t",
        bind=True,
        acks_late=True,
        debounce="300ms",
        debounce_max_wait="3s",
        debounce_key="{0}",
    )
    def t(self: Any, x: int, requeue: bool) -> int:
        app.runs.append(x)  # type: ignore[attr-defined]
        if requeue and app.runs.count(x) == 1:  # type: ignore[attr-defined]
            raise Reject("once more", requeue=True)
        if not requeue:
            raise Reject("not this one", requeue=False)
        return x

    yield app


def _result_state(client: redis.Redis, task_id: str) -> Any:
    """The run's result state in the window's record (``rs``)."""
    return client.hget(f"{TAG}:win:{task_id}", "rs")


def test_reject_without_requeue_finishes_the_window_and_fails_every_alias(
    japp: Celery,
    redis_client: redis.Redis,
    store: StoreCase,
) -> None:
    t = japp.tasks["rej.t"]
    with running_worker(japp):
        first = t.delay(1, False)
        t.apply_async((1, False), task_id="caller-rejected")
        members = group(t.s(1, False), t.s(1, False)).apply_async()
        for result in [japp.AsyncResult("caller-rejected"), *members.results]:
            with pytest.raises(Reject):
                result.get(timeout=10)
    assert japp.runs == [1]  # type: ignore[attr-defined]
    assert state_of(japp, first.id) == "finished"
    if store.name == "redis":  # Redis only: no store read returns the result state
        assert _result_state(redis_client, first.id) == b"FAILURE"


def test_reject_with_requeue_waits_for_the_run_that_follows(
    japp: Celery,
    redis_client: redis.Redis,
    store: StoreCase,
) -> None:
    t = japp.tasks["rej.t"]
    with running_worker(japp):
        first = t.delay(2, True)
        t.apply_async((2, True), task_id="caller-requeued")
        assert japp.AsyncResult("caller-requeued").get(timeout=15) == 2
        assert first.get(timeout=5) == 2
    assert japp.runs == [2, 2]  # type: ignore[attr-defined]
    assert state_of(japp, first.id) == "finished"
    if store.name == "redis":  # Redis only: no store read returns the result state
        assert _result_state(redis_client, first.id) == b"SUCCESS"
