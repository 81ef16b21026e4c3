"""Correctness of the hot-path shortcuts: cached argument binding, compact records."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, running_worker
from reads import open_records

from celery_debounce.producer.call import bind_arguments, encode


def _slow(sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.values()), dict(bound.arguments)


def f(a: Any, b: Any = 2, c: Any = None) -> None: ...


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1,), {}),
        ((1, 5), {}),
        ((1, 5, 6), {}),
        ((), {"a": 1}),
        ((1,), {"c": 3}),
        ((), {"c": 3, "a": 0, "b": 1}),
    ],
)
def test_fast_binding_matches_inspect(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    sig = inspect.signature(f)
    assert bind_arguments(sig, args, kwargs) == _slow(sig, args, kwargs)
    assert list(bind_arguments(sig, args, kwargs)[1]) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        ((1, 2, 3, 4), {}),
        ((1,), {"a": 1}),
        ((1,), {"zz": 1}),
    ],
)
def test_fast_binding_keeps_inspect_errors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        bind_arguments(inspect.signature(f), args, kwargs)


def test_encode_matches_kombu_and_raises_its_error() -> None:
    from kombu import serialization
    from kombu.exceptions import EncodeError

    ct, _, data = serialization.dumps([[1, "x"], {"k": 2}], serializer="json")
    assert encode([[1, "x"], {"k": 2}], "json") == (ct, data.encode())
    with pytest.raises(EncodeError):
        encode([[object()], {}], "json")


def test_default_content_type_and_empty_options_are_not_stored(
    app: Celery, redis_client: redis.Redis
) -> None:
    app.conf.accept_content = ["json", "pickle"]
    runs: list[Any] = []

    @debounced(app, debounce="200ms", debounce_key="k", debounce_max_wait="5s")
    def plain(x: Any) -> None:
        runs.append(x)

    @debounced(
        app,
        debounce="200ms",
        debounce_key="k",
        debounce_max_wait="5s",
        serializer="pickle",
    )
    def pickled(x: Any) -> None:
        runs.append(x)

    plain.delay(1)
    pickled.delay({1, 2})
    records = {  # Redis only: the fields a call leaves out of its hash
        k: redis_client.hgetall(k) for k in redis_client.scan_iter(match="debounce:*:open:*")
    }
    by_task = {k.decode().split(":")[4].rsplit(".", 1)[-1]: v for k, v in records.items()}
    assert b"ct" not in by_task["plain"] and b"o" not in by_task["plain"]
    assert by_task["pickled"][b"ct"] == b"application/x-python-serialize"
    with running_worker(app):
        from helpers import wait_until

        wait_until(lambda: len(runs) == 2)
    assert sorted(map(repr, runs)) == ["1", "{1, 2}"]


def test_direct_evalsha_survives_script_flush_and_a_killed_connection(
    app: Celery, redis_client: redis.Redis
) -> None:
    from celery_debounce.store import store_for

    @debounced(app, debounce="1h", debounce_key="k", debounce_max_wait="2h")
    def hot(x: Any) -> None: ...

    backend = store_for(app)
    assert backend.direct
    first = hot.delay(1)
    # Redis only: a script flush, then killed connections
    redis_client.script_flush()  # NOSCRIPT on the direct path: loaded again, run once
    assert hot.delay(2).id == first.id
    redis_client.client_kill_filter(_type="normal", skipme=True)  # pooled connections die
    assert hot.delay(3).id == first.id  # the pool reconnects a killed connection on checkout
    assert open_records(app)[0].calls == 3  # each call counted exactly once


def test_wake_is_published_only_when_a_call_makes_its_window_the_earliest(
    app: Celery, redis_client: redis.Redis
) -> None:
    @debounced(app, debounce="10m", debounce_key="{0}", debounce_max_wait="1h")
    def task(key: str) -> None: ...

    # Redis only: the wake channel
    pubsub = redis_client.pubsub()
    pubsub.subscribe("debounce:wake")
    assert pubsub.get_message(timeout=1)["type"] == "subscribe"  # type: ignore[index]

    def wakes() -> list[bytes]:
        got = []
        while (message := pubsub.get_message(timeout=0.2)) is not None:
            got.append(message["data"])
        return got

    task.delay("a")  # the only window: earliest
    assert len(wakes()) == 1
    task.apply_async(("b",), debounce="20m")  # later than a: no wake
    task.delay("a")  # a moves later (GT applies): no wake
    assert wakes() == []
    task.apply_async(("b",), debounce="1s")  # b moves earlier than a: wake
    assert len(wakes()) == 1
    due = [r.ident or "" for r in open_records(app)]  # in deadline order
    assert due[0].endswith(":b") and due[1].endswith(":a")
    pubsub.close()
