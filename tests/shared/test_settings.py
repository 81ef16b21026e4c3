"""Settings parse strictly: strings from environment-driven configs work or are refused."""

from __future__ import annotations

import re
from typing import Any

import pytest
from celery import Celery
from helpers import debounced, make_app

from celery_debounce import DebounceConfigError
from celery_debounce.dispatch.bootstep import DispatcherStep
from celery_debounce.settings import RECORD_TTL_LEASES, Settings, parse_bool

#: Settings are read, never connected to: nothing listens on port 1.
NOWHERE = "redis://127.0.0.1:1"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        ("False", False),
        ("false", False),
        ("0", False),
        ("no", False),
        ("OFF", False),
        (" Off ", False),
        ("True", True),
        ("1", True),
        ("YES", True),
        ("on", True),
    ],
)
@pytest.mark.parametrize("name", ["debounce_dispatcher", "debounce_dispatcher_process"])
def test_dispatcher_setting_accepts_bools_and_their_strings(
    name: str, value: Any, expected: bool
) -> None:
    Settings.from_app(make_app(NOWHERE, **{name: value}))  # accepted (the bootstep reads it)
    assert parse_bool(name, value) is expected


@pytest.mark.parametrize("value", ["", "maybe", "2", "Flase", 2, -1, 0.0, [], "t", "y"])
@pytest.mark.parametrize("name", ["debounce_dispatcher", "debounce_dispatcher_process"])
def test_dispatcher_setting_refuses_anything_else(name: str, value: Any) -> None:
    with pytest.raises(DebounceConfigError, match=f"{name}="):
        Settings.from_app(make_app(NOWHERE, **{name: value}))


def _worker(app: Celery) -> Any:
    return type("Worker", (), {"app": app, "hostname": "w"})()


@pytest.mark.parametrize("value", ["False", "0", "off", False])
def test_the_worker_step_honours_false_strings(value: Any) -> None:
    """A Django settings module gives "False" from the environment: no dispatcher."""
    step = DispatcherStep.__new__(DispatcherStep)
    assert step.include_if(_worker(make_app(NOWHERE, debounce_dispatcher=value))) is False


def test_the_worker_step_refuses_a_garbled_switch() -> None:
    step = DispatcherStep.__new__(DispatcherStep)
    with pytest.raises(DebounceConfigError, match="debounce_dispatcher='nope'"):
        step.include_if(_worker(make_app(NOWHERE, debounce_dispatcher="nope")))
    assert step.include_if(_worker(make_app(NOWHERE))) is True


INT_SETTINGS = {  # name -> the Settings field and the smallest value accepted
    "debounce_shards": ("shards", 1),
    "debounce_dispatch_batch": ("dispatch_batch", 1),
    "debounce_dispatch_batch_bytes": ("dispatch_batch_bytes", 1),
    "debounce_max_key_length": ("max_key_length", 1),
    "debounce_max_payload_bytes": ("max_payload_bytes", 1),
    "debounce_redis_wait_replicas": ("wait_replicas", 0),
}


@pytest.mark.parametrize("name", sorted(INT_SETTINGS))
@pytest.mark.parametrize(("text", "number"), [("4", 4), (" 4 ", 4), ("16\n", 16), ("0012", 12)])
def test_integer_settings_parse_strings_from_the_environment(
    name: str,
    text: str,
    number: int,
) -> None:
    """``CELERY_DEBOUNCE_SHARDS = os.environ.get(...)`` gives a string: read as the int
    it spells, as boolean and duration settings read theirs (issue 18, item 5)."""
    field, _ = INT_SETTINGS[name]
    settings = Settings.from_app(make_app(NOWHERE, **{name: text}))
    assert getattr(settings, field) == number
    assert type(getattr(settings, field)) is int


@pytest.mark.parametrize("name", sorted(INT_SETTINGS))
@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "four",
        "4.0",
        "4.5",
        "1e3",
        "0x10",
        "1_000",
        "+4",
        "-4",
        "4 4",
        "\u0664",
        "\uff14",
        "4s",
        "True",
    ],
)
def test_integer_settings_refuse_other_strings_naming_the_setting_and_value(
    name: str,
    text: str,
) -> None:
    _, least = INT_SETTINGS[name]
    what = "a positive int" if least == 1 else "an int >= 0"
    with pytest.raises(DebounceConfigError) as info:
        Settings.from_app(make_app(NOWHERE, **{name: text}))
    assert str(info.value).startswith(f"{name}={text!r}: expected {what}")


@pytest.mark.parametrize("name", sorted(INT_SETTINGS))
def test_integer_settings_below_their_least_value_are_refused_as_strings_too(name: str) -> None:
    _, least = INT_SETTINGS[name]
    for value in (least - 1, str(least - 1), True, 4.0, [4]):
        with pytest.raises(DebounceConfigError, match=f"^{re.escape(f'{name}={value!r}')}: "):
            Settings.from_app(make_app(NOWHERE, **{name: value}))


def test_durations_from_strings_work() -> None:
    settings = Settings.from_app(
        make_app(
            NOWHERE,
            debounce_poll_interval="250ms",
            debounce_dispatch_lease="10",
            debounce_record_ttl="1h",
        )
    )
    assert (settings.poll_interval_ms, settings.dispatch_lease_ms, settings.record_ttl_ms) == (
        250,
        10_000,
        3_600_000,
    )


def test_record_ttl_shorter_than_the_lease_is_refused() -> None:
    with pytest.raises(
        DebounceConfigError,
        match=r"debounce_record_ttl=10s .*"
        r"debounce_dispatch_lease=30s",
    ):
        Settings.from_app(make_app(NOWHERE, debounce_record_ttl=10))
    floor = RECORD_TTL_LEASES * 30
    with pytest.raises(DebounceConfigError, match=f"at least {floor}s"):
        Settings.from_app(make_app(NOWHERE, debounce_record_ttl=floor - 1))
    assert (
        Settings.from_app(make_app(NOWHERE, debounce_record_ttl=floor)).record_ttl_ms
        == floor * 1000
    )
    short = Settings.from_app(
        make_app(NOWHERE, debounce_record_ttl="2s", debounce_dispatch_lease="500ms")
    )
    assert short.record_ttl_ms == 2000


@pytest.mark.parametrize(("value", "runs"), [("False", False), ("off", False), ("true", True)])
def test_a_real_worker_honours_string_switches(app_factory: Any, value: str, runs: bool) -> None:
    """``debounce_dispatcher="False"`` (from the environment) starts no dispatcher."""
    import threading

    from helpers import running_worker

    app = app_factory(debounce_dispatcher=value)

    @debounced(app, debounce="1s", debounce_max_wait="2s")
    def noop() -> None:
        pass

    with running_worker(app):
        threads = [t.name for t in threading.enumerate() if t.name.startswith("debounce-worker")]
    assert bool(threads) is runs, threads


PG = "postgresql://u@127.0.0.1:1/db"


def _pg_settings(**conf: Any) -> Settings:
    app = Celery("pg", set_as_current=False)
    app.conf.update(debounce_store_url=PG, **conf)
    return Settings.from_app(app)


@pytest.mark.parametrize(
    ("conf", "schema"),
    [
        ({}, None),  # the default prefix: the URL's search_path, as before
        ({"debounce_key_prefix": "staging"}, "staging"),  # a prefix is a schema
        ({"debounce_key_prefix": "staging", "debounce_postgres_schema": "s2"}, "s2"),
        ({"debounce_postgres_schema": 'odd "name"'}, 'odd "name"'),
    ],
)
def test_the_postgres_schema_is_the_setting_or_a_prefix_of_its_own(
    conf: dict[str, Any], schema: str | None
) -> None:
    assert _pg_settings(**conf).postgres_schema == schema


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("debounce_postgres_schema", "", "debounce_postgres_schema=''"),
        ("debounce_postgres_schema", "x" * 64, "at most 63 bytes"),
        ("debounce_postgres_schema", "a\x00b", "without NUL"),
        ("debounce_postgres_schema", 7, "debounce_postgres_schema=7"),
        ("debounce_key_prefix", "p" * 64, "set debounce_postgres_schema to a shorter name"),
        ("debounce_postgres_listen_url", "redis://h", "debounce_postgres_listen_url='redis"),
        ("debounce_postgres_listen_url", 5, "debounce_postgres_listen_url=5"),
    ],
)
def test_postgres_schema_and_listen_url_refuse_bad_values_by_name(
    name: str, value: Any, message: str
) -> None:
    with pytest.raises(DebounceConfigError, match=re.escape(message)):
        _pg_settings(**{name: value})


@pytest.mark.parametrize("name", ["debounce_postgres_schema", "debounce_postgres_listen_url"])
def test_postgres_only_settings_are_refused_with_the_redis_store(name: str) -> None:
    app = Celery("r", set_as_current=False)
    app.conf.update(debounce_redis_url=NOWHERE, **{name: "postgresql://h/db"})
    with pytest.raises(DebounceConfigError, match=f"{name} is a setting of the PostgreSQL"):
        Settings.from_app(app)


def test_a_listen_url_of_empty_means_poll() -> None:
    assert _pg_settings(debounce_postgres_listen_url="").postgres_listen_url == ""
    assert _pg_settings().postgres_listen_url is None


def test_the_postgres_pool_size_is_a_positive_int_and_reaches_the_store() -> None:
    assert _pg_settings().postgres_pool_size == 8
    assert _pg_settings(debounce_postgres_pool_size="3").postgres_pool_size == 3
    with pytest.raises(DebounceConfigError, match="debounce_postgres_pool_size=0"):
        _pg_settings(debounce_postgres_pool_size=0)
    pytest.importorskip("psycopg_pool")
    from celery_debounce.store.postgres.app import postgres_store

    store = postgres_store(_pg_settings(debounce_postgres_pool_size=3))
    try:
        assert store.pool.max_size == 3
    finally:
        store.close()
