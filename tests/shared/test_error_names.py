"""Errors name what the user wrote: the task and the argument a serializer refuses, and
each setting as the app is configured (``CELERY_DEBOUNCE_*`` under Django's namespace)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery
from helpers import package_keys
from kombu.exceptions import EncodeError

from celery_debounce import DebouncedTask, enqueue_many
from celery_debounce.errors import DebounceConfigError
from celery_debounce.settings import settings_for, spell_settings


def debounced(app: Celery, **options: Any) -> Any:
    @app.task(
        base=DebouncedTask,
        shared=False,
        name="proj.sync",
        debounce="1s",
        debounce_max_wait="1m",
        **options,
    )
    def sync(user: Any, opts: Any = None) -> None:
        pass

    return sync


@pytest.mark.parametrize("collect", [False, True], ids=["window", "collect"])
def test_an_unserializable_argument_names_the_task_and_the_argument(
    app: Celery, redis_client: redis.Redis, collect: bool
) -> None:
    task = debounced(app, debounce_key="k", debounce_collect=collect)
    with pytest.raises(EncodeError) as keyword:
        task.delay("u1", opts=object())
    assert str(keyword.value).startswith(
        "proj.sync: argument 'opts' (kwargs['opts'], object) cannot be serialized with 'json': "
    )
    with pytest.raises(EncodeError) as positional:
        task.apply_async(args=("u1", {1, 2}))
    assert str(positional.value).startswith(
        "proj.sync: argument 1 (args[1], set) cannot be serialized with 'json': "
    )
    with pytest.raises(EncodeError, match=r"^proj\.sync: argument 0 \(args\[0\], object\)"):
        enqueue_many(task, [(("u1",), {}), ((object(),), {})])
    assert package_keys(redis_client) == []  # nothing written


class DjangoSettings:
    CELERY_BROKER_URL = "amqp://localhost//"


def namespaced(**settings: Any) -> Celery:
    app = Celery("proj", set_as_current=False)
    source = type("Settings", (DjangoSettings,), settings)
    app.config_from_object(source, namespace="CELERY")
    return app


def test_under_a_namespace_errors_spell_the_settings_as_configured() -> None:
    with pytest.raises(DebounceConfigError) as missing:
        settings_for(namespaced())
    assert str(missing.value) == (
        "CELERY_DEBOUNCE_REDIS_URL is not set and the broker URL "
        "('amqp://localhost//') is not a Redis URL: set "
        "CELERY_DEBOUNCE_REDIS_URL = 'redis://host:6379/0' (the windows in Redis), or "
        "CELERY_DEBOUNCE_STORE_URL = 'postgresql://host/db' (in PostgreSQL)"
    )
    with pytest.raises(DebounceConfigError) as bad:
        settings_for(
            namespaced(
                CELERY_DEBOUNCE_REDIS_URL="redis://localhost:6379/0", CELERY_DEBOUNCE_SHARDS="4.0"
            )
        )
    assert str(bad.value).startswith("CELERY_DEBOUNCE_SHARDS='4.0': expected a positive int")
    assert "debounce_" not in str(bad.value)


def test_without_a_namespace_errors_name_app_conf() -> None:
    app = Celery("proj", broker="amqp://localhost//", set_as_current=False)
    with pytest.raises(
        DebounceConfigError,
        match=(r"^debounce_redis_url is not set .* set app\.conf\.debounce_redis_url = "),
    ):
        settings_for(app)


def test_spelling_leaves_other_names_alone() -> None:
    assert spell_settings("debounce_key='x' (debounce_shards=2, broker_url)", "CELERY") == (
        "debounce_key='x' (CELERY_DEBOUNCE_SHARDS=2, broker_url)"
    )
