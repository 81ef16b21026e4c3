"""pytest plugin of celery_debounce (entry point ``pytest11``): the ``debounce_fakeredis`` fixture.

Kept outside the ``celery_debounce`` package on purpose: importing that package
imports Celery, kombu and redis-py and connects worker signal handlers. This module
imports only pytest, so every pytest run in an environment where the package is
installed pays nothing unless a test asks for the fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def debounce_fakeredis() -> Iterator[Any]:
    """``debounce_fakeredis(app)`` points ``app`` at a fakeredis server private to this test.

    Every app passed in shares that server; when the test ends each app is left as the
    test found it (its ``debounce_redis_url``, cached settings and store). Needs
    ``fakeredis[lua]``. See :func:`celery_debounce.testing.use_fakeredis`.
    """
    from celery_debounce.testing import fakeredis_fixture

    yield from fakeredis_fixture()
