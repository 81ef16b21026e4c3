"""``clear_windows`` deletes the app's keys and nothing else (issue 19, suspected item).

Its SCAN pattern was ``<prefix>:*``: an app whose prefix is another's plus ``:...``
(``debounce`` and ``debounce:tenant2``) lost its windows to the other's clear, and a
prefix holding glob characters (``*``, ``?``, ``[...]``) matched other prefixes.
Now ``<escaped prefix>:{*`` (every key of the package is ``<prefix>:{<tag>}:...``).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import debounced, make_app

from celery_debounce.testing import clear_windows


def _app_with_a_window(redis_server: str, prefix: str) -> Any:
    app = make_app(redis_server, debounce_key_prefix=prefix)

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
    redis_server: str,
    redis_client: redis.Redis,
    mine: str,
    theirs: str,
) -> None:
    app = _app_with_a_window(redis_server, mine)
    _app_with_a_window(redis_server, theirs)
    # Redis only: every key of the server, another prefix's too
    others = sorted(k for k in redis_client.keys("*") if not k.startswith(f"{mine}:{{".encode()))
    assert others and len(redis_client.keys("*")) > len(others)
    assert clear_windows(app) > 0
    assert sorted(redis_client.keys("*")) == others  # theirs untouched, mine all gone
