"""``clear_windows`` deletes the app's keys and nothing else (issue 19, suspected item).

Its SCAN pattern was ``<prefix>:*``: an app whose prefix is another's plus ``:...``
(``debounce`` and ``debounce:tenant2``) lost its windows to the other's clear, and a
prefix holding glob characters (``*``, ``?``, ``[...]``) matched other prefixes.
Now ``<escaped prefix>:{*`` (every key of the package is ``<prefix>:{<tag>}:...``).
On PostgreSQL a prefix other than the default names the schema of the windows: a clear
empties this app's schema and leaves the other's windows open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import StoreCase, debounced
from reads import nothing_stored, open_count

from celery_debounce.testing import clear_windows

pytestmark = pytest.mark.usefixtures("store")


def _app_with_a_window(app_factory: Callable[..., Celery], prefix: str) -> Any:
    app = app_factory(debounce_key_prefix=prefix)

    @debounced(
        app,
        name="clear.t",
        debounce="1m",
        debounce_max_wait="2m",
        debounce_key="{0}",
    )
    def t(x: int) -> int:
        return x

    t.delay(1)
    t.delay(2)
    return app


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [
        ("debounce", "debounce:tenant2"),
        ("app*", "appX"),
        ("a?c", "abc"),
        ("x[yz]", "xy"),
        ("b\\", "b\\x"),
    ],
)
def test_clear_windows_deletes_this_apps_keys_only(
    app_factory: Callable[..., Celery],
    redis_client: redis.Redis,
    store: StoreCase,
    mine: str,
    theirs: str,
) -> None:
    app = _app_with_a_window(app_factory, mine)
    other = _app_with_a_window(app_factory, theirs)
    assert open_count(app) == open_count(other) == 2
    others: list[bytes] = []
    if store.name == "redis":  # Redis only: every key of the server, another prefix's too
        others = sorted(
            k for k in redis_client.keys("*") if not k.startswith(f"{mine}:{{".encode())
        )
        assert others and len(redis_client.keys("*")) > len(others)
    assert clear_windows(app) > 0
    assert nothing_stored(app)  # mine all gone
    assert open_count(other) == 2  # theirs untouched
    if store.name == "redis":  # Redis only: no key of mine left, every other one kept
        assert sorted(redis_client.keys("*")) == others
