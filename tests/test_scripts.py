"""The Lua scripts, driven directly, on fakeredis (fast) and on the real redis-server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import fakeredis
import pytest
import redis
from celery import Celery
from helpers import wait_until

from celery_debounce.backend import Backend
from celery_debounce.call import prepare_call
from celery_debounce.dispatcher import take_due
from celery_debounce.gate import enter
from celery_debounce.options import build_spec
from celery_debounce.settings import Settings


@pytest.fixture(params=["fakeredis", "redis-server"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    app = Celery("scripts", set_as_current=False)
    if request.param == "fakeredis":
        app.conf.debounce_redis_url = "redis://fake"
        client: redis.Redis = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        url = request.getfixturevalue("redis_server")
        request.getfixturevalue("redis_client")  # flushes
        app.conf.debounce_redis_url = f"{url}/0"
        client = redis.Redis.from_url(f"{url}/0")
    yield Backend(Settings.from_app(app), client=client)
    client.close()


def call(backend: Backend, key: str, window: str = "1m", max_wait: str = "5m",
         replace: bool = False, payload: int = 0, task: str = "t") -> object:
    spec = build_spec(window, "{0}", max_wait, replace)
    prepared = prepare_call(backend.settings, task, spec, (key, payload), {}, {}, None, "json")
    return enter(backend, prepared)


def test_open_then_join_moves_the_deadline_never_past_the_ceiling(backend: Backend) -> None:
    first = call(backend, "k", window="1m", max_wait="90s")
    assert first.opened and first.calls == 1
    assert first.deadline_ms == first.now_ms + 60_000
    second = call(backend, "k", window="1m", max_wait="90s")
    assert not second.opened and second.task_id == first.task_id and second.calls == 2
    assert second.deadline_ms >= first.deadline_ms
    # a longer per-call window cannot push past the opener's ceiling (first_seen + 90 s)
    third = call(backend, "k", window="10m", max_wait="1h")
    assert third.deadline_ms == first.now_ms + 90_000


def test_take_closes_the_window_and_the_next_call_opens_a_new_one(backend: Backend) -> None:
    first = call(backend, "k", window="10ms", max_wait="1s", payload=1)
    taken = wait_until(lambda: take_due(backend, 0, 10).windows, timeout=5)
    assert [w.task_id for w in taken] == [first.task_id]
    assert taken[0].key == "k" and taken[0].task_name == "t" and taken[0].calls == 1
    assert taken[0].deadline_ms <= taken[0].taken_ms
    again = call(backend, "k", window="10ms", max_wait="1s", payload=2)
    assert again.opened and again.task_id != first.task_id
    # taken once: a second take returns only the new window
    later = wait_until(lambda: take_due(backend, 0, 10).windows, timeout=5)
    assert [w.task_id for w in later] == [again.task_id]


def test_replace_payload_keeps_the_newest_arguments(backend: Backend) -> None:
    call(backend, "k", window="10ms", max_wait="1s", payload=1, replace=True)
    call(backend, "k", window="10ms", max_wait="1s", payload=2, replace=True)
    call(backend, "k", window="10ms", max_wait="1s", payload=3, replace=False)
    (window,) = wait_until(lambda: take_due(backend, 0, 10).windows, timeout=5)
    assert window.payload == b'[["k", 2], {}, {}]'  # protocol-2 body: args, kwargs, embed


def test_an_unconfirmed_publish_is_taken_again_after_its_lease(backend: Backend) -> None:
    backend.settings = replace(backend.settings, dispatch_lease_ms=50)
    first = call(backend, "k", window="1ms", max_wait="1s")
    (taken,) = wait_until(lambda: take_due(backend, 0, 10).windows, timeout=5)
    assert taken.tries == 1
    # the dispatcher "died": no ack. After the lease, the same window comes back.
    (again,) = wait_until(lambda: take_due(backend, 0, 10).windows, timeout=5)
    assert again.task_id == first.task_id and again.tries == 2
    tag = backend.settings.tag(0)
    backend.run("ack", [f"{tag}:leased", f"{tag}:active"], [tag, first.task_id])
    assert backend.client.hget(f"{tag}:win:{first.task_id}", "st") == b"queued"


def test_claim_and_finish_leave_only_a_ttld_history(backend: Backend) -> None:
    first = call(backend, "k", window="1ms", max_wait="1s")
    wait_until(lambda: take_due(backend, 0, 10).windows, timeout=5)
    tag = backend.settings.tag(0)
    keys = [f"{tag}:win:{first.task_id}", f"{tag}:leased", f"{tag}:active"]
    assert backend.run("claim", keys, [first.task_id]) == b"dispatching"
    assert backend.run("finish", keys, [first.task_id, "SUCCESS", 60_000]) == 1
    assert backend.client.hget(keys[0], "st") == b"finished"
    assert 0 < backend.client.pttl(keys[0]) <= 60_000
    # only the TTL'd history record and the TTL'd dispatch counters remain
    assert sorted(backend.client.keys("*")) == sorted([keys[0].encode(), f"{tag}:stats".encode()])
    assert backend.client.pttl(f"{tag}:stats") > 0
