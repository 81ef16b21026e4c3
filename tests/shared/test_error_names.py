"""Errors name what the user wrote: the task and the argument a serializer refuses, and
each setting as the app is configured (``CELERY_DEBOUNCE_*`` under Django's namespace)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, package_keys
from kombu.exceptions import EncodeError

from celery_debounce import enqueue_many
from celery_debounce.errors import DebounceConfigError
from celery_debounce.settings import settings_for, spell_settings


def sync_task(app: Celery, **options: Any) -> Any:
    @debounced(
        app,
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
    task = sync_task(app, debounce_key="k", debounce_collect=collect)
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


#: Errors of the package a caller never sees: the worker's own, caught where raised.
INTERNAL_ERRORS = {
    "NotReplicated": "a claim or finish too few replicas acknowledged: the worker retries it",
    "FinishNotReplicated": "the same, of a finish",
}


def _package_errors() -> dict[str, type[BaseException]]:
    import importlib
    import inspect
    import pkgutil

    import celery_debounce
    from celery_debounce.errors import DebounceError

    found: dict[str, type[BaseException]] = {}
    for module in pkgutil.walk_packages(celery_debounce.__path__, "celery_debounce."):
        if ".testing" in module.name or ".migrations" in module.name:
            continue
        try:
            loaded = importlib.import_module(module.name)
        except ImportError:  # an optional extra (Django) not installed
            continue
        for name, value in vars(loaded).items():
            if (
                inspect.isclass(value)
                and issubclass(value, DebounceError)
                and value.__module__ == module.name
            ):
                found[name] = value
    return found


def test_every_error_a_caller_can_see_is_importable_from_the_package_and_documented() -> None:
    """Each error the package defines is importable from ``celery_debounce`` under its
    own name (the one its traceback shows) unless it never leaves the worker, and
    docs/errors.md has a row for it giving its bases as they are."""
    import re
    from pathlib import Path

    import celery_debounce

    page = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text("utf-8")
    rows = {
        m.group(1): [b.strip(" `") for b in m.group(2).split(",")]
        for m in re.finditer(r"^\| `(\w+)` \| ([^|]+) \|", page, re.M)
    }
    defined = _package_errors()
    assert len(defined) > 20
    for name, cls in defined.items():
        if name in INTERNAL_ERRORS:
            continue
        assert getattr(celery_debounce, name, None) is cls, name
        assert rows.get(name) == [base.__name__ for base in cls.__bases__], name
    exported = [n for n in celery_debounce.__all__ if isinstance(getattr(celery_debounce, n), type)]
    documented = {n for n in exported if issubclass(getattr(celery_debounce, n), BaseException)}
    assert documented <= set(rows), documented - set(rows)
