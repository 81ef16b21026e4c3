"""A windows' Redis that accepts connections and never answers costs a call one
``debounce_redis_timeout``, not two: the client's retry never repeats a timed-out
handshake or command (store/redis/connect.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from helpers import debounced, make_app, silent_listener

from celery_debounce import DebounceBackendError

TIMEOUT = 1.0


@pytest.fixture
def silent_port() -> Iterator[tuple[int, list[socket.socket]]]:
    with silent_listener() as listening:
        yield listening


def test_a_silent_redis_costs_the_first_call_one_timeout_not_two(
    silent_port: tuple[int, list[socket.socket]],
) -> None:
    port, held = silent_port
    app = make_app(
        "memory://",
        broker_url="memory://",
        result_backend=None,
        debounce_redis_url=f"redis://127.0.0.1:{port}/0",
        debounce_redis_timeout=TIMEOUT,
    )

    @debounced(app, debounce="5s", debounce_max_wait="1m", shared=False)
    def silent_call(x: int) -> None: ...

    started = time.monotonic()
    with pytest.raises(DebounceBackendError, match="unreachable"):
        silent_call.delay(1)
    elapsed = time.monotonic() - started
    # one timeout (plus load); a retried handshake takes two
    assert elapsed < 1.7 * TIMEOUT, f"first call took {elapsed:.2f} s"
    assert len(held) == 1, f"{len(held)} connections: the handshake was retried"
