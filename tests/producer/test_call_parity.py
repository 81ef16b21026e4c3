"""Refused at call time exactly what plain Celery refuses (issue 9, "What must hold").

Hypothesis draws option dicts, valid and invalid, over the options ``apply_async``
takes, and calls a plain task and a debounced one with the same options on the
same app against the real broker:

* plain refused  -> the debounced call is refused too and nothing is written;
* plain accepted -> the debounced call is accepted, and its window, once due, is
  published by the dispatcher to the same broker keys (queue and priority list)
  the plain call reached.

Deliberately outside the rule (docs/guarantees.md): ``countdown``/``eta`` (the
window decides; refused with a clear error), ``producer``/``connection``/``declare``
(call-time objects the dispatcher does not keep), an ``exchange`` with a
``routing_key`` the broker has no binding for (a broker refusal at publish time:
such a window is retried, then quarantined with the reason), and a ``link`` or
``link_error`` that only a non-JSON serializer (pickle) can encode: plain Celery
pickles it into the body, a window stores it as JSON until it runs, so the debounced
call is refused at call time, naming the option, and nothing is written.
"""

from __future__ import annotations

import copy
import math
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import redis
from helpers import debounced, make_app
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_debounce import DebounceConfigError
from celery_debounce.dispatch.dispatcher import Dispatcher

_SIG = {
    "task": "parity.after",
    "args": [1],
    "kwargs": {},
    "options": {},
    "subtask_type": None,
    "immutable": True,
}

VALUES: dict[str, list[Any]] = {
    "expires": [
        None,
        0,
        60,
        -5,
        2.5,
        True,
        math.nan,
        math.inf,
        -math.inf,
        1e12,
        1e300,
        "2099-01-01T00:00:00+00:00",
        "2099-01-01",
        "garbage",
        "",
        [1],
        datetime(2099, 1, 1, tzinfo=timezone.utc),
        datetime(2099, 1, 1),
    ],
    "compression": [None, "zlib", "gzip", "bzip2", "bogus", "", 5, ["zlib"]],
    "delivery_mode": [None, 1, 2, "transient", "persistent", "x", 7, 1.5, 0, [], {"a": 1}],
    "priority": [None, 0, 5, 9, 255, -1, "a", 3.5, [1], {"p": 1}, object()],
    "serializer": [None, "json", "pickle", "nope", 5],
    "headers": [None, {}, {"a": 1}, {"x-n": [1, 2]}, [("a", 1)], "x", [1], 5, 0, {"a": object()}],
    "queue": [None, "celery", "other", "", 5],
    "exchange": [None, "", 5],
    "routing_key": [None, "rk", 5, ""],
    "time_limit": [None, 10, -1, "a", 1.5, object()],
    "soft_time_limit": [None, 5, "b", object()],
    "link": [None, _SIG, [_SIG], 5, "x", [], object()],
    "link_error": [None, _SIG, [_SIG, _SIG], 5],
    "shadow": [None, "shadowed", 5, object()],
    "ignore_result": [None, True, False, "x"],
    "retry": [None, True, False, "x"],
    "retry_policy": [None, {}, {"max_retries": 1}, {"bogus": 1}, 5, 0, "x", {1: 2}],
    "group_id": [None, "g", 5, object()],
    "group_index": [None, 0, "x"],
    "root_id": [None, "r", 5],
    "parent_id": [None, "p", object()],
    "reply_to": [None, "rq", 0],
    "mandatory": [None, True, False],
    "expiration": [None, 5, "x", object()],
    "content_type": [None, "application/json"],
    "zz_unknown_option": [None, 5, "x", object()],
}


@st.composite
def option_dicts(draw: Any) -> dict[str, Any]:
    names = draw(st.sets(st.sampled_from(sorted(VALUES)), max_size=5))
    options = {name: draw(st.sampled_from(VALUES[name])) for name in names}
    if options.get("exchange") not in (None, "") and options.get("routing_key"):
        options.pop("routing_key")  # a route the broker lacks: refused only at publish
    return options


def _copy(options: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (copy.deepcopy(v) if not isinstance(v, object.__class__) else v)
        for k, v in options.items()
    }


def _callbacks_only_pickle_encodes(options: dict[str, Any], exc: BaseException) -> bool:
    """The one deliberate difference Hypothesis can draw (module docstring): a callback
    that is not JSON, under a serializer that is not JSON, refused with its option named."""
    return (
        isinstance(exc, DebounceConfigError)
        and options.get("serializer") not in (None, "json")
        and str(exc).startswith(("callbacks=", "errbacks="))
        and "must be JSON-serializable" in str(exc)
    )


def test_a_callback_only_pickle_encodes_is_refused_at_call_time_and_named(
    redis_server: str,
) -> None:
    """Plain Celery pickles ``link`` into the body; a window stores it as JSON until it
    runs: the debounced call is refused at once (not at the dispatch), the option named,
    nothing written. A JSON-encodable link with pickle is accepted."""
    app = make_app(redis_server)
    windows = redis.Redis.from_url(f"{redis_server}/0")
    windows.flushdb()

    @debounced(
        app,
        name="parity.pickled",
        debounce="1s",
        debounce_max_wait="1m",
        serializer="pickle",
    )
    def pickled(x: Any) -> Any:
        return x

    after = app.signature("parity.after", args=(complex(1, 2),))
    try:
        pickled.apply_async((1,), link=after)
    except DebounceConfigError as exc:
        assert str(exc).startswith("callbacks=") and "JSON-serializable" in str(exc)
    else:
        raise AssertionError("a link only pickle encodes was accepted")
    assert windows.keys("*") == []
    pickled.apply_async((1,), link=app.signature("parity.after", args=(1,)))
    assert windows.keys("debounce:{0}:open:*")


def test_debounced_calls_refuse_exactly_what_plain_apply_async_refuses(redis_server: str) -> None:
    app = make_app(redis_server, debounce_dispatch_lease=5.0)
    windows = redis.Redis.from_url(f"{redis_server}/0")
    broker = redis.Redis.from_url(f"{redis_server}/1")

    @app.task(shared=False, name="parity.plain")
    def plain(x: Any) -> Any:
        return x

    @debounced(
        app,
        name="parity.debounced",
        debounce="1ms",
        debounce_max_wait="1ms",
    )
    def gated(x: Any) -> Any:
        return x

    dispatcher = Dispatcher(app)
    outcomes = {"refused": 0, "published": 0, "pickled callbacks": 0}

    def messages() -> dict[bytes, int]:
        return {k: int(broker.llen(k)) for k in broker.keys("*") if broker.type(k) == b"list"}

    @settings(
        max_examples=600, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(option_dicts())
    def check(options: dict[str, Any]) -> None:
        windows.flushdb()
        broker.flushdb()
        try:
            plain.apply_async(("x",), **dict(options))
        except Exception as exc:
            plain_error: Exception | None = exc
        else:
            plain_error = None
        reached = messages()
        broker.flushdb()
        try:
            gated.apply_async(("x",), **dict(options))
        except Exception as exc:
            if plain_error is None and _callbacks_only_pickle_encodes(options, exc):
                assert windows.keys("*") == [], "a refused call wrote to Redis"
                outcomes["pickled callbacks"] += 1
                return
            assert plain_error is not None, f"plain accepted {options!r}, debounce refused: {exc!r}"
            assert windows.keys("*") == [], "a refused call wrote to Redis"
            outcomes["refused"] += 1
            return
        assert plain_error is None, (
            f"plain refused {options!r} ({plain_error!r}), debounce accepted"
        )
        time.sleep(0.002)
        published, _ = dispatcher.dispatch_once()
        assert published == 1, f"{options!r}: accepted but not published"
        assert windows.zcard("debounce:{0}:quarantine") == 0
        assert messages() == reached, f"{options!r}: not published where plain Celery publishes"
        outcomes["published"] += 1

    check()
    # both sides of the rule were exercised
    assert outcomes["refused"] >= 20 and outcomes["published"] >= 20, outcomes


def test_expires_relative_counts_from_the_publish_and_refuses_what_celery_refuses(
    redis_server: str,
) -> None:
    """The named cases of issue 9.3: nan, inf and 1e12 are refused with a clear error."""
    app = make_app(redis_server)
    windows = redis.Redis.from_url(f"{redis_server}/0")
    windows.flushdb()

    @debounced(app, name="parity.exp", debounce="1s", debounce_max_wait="1m")
    def exp(x: Any) -> Any:
        return x

    for bad in (math.nan, math.inf, 1e12):
        try:
            exp.apply_async((1,), expires=bad)
        except DebounceConfigError as exc:
            assert "expires=" in str(exc)
        else:
            raise AssertionError(f"expires={bad!r} accepted")
    assert windows.keys("*") == []
    exp.apply_async((1,), expires=timedelta(seconds=30))  # accepted as seconds
    assert windows.keys("debounce:{0}:open:*")


# -- the default key is a canonical digest (issue 9.7, 9.12) -------------------------


def _digest_app(redis_server: str, **conf: Any) -> Any:
    app = make_app(redis_server, **conf)
    redis.Redis.from_url(f"{redis_server}/0").flushdb()
    return app


def test_equal_arguments_coalesce_whatever_the_order_of_nested_mappings(
    redis_server: str,
) -> None:
    for serializer in ("json", "pickle"):
        app = _digest_app(
            redis_server, task_serializer=serializer, accept_content=["json", "pickle"]
        )

        @debounced(
            app,
            name=f"digest.{serializer}",
            debounce="1m",
            debounce_max_wait="1h",
        )
        def t(doc: Any, *, flags: Any = None) -> None:
            pass

        a = t.delay({"a": 1, "b": {"x": [1, {"p": 1, "q": 2}], "y": 2}}, flags={"m": 1, "n": 2})
        b = t.delay({"b": {"y": 2, "x": [1, {"q": 2, "p": 1}]}, "a": 1}, flags={"n": 2, "m": 1})
        c = t.apply_async(
            kwargs={
                "flags": {"m": 1, "n": 2},
                "doc": {"b": {"y": 2, "x": [1, {"q": 2, "p": 1}]}, "a": 1},
            }
        )
        assert a.id == b.id == c.id, serializer
        # keyword-only arguments are part of the key
        assert t.delay({"a": 1}, flags=1).id != t.delay({"a": 1}, flags=2).id
        # sets are compared in a canonical order under pickle
        if serializer == "pickle":
            s1 = t.delay({3, 1, 2, "a"})
            s2 = t.delay({"a", 2, 1, 3})
            assert s1.id == s2.id


def test_a_by_name_producers_kwargs_are_part_of_the_key(redis_server: str) -> None:
    from celery_debounce import send_task

    app = _digest_app(redis_server)
    opts = {"debounce": "1m", "debounce_max_wait": "1h"}
    one = send_task(app, "digest.remote", kwargs={"x": 1, "y": {"b": 1, "a": 2}}, **opts)
    same = send_task(app, "digest.remote", kwargs={"y": {"a": 2, "b": 1}, "x": 1}, **opts)
    other = send_task(app, "digest.remote", kwargs={"x": 2, "y": {"b": 1, "a": 2}}, **opts)
    assert one.id == same.id != other.id


def test_mapping_keys_of_mixed_types_do_not_raise_and_compare_as_sent(
    redis_server: str,
) -> None:
    """Python cannot sort {1: .., "b": ..}; JSON sends both keys as strings."""
    app = _digest_app(redis_server)

    @debounced(app, name="digest.mixed", debounce="1m", debounce_max_wait="1h")
    def t(doc: Any) -> None:
        pass

    a = t.delay({1: "x", "b": 2})
    b = t.delay({"b": 2, "1": "x"})  # the same JSON, keys in another order
    assert a.id == b.id
    assert t.delay({2: "x", "b": 2}).id != a.id
