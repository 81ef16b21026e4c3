"""Fast unit tests of the pieces: durations, key templates, options."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_debounce import DebounceConfigError, DebounceKeyError
from celery_debounce.durations import parse_duration
from celery_debounce.producer.key_templates import parse_template, resolve
from celery_debounce.producer.options import TaskDefaults, build_spec
from celery_debounce.store.idents import split_ident, window_ident


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        ("250ms", 250),
        ("10s", 10_000),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        ("1m30s", 90_000),
        (10, 10_000),
        (0.25, 250),
        ("1.5", 1500),
        (timedelta(minutes=2), 120_000),
        (" 5 m ", 300_000),
    ],
)
def test_durations_parse(value: Any, ms: int) -> None:
    assert parse_duration("debounce", value) == ms


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        "0s",
        "-5m",
        "soon",
        "5x",
        "",
        "1h-30m",
        None,
        True,
        [1],
        float("inf"),
        float("nan"),
        timedelta(0),
        timedelta(seconds=-1),
        "0.1ms",
    ],
)
def test_bad_durations_name_the_option_and_value(value: Any) -> None:
    with pytest.raises(DebounceConfigError) as info:
        parse_duration("debounce_max_wait", value)
    assert "debounce_max_wait=" in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "1_000",
        "1_000s",
        "\u0661\u0662",
        "\uff15s",
        "5s5s",
        "1m1m",
        "30m1h",
        "1e3",
        "nan",
        "inf",
        "5mm",
        "-5m",
        " ",
    ],
)
def test_durations_parse_strictly(value: str) -> None:
    """Underscores, non-ASCII digits, repeated or unordered units, exponents: refused."""
    with pytest.raises(DebounceConfigError, match="cannot parse") as info:
        parse_duration("debounce_poll_interval", value)
    assert f"debounce_poll_interval={value!r}" in str(info.value)


@pytest.mark.parametrize("value", [0.0004, "0.0004", "0.4ms", timedelta(microseconds=400)])
def test_sub_millisecond_durations_say_below_1ms(value: Any) -> None:
    with pytest.raises(DebounceConfigError, match="below 1 ms"):
        parse_duration("debounce", value)


@pytest.mark.parametrize("value", [0, "0", "-5", -0.5, "0s"])
def test_zero_and_negative_durations_say_positive(value: Any) -> None:
    with pytest.raises(DebounceConfigError, match="must be positive"):
        parse_duration("debounce", value)


def test_template_parts_and_literal_braces() -> None:
    tpl = parse_template("a{{b}}:{user}:{0}:{meta.org.id}")
    assert resolve(tpl, ("u", 1), {"user": "u", "meta": {"org": {"id": 7}}}) == "a{b}:u:u:7"


@pytest.mark.parametrize(
    "source",
    [
        "{",
        "}",
        "{a",
        "{a!r}",
        "{a:>4}",
        "{a[0]}",
        "{0.__class__[x]}",
        "{}",
        "{a b}",
        "{-1}",
        "{a.}",
    ],
)
def test_bad_templates_are_config_errors(source: str) -> None:
    with pytest.raises(DebounceConfigError, match="debounce_key="):
        parse_template(source)


def test_dunder_placeholders_never_evaluate_attributes() -> None:
    tpl = parse_template("{0.__class__}")
    with pytest.raises(DebounceKeyError, match="mapping"):
        resolve(tpl, ("text",), {})
    # on a mapping it is just a key lookup
    assert resolve(tpl, ({"__class__": "x"},), {}) == "x"


@pytest.mark.parametrize("value", [None, {"a": 1}, ["a"], ("a",), {"a"}, object(), b"raw"])
def test_non_scalars_are_key_errors(value: Any) -> None:
    with pytest.raises(DebounceKeyError):
        resolve(parse_template("{0}"), (value,), {})


#: A task name: any text but NUL, which no store can hold, and lone surrogates, which are
#: not text (both refused by name, tested in test_hostile_input.py).
_TASK_NAMES = st.text(
    alphabet=st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), min_size=1
)


@given(_TASK_NAMES, st.text(), _TASK_NAMES, st.text())
def test_window_idents_never_collide_across_tasks(t1: str, k1: str, t2: str, k2: str) -> None:
    if (t1, k1) != (t2, k2):
        assert window_ident(t1, k1) != window_ident(t2, k2)
    assert split_ident(window_ident(t1, k1)) == (t1, k1)


def test_task_defaults_and_call_overrides() -> None:
    defaults = TaskDefaults.validate(
        {"debounce": "1m", "debounce_max_wait": "5m", "debounce_key": "k:{0}"}
    )
    assert defaults.spec is not None and defaults.spec.window_ms == 60_000
    options: dict[str, Any] = {"debounce": "10s", "queue": "q"}
    spec = defaults.for_call(options)
    assert spec is not None and spec.window_ms == 10_000 and spec.max_wait_ms == 300_000
    assert options == {"queue": "q"}  # debounce options never leak into the message
    assert defaults.for_call({"debounce": False}) is None
    plain = TaskDefaults.validate({})
    assert plain.for_call({}) is None
    with pytest.raises(DebounceConfigError, match="debounce_max_wait"):
        plain.for_call({"debounce": "1s"})
    with pytest.raises(DebounceConfigError):
        plain.for_call({"debounce_key": "x"})


def test_max_wait_equal_to_window_is_a_fixed_window() -> None:
    spec = build_spec("5s", None, "5s", False)
    assert spec.window_ms == spec.max_wait_ms == 5000


def test_the_worker_reads_the_tag_header_then_0_2s_shard_number_and_ignores_foreign_keys() -> None:
    """Where a worker looks for a window's record: the message's ``debounce_tag`` (the
    record's own tag, whatever the worker's ``debounce_shards``), else the shard number
    of a message a 0.2 dispatcher sent (``debounce_shard``); a tag naming anything but
    a shard under the prefix is ignored (never a key outside it)."""
    from celery import Celery

    from celery_debounce.worker.receivers import _shard_of

    app = Celery("tags", set_as_current=False)
    app.conf.update(
        debounce_redis_url="redis://localhost:1/0",
        broker_url="memory://",
        debounce_dispatcher=False,
    )
    assert (
        _shard_of({"debounce_tag": "debounce:{3.10}", "debounce_shard": 3}, None, app)
        == "debounce:{3.10}"
    )
    assert _shard_of({"debounce_shard": 2}, None, app) == 2
    assert _shard_of({}, None, app) is None
    for foreign in ("other:{1}", "debounce:{1}:win:x", "debounce:{}", "debounce:{a}", 5):
        assert _shard_of({"debounce_tag": foreign}, None, app) is None


@pytest.mark.parametrize("value", ["2M", "1h30M", "2 M", "1M30s"])
def test_a_capital_m_is_refused_as_ambiguous(value: str) -> None:
    """ "2M" is 2 months in ISO 8601 periods: refused, never silently 2 minutes."""
    with pytest.raises(DebounceConfigError, match="'M' is ambiguous") as info:
        parse_duration("debounce", value)
    assert f"debounce={value!r}" in str(info.value) and "'m' for minutes" in str(info.value)


@pytest.mark.parametrize(
    ("value", "ms"),
    [("2m", 120_000), ("250MS", 250), ("250Ms", 250), ("2H", 7_200_000), ("10S", 10_000)],
)
def test_lowercase_m_and_other_capitals_keep_their_meaning(value: str, ms: int) -> None:
    assert parse_duration("debounce", value) == ms


def test_a_key_template_naming_no_parameter_is_refused_at_registration() -> None:
    from celery import Celery

    from celery_debounce import DebouncedTask

    app = Celery("keys", set_as_current=False)
    opts = dict(base=DebouncedTask, shared=False, debounce="1s", debounce_max_wait="2s")

    def bad_name(user_id: str) -> None: ...
    def bad_index(user_id: str) -> None: ...

    with pytest.raises(DebounceConfigError, match=r"\{nope\} names no parameter") as info:
        app.task(name="k.bad", debounce_key="u:{nope}", **opts)(bad_name).name  # built
    assert "k.bad" in str(info.value) and "user_id" in str(info.value)
    with pytest.raises(DebounceConfigError, match=r"\{1\} refers to argument 1"):
        app.task(name="k.idx", debounce_key="u:{1}", **opts)(bad_index).name

    def ok(self: Any, user_id: str, *rest: Any, **extra: Any) -> None: ...
    def plain(user_id: str, n: int = 0) -> None: ...

    # bind=True (self is not an argument), *args and **kwargs accept any position / name
    assert (
        app.task(name="k.ok", bind=True, debounce_key="{user_id}:{3}:{other}", **opts)(ok).name
        == "k.ok"
    )
    assert (
        app.task(name="k.plain", debounce_key="{0}:{n}:{user_id.x}", **opts)(plain).name
        == "k.plain"
    )
