"""The user suite's fixture: the editor app on fakeredis, and on a real Redis."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from editor_app import create_app

from celery_debounce.testing import clear_windows


@pytest.fixture(params=["fakeredis", "redis"])
def editor(
    request: pytest.FixtureRequest, debounce_fakeredis: Callable[[Celery], Any]
) -> Iterator[Celery]:
    """The editor app, its windows in fakeredis or in the real test redis-server."""
    if request.param == "fakeredis":
        app = create_app(
            broker_url="memory://", result_backend="cache+memory://", debounce_dispatcher=False
        )
        debounce_fakeredis(app)
        yield app
        return
    url = request.getfixturevalue("redis_server")
    app = create_app(
        broker_url=f"{url}/1",
        result_backend=f"{url}/2",
        debounce_redis_url=f"{url}/0",
        debounce_dispatcher=False,
    )
    clear_windows(app)
    yield app
    clear_windows(app)
