"""Hostile input: every row of the table in docs/guarantees.md.

Each bad input raises a DebounceError subclass (or the serializer's own error)
before anything is written: no package key, no broker message.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import StoreCase, debounced, make_app, package_keys, running_worker, wait_until
from kombu.exceptions import EncodeError
from reads import nothing_stored, state_of, taken_ids

from celery_debounce import (
    DebounceConfigError,
    DebounceKeyError,
    DebouncePayloadError,
    send_task,
)
from celery_debounce.ops.read_view import list_windows

Call = Callable[[Celery, Any], Any]


pytestmark = pytest.mark.usefixtures("store")


def nothing_written(app: Celery, client: redis.Redis) -> bool:
    """No window in the app's store and no message in the broker (Redis DB 1)."""
    broker = client.connection_pool.connection_kwargs
    broker_client = redis.Redis(host=broker["host"], port=broker["port"], db=1)
    return nothing_stored(app) and broker_client.dbsize() == 0


def task_on(app: Celery, **options: Any) -> Any:
    options = {"debounce": "1s", "debounce_max_wait": "1m", "debounce_key": "u:{user}", **options}

    @debounced(app, name="hostile.task", **options)
    def task(user: Any = "u1", opts: Any = None) -> None:
        pass

    return task


def call(*args: Any, **kwargs: Any) -> Call:
    kw = kwargs.pop("kw", {})  # here: a row's call is made once per store
    return lambda app, task: task.apply_async(args, kw, **kwargs)


HUGE = "x" * 1025

# (row id, the call, the exception it gets, a regex its message must match: the message
# docs/guarantees.md promises, e.g. "naming the option and value"). Option values are
# per call; the task's own options are the ones of task_on().
NOT_A_KEY = "; a key needs a str, number, bool, UUID, Decimal or date"
SCHEDULE = ": cannot be combined with debounce; the window decides when the task runs"
BAD_PLACEHOLDER = r": bad placeholder \{%s\}; use \{name\}, \{0\} or \{name.field\}"
ROWS: list[Any] = [  # (row id, call, error, message), or a pytest.param of them
    # placeholders
    (
        "missing placeholder",
        call(debounce_key="{missing}"),
        DebounceKeyError,
        r"\{missing\} names no argument of this call \(arguments: user, opts\)",
    ),
    (
        "positional placeholder past the arguments",
        call(debounce_key="{3}"),
        DebounceKeyError,
        r"\{3\} refers to argument 3 but the call has 2 positional argument",
    ),
    (
        "None value",
        call(None),
        DebounceKeyError,
        r"\{user\} resolved to NoneType None" + re.escape(NOT_A_KEY),
    ),
    (
        "NaN value",
        call(math.nan),
        DebounceKeyError,
        r"\{user\} resolved to nan; a key cannot be NaN or an infinity",
    ),
    (
        "infinite value",
        call(kw={"user": -math.inf}),
        DebounceKeyError,
        r"\{user\} resolved to -inf; a key cannot be NaN or an infinity",
    ),
    (
        "nested: key absent",
        call({"name": "x"}, debounce_key="{user.id}"),
        DebounceKeyError,
        r"\{user.id\}: 'user' has no key 'id'",
    ),
    (
        "nested: None leaf",
        call(kw={"opts": {"a": None}}, debounce_key="{opts.a}"),
        DebounceKeyError,
        r"\{opts.a\} resolved to NoneType None" + re.escape(NOT_A_KEY),
    ),
    (
        "nested: into a scalar",
        call("text", debounce_key="{user.id}"),
        DebounceKeyError,
        r"\{user.id\} needs 'user' to be a mapping, got str",
    ),
    (
        "list value",
        call(["a"]),
        DebounceKeyError,
        r"\{user\} resolved to list \['a'\]" + re.escape(NOT_A_KEY),
    ),
    (
        "dict value",
        call({"a": 1}),
        DebounceKeyError,
        r"\{user\} resolved to dict \{'a': 1\}" + re.escape(NOT_A_KEY),
    ),
    (
        "object value",
        call(object()),
        DebounceKeyError,
        r"\{user\} resolved to object <object object at" + ".*" + re.escape(NOT_A_KEY),
    ),
    # sizes
    (
        "key above debounce_max_key_length (1024)",
        call(HUGE),
        DebounceKeyError,
        r"resolved to 1027 characters .* above debounce_max_key_length=1024$",
    ),
    (
        "payload above debounce_max_payload_bytes",
        call("u1", kw={"opts": "y" * (1 << 20)}),
        DebouncePayloadError,
        r"^hostile.task: arguments serialize to 104\d{4} bytes, above "
        r"debounce_max_payload_bytes=1048576$",
    ),
    (
        "non-serializable argument",
        call("u1", kw={"opts": object()}),
        EncodeError,
        "not JSON serializable",
    ),
    # durations: the option and the value
    (
        "zero window",
        call(debounce="0s"),
        DebounceConfigError,
        r"^debounce='0s': duration must be positive",
    ),
    (
        "negative window",
        call(debounce=-3),
        DebounceConfigError,
        r"^debounce=-3: duration must be positive",
    ),
    (
        "unparsable window",
        call(debounce="soon"),
        DebounceConfigError,
        r"^debounce='soon': cannot parse duration",
    ),
    (
        "infinite window",
        call(debounce=math.inf),
        DebounceConfigError,
        r"^debounce=inf: duration must be finite",
    ),
    (
        "NaN window",
        call(debounce=math.nan),
        DebounceConfigError,
        r"^debounce=nan: duration must be finite",
    ),
    (
        "bool window",
        call(debounce=True),
        DebounceConfigError,
        r"^debounce=True: expected a duration, not a bool",
    ),
    (
        "window over 10 years",
        call(debounce="4000d", debounce_max_wait="5000d"),
        DebounceConfigError,
        r"^debounce='4000d': duration longer than 10 years",
    ),
    (
        "zero max wait",
        call(debounce_max_wait=0),
        DebounceConfigError,
        r"^debounce_max_wait=0: duration must be positive",
    ),
    (
        "negative max wait",
        call(debounce_max_wait="-5s"),
        DebounceConfigError,
        r"^debounce_max_wait='-5s': ",
    ),
    (
        "unparsable max wait",
        call(debounce_max_wait="forever"),
        DebounceConfigError,
        r"^debounce_max_wait='forever': cannot parse duration",
    ),
    (
        "infinite max wait",
        call(debounce_max_wait=math.inf),
        DebounceConfigError,
        r"^debounce_max_wait=inf: duration must be finite",
    ),
    (
        "NaN max wait",
        call(debounce_max_wait=math.nan),
        DebounceConfigError,
        r"^debounce_max_wait=nan: duration must be finite",
    ),
    (
        "bool max wait",
        call(debounce_max_wait=True),
        DebounceConfigError,
        r"^debounce_max_wait=True: expected a duration, not a bool",
    ),
    (
        "max wait over 10 years",
        call(debounce_max_wait="4000d"),
        DebounceConfigError,
        r"^debounce_max_wait='4000d': duration longer than 10 years",
    ),
    (
        "max wait shorter than the window",
        call(debounce="5m", debounce_max_wait="1m"),
        DebounceConfigError,
        r"^debounce_max_wait='1m' is shorter than debounce='5m'",
    ),
    # wrong types
    (
        "debounce: list",
        call(debounce=[1]),
        DebounceConfigError,
        r"^debounce=\[1\]: expected a duration .*got list",
    ),
    (
        "debounce_max_wait: dict",
        call(debounce_max_wait={}),
        DebounceConfigError,
        r"^debounce_max_wait=\{\}: expected a duration .*got dict",
    ),
    (
        "debounce_key: int",
        call(debounce_key=5),
        DebounceConfigError,
        r"^debounce_key=5: expected a str template",
    ),
    (
        "debounce_key: list",
        call(debounce_key=["u"]),
        DebounceConfigError,
        r"^debounce_key=\['u'\]: expected a str template",
    ),
    (
        "debounce_replace_payload: str",
        call(debounce_replace_payload="yes"),
        DebounceConfigError,
        r"^debounce_replace_payload='yes': expected True or False",
    ),
    (
        "debounce_replace_payload: int",
        call(debounce_replace_payload=1),
        DebounceConfigError,
        r"^debounce_replace_payload=1: expected True or False",
    ),
    # Celery options stored with the window
    ("headers: str", call(headers="x"), DebounceConfigError, r"^headers='x': expected a mapping"),
    # link=5 is not here: plain apply_async publishes it too (tests/producer/test_call_parity.py)
    (
        "expires: str",
        call(expires="soon"),
        DebounceConfigError,
        r"^expires='soon': not a usable time",
    ),
    (
        "options not JSON-serializable",
        call(some_option=object()),
        DebounceConfigError,
        r"^some_option=<object object at .*must be JSON-serializable",
    ),
    (
        "countdown with debounce",
        call(countdown=5),
        DebounceConfigError,
        r"^countdown=5" + re.escape(SCHEDULE),
    ),
    (
        "eta with debounce",
        call(eta=datetime(2030, 1, 1, tzinfo=timezone.utc)),
        DebounceConfigError,
        r"^eta=datetime.datetime\(2030, 1, 1, 0, 0, tzinfo=" + ".*" + re.escape(SCHEDULE),
    ),
    # templates
    (
        "attribute access",
        call(debounce_key="{user.__class__.__name__}"),
        DebounceKeyError,
        r"\{user.__class__.__name__\} needs 'user' to be a mapping, got str",
    ),
    (
        "attribute access on position",
        call(debounce_key="{0.__class__}"),
        DebounceKeyError,
        r"\{0.__class__\} needs 0 to be a mapping, got str",
    ),
    (
        "indexing",
        call(debounce_key="{user[0]}"),
        DebounceConfigError,
        r"^debounce_key='\{user\[0\]\}'" + BAD_PLACEHOLDER % r"user\[0\]",
    ),
    (
        "format spec",
        call(debounce_key="{user:>10}"),
        DebounceConfigError,
        r"^debounce_key='\{user:>10\}'" + BAD_PLACEHOLDER % "user:>10",
    ),
    (
        "a Unicode digit as a position",
        call(debounce_key="{\u0661}"),
        DebounceConfigError,
        "^debounce_key='\\{\u0661\\}'" + BAD_PLACEHOLDER % "\u0661",
    ),
    (
        "conversion",
        call(debounce_key="{user!r}"),
        DebounceConfigError,
        r"^debounce_key='\{user!r\}'" + BAD_PLACEHOLDER % "user!r",
    ),
    (
        "unclosed brace",
        call(debounce_key="{user"),
        DebounceConfigError,
        r"^debounce_key='\{user': unclosed '\{' at 0",
    ),
    (
        "single closing brace",
        call(debounce_key="user}"),
        DebounceConfigError,
        r"^debounce_key='user\}': single '\}' at 4",
    ),
    # text that cannot be encoded (issue 9.12): a clear error, not UnicodeEncodeError
    (
        "lone surrogate in a templated key",
        call("\ud800"),
        DebounceKeyError,
        r"^debounce_key 'u:\{user\}' resolved to 'u:.ud800', which is not valid Unicode text",
    ),
    (
        "lone surrogate in a by-name key",
        lambda app, t: send_task(
            app, "x.y", ("\udfff",), debounce="1s", debounce_max_wait="1m", debounce_key="{0}"
        ),
        DebounceKeyError,
        r"^debounce_key '\{0\}' resolved to '.udfff', which is not valid Unicode text",
    ),
    (
        "NUL in a templated key",
        lambda app, t: t.delay("a\x00b"),
        DebounceKeyError,
        r"^debounce_key 'u:\{user\}' resolved to 'u:a.x00b', which holds a NUL character "
        r"\(at position 3\); a key cannot hold NUL on any store",
    ),
    (
        "NUL in a by-name key's literal part",
        lambda app, t: send_task(
            app, "x.y", ("b",), debounce="1s", debounce_max_wait="1m", debounce_key="a\x00{0}"
        ),
        DebounceKeyError,
        r"holds a NUL character \(at position 1\)",
    ),
    (
        "NUL in a by-name task name",
        lambda app, t: send_task(app, "x\x00y", debounce="1s", debounce_max_wait="1m"),
        DebounceConfigError,
        r"^task name 'x.x00y': a NUL character cannot be stored",
    ),
    (
        "NUL in a fixed task id",
        lambda app, t: t.apply_async(("u1",), task_id="id\x00"),
        DebounceConfigError,
        r"^task_id='id.x00': a task id cannot hold NUL",
    ),
    (
        "self-referencing argument, default key",
        lambda app, t: _self_ref(app),
        DebounceKeyError,
        r"^x.y: the arguments refer to themselves; the default key cannot digest them",
    ),
    # by-name producer
    (
        "send_task: empty name",
        lambda app, t: send_task(app, "", debounce="1s", debounce_max_wait="1m"),
        DebounceConfigError,
        r"^send_task name='': expected a non-empty task name",
    ),
    (
        "send_task: name not a str",
        lambda app, t: send_task(app, None, debounce="1s", debounce_max_wait="1m"),  # type: ignore[arg-type]
        DebounceConfigError,
        r"^send_task name=None: expected a non-empty task name",
    ),
    (
        "send_task: debounce without max wait",
        lambda app, t: send_task(app, "x.y", debounce="1s"),
        DebounceConfigError,
        r"^debounce='1s' needs debounce_max_wait",
    ),
]


def _self_ref(app: Celery) -> Any:
    loop: list[Any] = []
    loop.append(loop)
    return send_task(
        app, "x.y", (loop,), debounce="1s", debounce_max_wait="1m", serializer="pickle"
    )


@pytest.mark.parametrize(
    ("row", "make_call", "error", "message"), ROWS, ids=[getattr(r, "values", r)[0] for r in ROWS]
)
def test_bad_input_raises_and_writes_nothing(
    app: Celery,
    redis_client: redis.Redis,
    row: str,
    make_call: Call,
    error: type[BaseException],
    message: str,
) -> None:
    task = task_on(app)
    with pytest.raises(error, match=message):
        make_call(app, task)
    assert nothing_written(app, redis_client)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("debounce_shards", "two"),
        ("debounce_shards", 0),
        ("debounce_max_key_length", -1),
        ("debounce_max_payload_bytes", 1.5),
        ("debounce_redis_url", "http://127.0.0.1:6379"),
        ("debounce_key_prefix", "a{b}"),
        ("debounce_key_prefix", ""),
        ("debounce_dispatch_lease", "soon"),
        ("debounce_history_ttl", -1),
    ],
)
@pytest.mark.redis_only("the settings are refused before any store is built")
def test_bad_settings_raise_at_the_first_call_and_write_nothing(
    redis_server: str, redis_client: redis.Redis, setting: str, value: Any
) -> None:
    app = make_app(redis_server, **{setting: value})
    task = task_on(app)
    with pytest.raises(DebounceConfigError, match=re.escape(f"{setting}={value!r}")):
        task.delay("u1")
    assert package_keys(redis_client) == []


def test_key_at_the_length_limit_is_accepted(app: Celery, redis_client: redis.Redis) -> None:
    task = task_on(app, debounce_key="{user}")
    task.delay("x" * 1024)
    assert [w.key for w in list_windows(app)] == ["x" * 1024]


def test_payload_limit_is_configurable(app_factory: Any, redis_client: redis.Redis) -> None:
    app = app_factory(debounce_max_payload_bytes=100)
    task = task_on(app)
    task.delay("u1", "y" * 10)
    with pytest.raises(DebouncePayloadError, match="debounce_max_payload_bytes=100"):
        task.delay("u2", "y" * 200)
    assert [w.key for w in list_windows(app)] == ["u:u1"]


SEPARATOR_KEYS = [
    "a:b",
    "a",
    "b",
    ":",
    "::",
    "{0}",
    "}{",
    "*",
    "?",
    "[x]",
    "a\nb",
    "é",
    " ",
    "debounce:{0}:due",
    "1:a:b",
]


def test_keys_with_separator_characters_are_distinct_windows(
    app: Celery, redis_client: redis.Redis
) -> None:
    task = task_on(app, debounce_key="{user}")
    ids = {key: task.delay(key).id for key in SEPARATOR_KEYS}
    assert len(set(ids.values())) == len(SEPARATOR_KEYS)
    assert {key: task.delay(key).id for key in SEPARATOR_KEYS} == ids  # and they coalesce
    windows = list_windows(app)
    assert sorted(w.key for w in windows) == sorted(SEPARATOR_KEYS)
    assert {w.task for w in windows} == {"hostile.task"}
    # glob characters in keys do not confuse the inspect filter
    assert [w.key for w in list_windows(app, key_glob="[[]x]")] == ["[x]"]


def test_task_names_with_separators_cannot_collide(app: Celery) -> None:
    a = send_task(
        app, "a", args=("k:x",), debounce="1m", debounce_max_wait="1m", debounce_key="{0}"
    )
    b = send_task(
        app, "a:k", args=("x",), debounce="1m", debounce_max_wait="1m", debounce_key="{0}"
    )
    assert a.id != b.id
    assert sorted((w.task, w.key) for w in list_windows(app)) == [("a", "k:x"), ("a:k", "x")]


def test_unknown_task_name_by_name_producer(
    app_factory: Any, redis_client: redis.Redis, store: StoreCase
) -> None:
    """A by-name producer cannot know the workers' tasks: the call is accepted (as with
    Celery's send_task) and the worker rejects the message as an unregistered task,
    which finishes the window as REJECTED."""
    producer = app_factory()
    worker_app = app_factory()
    task_on(worker_app)  # the worker knows hostile.task only
    result = send_task(
        producer, "no.such.task", args=(1,), debounce="100ms", debounce_max_wait="1s"
    )
    (window,) = list_windows(producer)
    assert (window.task, window.task_id) == ("no.such.task", result.id)
    record = f"debounce:{{0}}:win:{result.id}"
    with running_worker(worker_app):
        # the worker rejects it (task_unknown): the window is finished, not left queued
        wait_until(lambda: state_of(producer, result.id) == "finished", 10)
    if store.name == "redis":
        # Redis only: no store read returns a finished window's result state, nor its TTL
        assert redis_client.hget(record, "rs") == b"REJECTED"
        assert 0 < redis_client.pttl(record) <= 3600 * 1000  # the history TTL, not 7 days
    assert not list_windows(producer)
    assert taken_ids(producer, "active") == []


def test_a_lone_surrogate_in_arguments_under_the_default_key_is_accepted(
    app: Celery,
    redis_client: redis.Redis,
) -> None:
    """JSON escapes it (as plain Celery publishes it); the key is a digest."""
    task = task_on(app, debounce_key=None)
    task.delay("\ud800")
    assert len(list_windows(app)) == 1


def test_arguments_the_signature_refuses_with_typing_off(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """typing=False: Celery publishes such a call; the default key digests it as given,
    a key template that needs the signature refuses it clearly."""
    app = app_factory()

    @debounced(app, typing=False, debounce="1s", debounce_max_wait="1m")
    def loose(a: int) -> None:
        pass

    loose.delay(1, 2, extra=3)
    assert len(list_windows(app)) == 1
    with pytest.raises(DebounceKeyError, match="signature"):
        loose.apply_async((1, 2), debounce_key="{a}")
