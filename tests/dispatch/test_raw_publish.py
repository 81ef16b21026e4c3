"""The dispatcher publishes the stored protocol-2 body as it is (issue 9, item 10).

It never deserializes a payload, never goes through ``app.send_task`` (which also
subscribes the result backend to every id), and builds only headers.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, running_worker, wait_until
from reads import open_payload, state_of, taken_record

from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.store.idents import window_ident

pytestmark = pytest.mark.usefixtures("store")

TAG = "debounce:{0}"


class _Touch:
    """Unpickling this creates ``path``: stands for any code a pickle can run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(self.path),))


def _due(app: Celery) -> None:
    import time

    time.sleep(0.01)  # 1 ms windows


def _payload(app: Celery, task: Any, key: str) -> bytes | None:
    """The stored body of the open window of ``key``, read through the store."""
    record = open_payload(app, task.name, key)
    return None if record is None else record.payload


def _task(app: Celery, name: str = "raw.t", **opts: Any) -> Any:
    opts.setdefault("debounce_key", "{0}")

    @debounced(app, name=name, debounce="1ms", debounce_max_wait="1ms", **opts)
    def t(x: Any) -> Any:
        return x

    return t


@pytest.mark.redis_only("a forged record planted in Redis")
def test_a_forged_pickle_record_runs_nothing_in_the_dispatcher(
    app_factory: Any,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    """A writer to the windows' Redis forges a pickle body; the app accepts pickle.

    The dispatcher publishes it without loading it: the file is not created in the
    dispatcher process. The worker then unpickles it, as Celery always did with
    pickle messages: a writer to the windows' Redis has the power of a writer to
    the broker, no more.
    """
    app = app_factory(task_serializer="pickle", accept_content=["json", "pickle"])
    task = _task(app)
    result = task.delay("harmless")
    marker = tmp_path / "pwned"
    forged = pickle.dumps(([_Touch(str(marker))], {}, {}))
    # Redis only: a writer to the windows' Redis forges the body
    redis_client.hset(f"{TAG}:open:{window_ident(task.name, 'harmless')}", "p", forged)
    _due(app)
    published, _ = Dispatcher(app).dispatch_once()
    assert not marker.exists()  # nothing ran in the dispatcher
    assert published == 1
    broker = redis.Redis.from_url(app.conf.broker_url)
    (raw,) = broker.lrange("celery", 0, -1)
    message = json.loads(raw)
    assert message["content-type"] == "application/x-python-serialize"
    with running_worker(app):
        assert result.get(timeout=10) is None  # Path.touch returned None: the worker ran it
    assert marker.exists()


def test_dispatching_subscribes_nothing_on_the_result_backend(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """app.send_task subscribes the Redis result backend to every id it publishes;
    the dispatcher publishes without it (issue 13's per-window subscribe/unsubscribe)."""
    app = app_factory()
    task = _task(app)
    ids = [task.delay(f"s{i}").id for i in range(20)]
    _due(app)
    dispatcher = Dispatcher(app)
    results = redis.Redis.from_url(app.conf.result_backend)

    def subscribes() -> int:
        stats: dict[str, Any] = results.info("commandstats")
        return int(stats.get("cmdstat_subscribe", {}).get("calls", 0))

    before = subscribes()
    assert dispatcher.dispatch_once()[0] == 20
    assert subscribes() == before  # not one SUBSCRIBE (app.send_task sends one per id)
    counts = dict(results.pubsub_numsub(*(f"celery-task-meta-{tid}" for tid in ids)))
    assert set(counts.values()) == {0}


def test_the_stored_body_is_celerys_protocol_2_body(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    app = app_factory()
    task = _task(app)
    task.delay("a")
    assert _payload(app, task, "a") == b'[["a"], {}, {}]'
    link = task.si("after")
    task.apply_async(("b",), link=link, link_error=[link])
    body = json.loads(_payload(app, task, "b"))
    assert body[0] == ["b"] and body[1] == {}
    as_json = json.loads(json.dumps(dict(link)))
    assert body[2] == {"callbacks": [as_json], "errbacks": [as_json]}


def test_the_worker_gets_the_stored_body_headers_and_callbacks(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    app = app_factory()
    seen: dict[str, Any] = {}

    @debounced(
        app,
        name="raw.see",
        bind=True,
        debounce="300ms",
        debounce_max_wait="5s",
        debounce_key="k",
    )
    def see(self: Any, x: Any) -> Any:
        seen.update(
            argsrepr=self.request.argsrepr,
            shard=self.request.debounce_shard,
            calls=self.request.debounce_calls,
            custom=(self.request.headers or {}).get("custom"),
            timelimit=self.request.timelimit,
            args=self.request.args,
        )
        return x

    @app.task(shared=False, name="raw.after")
    def after(x: Any) -> Any:
        seen["after"] = x
        return x

    first = see.apply_async((1,), headers={"custom": "yes"}, time_limit=30, link=after.s())
    for i in range(2, 4):
        see.delay(i)
    with running_worker(app):
        assert first.get(timeout=10) == 1  # the opener's arguments: no replace_payload
        wait_until(lambda: "after" in seen)
    assert seen["argsrepr"] == "[1]" and seen["calls"] == 3  # the run's own arguments
    assert seen["shard"] == 0 and seen["custom"] == "yes"
    assert seen["args"] == [1] and seen["after"] == 1
    assert list(seen["timelimit"]) == [30, None]


@pytest.mark.redis_only("a legacy record planted in Redis")
def test_a_legacy_two_element_record_is_quarantined_not_sent_to_crash_a_worker(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """0.1 stored ``[args, kwargs]``; Celery's worker stops on such a body
    ("Unrecoverable error"). No migration: the dispatcher checks a JSON body's shape
    (parsing JSON runs no code) and quarantines it with the reason; other windows,
    and the worker that embeds the dispatcher, keep running."""
    app = app_factory()
    task = _task(app)
    old = task.delay("old")
    # Redis only: a body as 0.1 stored it
    redis_client.hset(f"{TAG}:open:{window_ident(task.name, 'old')}", "p", b'[["old"], {}]')
    _due(app)
    with running_worker(app):
        wait_until(lambda: state_of(app, old.id) == "quarantined")
        assert task.delay("new").get(timeout=10) == "new"
    record = taken_record(app, old.id)
    reason = record.error if record is not None else None
    assert reason is not None
    assert "protocol-2 body" in reason and "0.1" in reason


def test_ignore_result_is_the_tasks_own_unless_the_call_sets_it(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """The header is left out unless the call passes ``ignore_result``: in Celery 5.7
    a request's header overrides the task's own ``ignore_result``; in 5.3-5.6 the
    worker reads only the task's. Either way a debounced call stores its result
    exactly when the same call to a plain twin task does."""
    import celery.app.task as celery_task

    app = app_factory()
    done: list[str] = []

    @debounced(
        app,
        name="raw.quiet",
        ignore_result=True,
        debounce="1ms",
        debounce_max_wait="1ms",
        debounce_key="{0}",
    )
    def quiet(x: str) -> str:
        done.append(x)
        return x

    @app.task(shared=False, name="raw.quiet_plain", ignore_result=True)
    def quiet_plain(x: str) -> str:
        done.append(x)
        return x

    @app.task(shared=False, name="raw.last")
    def last() -> str:
        return "last"

    results = redis.Redis.from_url(app.conf.result_backend)
    with running_worker(app):
        silent = quiet.delay("a")
        kept = quiet.apply_async(("b",), ignore_result=False)
        plain_silent = quiet_plain.delay("pa")
        plain_kept = quiet_plain.apply_async(("pb",), ignore_result=False)
        wait_until(lambda: {"a", "b", "pa", "pb"} <= set(done))
        # the solo pool runs one task at a time: once this one ran, the four are stored
        assert last.delay().get(timeout=10) == "last"

    def stored(task_id: str) -> bool:
        return results.get(f"celery-task-meta-{task_id}") is not None

    assert stored(silent.id) is stored(plain_silent.id) is False
    assert stored(kept.id) is stored(plain_kept.id)
    if hasattr(celery_task, "get_actual_ignore_result"):  # Celery 5.7: the header wins
        assert stored(kept.id)


def test_an_opener_in_a_group_or_chord_carries_its_group_and_chord_as_plain_celery(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """group_id/group_index go to the headers and chord/chain into the stored body's
    embed, as app.send_task puts them: members that open their own window complete
    their group and chord (members joining one window: the canvas work of issue 9.6)."""
    from celery import chain, chord, group

    app = app_factory()

    @debounced(
        app,
        name="raw.member",
        debounce="50ms",
        debounce_max_wait="1s",
        debounce_key="{0}",
    )
    def member(x: int) -> int:
        return x * 2

    @app.task(shared=False, name="raw.total")
    def total(xs: list[int]) -> int:
        return sum(xs)

    @app.task(shared=False, name="raw.plus")
    def plus(x: int, y: int) -> int:
        return x + y

    with running_worker(app):
        assert group(member.s(1), member.s(2)).apply_async().get(timeout=15) == [2, 4]
        assert chord([member.s(3), member.s(4)])(total.s()).get(timeout=15) == 14
        assert chain(member.s(5), plus.s(1)).apply_async().get(timeout=15) == 11
