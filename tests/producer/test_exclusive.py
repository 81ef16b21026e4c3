"""debounce_exclusive through every way in: the window's stored options carry the header
take.lua looks for, and the combinations that cannot wait are refused by name."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import redis
from celery import Celery, group
from helpers import debounced, make_app, wait_until
from reads import held_count, held_idents, open_payload, state_of, store_time_ms

from celery_debounce import DebounceConfigError, DebouncedTask, enqueue_many, send_task
from celery_debounce.store.idents import window_ident


def _exclusive(app: Celery, task: str, key: str) -> bool:
    record = open_payload(app, task, key)
    return record is not None and '"debounce_exclusive"' in record.options_json


def test_every_way_in_marks_an_exclusive_window(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server)

    @debounced(
        app,
        name="ex.plain",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k:{0}",
        debounce_exclusive=True,
    )
    def plain(x: Any) -> Any:
        return x

    @debounced(
        app,
        name="ex.collect",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k:{0}",
        debounce_collect=True,
        debounce_exclusive=True,
    )
    def collect(calls: Any) -> Any:
        return calls

    @debounced(
        app,
        name="ex.off",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k:{0}",
    )
    def off(x: Any) -> Any:
        return x

    plain.delay("delay")
    plain.apply_async(("replace",), debounce_replace_payload=True)
    collect.delay("collect")
    enqueue_many(plain, [(("bulk",), {}), (("bulk",), {})])
    group(plain.s("canvas"), plain.s("canvas-2")).apply_async()
    send_task(
        app,
        "ex.byname",
        args=("n",),
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k:{0}",
        debounce_exclusive=True,
    )
    off.apply_async(("per-call",), debounce_exclusive=True)
    off.delay("not")
    off.apply_async(("joined",))
    off.apply_async(("joined",), debounce_exclusive=True)  # a joiner cannot change it
    for task, key in [
        ("ex.plain", "k:delay"),
        ("ex.plain", "k:replace"),
        ("ex.collect", "k:collect"),
        ("ex.plain", "k:bulk"),
        ("ex.plain", "k:canvas"),
        ("ex.plain", "k:canvas-2"),
        ("ex.byname", "k:n"),
        ("ex.off", "k:per-call"),
    ]:
        assert _exclusive(app, task, key), (task, key)
    assert not _exclusive(app, "ex.off", "k:not")
    assert not _exclusive(app, "ex.off", "k:joined")


@pytest.mark.parametrize(
    "options",
    [
        {"debounce_leading": True},
        {"debounce_max_calls": 5},
    ],
)
def test_exclusive_windows_that_cannot_wait_are_refused_by_name(
    redis_server: str, options: dict[str, Any]
) -> None:
    app = make_app(redis_server)
    with pytest.raises(DebounceConfigError, match="debounce_exclusive=True with"):

        @debounced(
            app,
            name="ex.refused",
            debounce="1h",
            debounce_max_wait="2h",
            debounce_exclusive=True,
            lazy=False,
            **options,
        )
        def refused(x: Any) -> Any:
            return x

    @debounced(app, name="ex.ok", debounce="1h", debounce_max_wait="2h")
    def ok(x: Any) -> Any:
        return x

    with pytest.raises(DebounceConfigError, match="debounce_exclusive=True with"):
        ok.apply_async((1,), debounce_exclusive=True, **options)
    with pytest.raises(DebounceConfigError, match="debounce_exclusive='yes'"):
        ok.apply_async((1,), debounce_exclusive="yes")


@pytest.mark.parametrize("expires", [2.0, None], ids=["expires", "no expires"])
def test_a_run_whose_message_the_broker_lost_holds_its_key_until_its_expires(
    redis_server: str, redis_client: redis.Redis, expires: float | None
) -> None:
    """A window of an exclusive task was published and acked, then the broker lost its
    message (a non-persistent broker restarted) before any worker got it: the record
    stays ``queued`` and the next window of the key is held behind it. With
    ``expires``, the hold ends when the message could no longer run anyway: once
    ``expires`` (plus the 2 s grace) has passed, the dispatcher finishes the lost
    window REVOKED, which frees the key, and the held window is published at once (not
    a dispatch lease later). Without ``expires`` no bound is sound (a message may wait
    in a queue for hours): the hold lasts until ``debounce_record_ttl``, and an operator
    who knows the message is lost publishes the held window with ``flush``."""
    from celery_debounce.dispatch.dispatcher import Dispatcher
    from celery_debounce.ops.admin import DebounceAdmin

    app = make_app(redis_server, debounce_dispatch_lease=30)

    @debounced(
        app,
        name="ex.lost",
        debounce="100ms",
        debounce_max_wait="1s",
        debounce_key="k:{0}",
        debounce_exclusive=True,
    )
    def lost(x: Any) -> Any:
        return x

    broker = redis.Redis.from_url(f"{redis_server}/1")
    dispatcher = Dispatcher(app, name="lost")
    first = lost.apply_async(("a",), expires=expires)
    record = f"debounce:{{0}}:win:{first.id}"
    wait_until(
        lambda: dispatcher.dispatch_once() is not None and state_of(app, first.id) == "queued",
        10,
    )
    published = time.monotonic()
    assert broker.llen("celery") == 1
    broker.delete("celery")  # the broker lost it: no worker will ever claim it
    follow = lost.delay("a")
    assert follow.id != first.id
    wait_until(
        lambda: (
            dispatcher.dispatch_once() is not None
            and window_ident("ex.lost", "k:a") in held_idents(app)
        ),
        10,
    )
    if expires is not None:
        wait_until(
            lambda: dispatcher.dispatch_once() is not None and broker.llen("celery") == 1,
            expires + 10,
        )
        # expires + the grace + the once-a-second sweep, never the 30 s dispatch lease
        assert time.monotonic() - published < expires + 2 + 10
        # Redis only: no store read returns a finished window's result state
        assert redis_client.hget(record, "rs") == b"REVOKED"
    else:
        until = time.monotonic() + 2.5
        while time.monotonic() < until:  # past the 2 s grace of an expiry: still held
            dispatcher.dispatch_once()
            time.sleep(0.1)
        assert broker.llen("celery") == 0
        assert state_of(app, first.id) == "queued"
        DebounceAdmin(app).flush("ex.lost", "k:a")  # celery debounce flush --task --key
        wait_until(
            lambda: dispatcher.dispatch_once() is not None and broker.llen("celery") == 1, 10
        )
    assert state_of(app, follow.id) == "queued"
    assert held_count(app) == 0  # held no more
    assert (  # Redis only: no store read names the run that owns a key
        redis_client.hget(f"debounce:{{0}}:run:{window_ident('ex.lost', 'k:a')}", "id")
        == follow.id.encode()
    )


def test_a_cancelled_held_window_is_held_no_more(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """Cancelling a window held behind a run of its key drops it from <tag>:held too (a
    stale entry would list it in inspect and top, and keep the key's next window from
    being published the moment the run ends)."""
    from celery_debounce.dispatch.dispatcher import Dispatcher
    from celery_debounce.ops.admin import DebounceAdmin

    app = make_app(redis_server)

    @debounced(
        app,
        name="ex.cancelled",
        debounce="100ms",
        debounce_max_wait="1s",
        debounce_key="k:{0}",
        debounce_exclusive=True,
    )
    def cancelled(x: Any) -> Any:
        return x

    dispatcher = Dispatcher(app, name="cancel")
    first = cancelled.delay("c")
    wait_until(
        lambda: dispatcher.dispatch_once() is not None and state_of(app, first.id) == "queued",
        10,
    )
    cancelled.delay("c")
    ident = window_ident("ex.cancelled", "k:c")
    wait_until(
        lambda: dispatcher.dispatch_once() is not None and ident in held_idents(app),
        10,
    )
    DebounceAdmin(app).cancel("ex.cancelled", "k:c")
    assert held_count(app) == 0


def test_a_run_put_back_with_reject_requeue_holds_its_key_until_it_ran_again(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """An exclusive run raises ``Reject(requeue=True)`` (``acks_late``): its message goes
    back to the queue, behind a backlog here, and its window is ``queued`` again, so the
    window held behind it stays held. The follow-up starts after the requeued delivery
    ran and ended, never beside it or before it (a threads worker that runs two at
    once). Before, the requeue ended the claim, which freed the key: the follow-up was
    published at once and ran next to the requeued run."""
    from celery.exceptions import Reject
    from helpers import running_worker

    app = make_app(
        redis_server, task_acks_late=True, worker_prefetch_multiplier=1, task_ignore_result=True
    )
    log: list[str] = []  # the threads pool runs in this process
    attempts = itertools.count(1)

    def now_ms() -> int:
        return store_time_ms(app)

    @debounced(
        app,
        name="ex.requeued",
        bind=True,
        debounce="100ms",
        debounce_max_wait="1s",
        debounce_key="k:{0}",
        debounce_exclusive=True,
    )
    def requeued(self: DebouncedTask, key: str, n: int = 0) -> int:
        log.append(f"start {self.request.id} {now_ms()}")
        if n == 0 and next(attempts) == 1:
            wait_until(lambda: held_count(app), 10)
            for _ in range(2):  # a backlog the requeued message waits behind
                backlog.delay(0.5)
            log.append(f"end {self.request.id} {now_ms()}")
            raise Reject("not now", requeue=True)
        time.sleep(1.0)
        log.append(f"end {self.request.id} {now_ms()}")
        return n

    @app.task(shared=False, name="ex.backlog")
    def backlog(seconds: float) -> None:
        time.sleep(seconds)

    with running_worker(app, pool="threads", concurrency=2):
        first = requeued.delay("a")
        wait_until(lambda: log, 10)
        follow = requeued.delay("a", 1)
        assert follow.id != first.id
        wait_until(lambda: len(log) == 6, 20)
        time.sleep(0.5)  # nothing more runs
    events = [r.split() for r in list(log)]
    assert [e[:2] for e in events] == [
        ["start", first.id],
        ["end", first.id],  # put back
        ["start", first.id],
        ["end", first.id],  # ran again
        ["start", follow.id],
        ["end", follow.id],
    ], events
    assert int(events[4][2]) >= int(events[3][2])  # after the requeued run ended
