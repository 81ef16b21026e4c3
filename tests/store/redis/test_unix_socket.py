"""``debounce_redis_url="unix://..."``, which the docs accept: the windows' Redis over a
Unix socket, through the hot call, a worker's run and the operator verbs."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import debounced, make_app, running_worker, wait_until

from celery_debounce.ops.read_view import list_windows
from celery_debounce.testing.servers import LocalRedis


@pytest.fixture(scope="module")
def socket_server() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="celery-debounce-sock-"))
    path = where / "redis.sock"
    with LocalRedis("--unixsocket", str(path), "--unixsocketperm", "700"):
        yield path


def test_windows_over_a_unix_socket(redis_server: str, socket_server: Path) -> None:
    app = make_app(redis_server, debounce_redis_url=f"unix://{socket_server}?db=0")

    @debounced(
        app,
        debounce="200ms",
        debounce_key="{0}",
        debounce_max_wait="5s",
        shared=False,
    )
    def work(key: str, n: int) -> int:
        return n

    calls = [work.delay("a", n) for n in range(5)]
    assert len({c.id for c in calls}) == 1
    assert [w.task_id for w in list_windows(app)] == [calls[0].id]
    with running_worker(app):
        assert [c.get(timeout=15) for c in calls] == [0] * 5
        wait_until(lambda: not list_windows(app), 10)
