"""Correctness of the hot-path shortcuts: cached argument binding, compact records."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import running_worker

from celery_debounce import DebouncedTask
from celery_debounce.call import bind_arguments, encode


def _slow(sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return tuple(bound.arguments.values()), dict(bound.arguments)


def f(a: Any, b: Any = 2, c: Any = None) -> None: ...


@pytest.mark.parametrize(("args", "kwargs"), [
    ((1,), {}), ((1, 5), {}), ((1, 5, 6), {}), ((), {"a": 1}), ((1,), {"c": 3}),
    ((), {"c": 3, "a": 0, "b": 1}),
])
def test_fast_binding_matches_inspect(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    sig = inspect.signature(f)
    assert bind_arguments(sig, args, kwargs) == _slow(sig, args, kwargs)
    assert list(bind_arguments(sig, args, kwargs)[1]) == ["a", "b", "c"]


@pytest.mark.parametrize(("args", "kwargs"), [
    ((), {}), ((1, 2, 3, 4), {}), ((1,), {"a": 1}), ((1,), {"zz": 1}),
])
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

    @app.task(base=DebouncedTask, shared=False, debounce="200ms", debounce_key="k",
              debounce_max_wait="5s")
    def plain(x: Any) -> None:
        runs.append(x)

    @app.task(base=DebouncedTask, shared=False, debounce="200ms", debounce_key="k",
              debounce_max_wait="5s", serializer="pickle")
    def pickled(x: Any) -> None:
        runs.append(x)

    plain.delay(1)
    pickled.delay({1, 2})
    records = {
        k: redis_client.hgetall(k) for k in redis_client.scan_iter(match="debounce:*:open:*")
    }
    by_task = {k.decode().split(":")[4].rsplit(".", 1)[-1]: v for k, v in records.items()}
    assert b"ct" not in by_task["plain"] and b"o" not in by_task["plain"]
    assert by_task["pickled"][b"ct"] == b"application/x-python-serialize"
    with running_worker(app):
        from helpers import wait_until

        wait_until(lambda: len(runs) == 2)
    assert sorted(map(repr, runs)) == ["1", "{1, 2}"]
