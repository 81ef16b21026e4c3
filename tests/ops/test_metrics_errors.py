"""The error counters, the call-duration histogram, and enable() called twice.

Each metric is read from a fresh registry after the event really happened: a
Redis that does not answer a call, a broker that is down while a window is taken,
a record whose message cannot be built. The hot path sends exactly the Redis
commands it sent before (one EVALSHA per call) whether metrics are on or off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from helpers import debounced, make_app, wait_until
from prometheus_client import CollectorRegistry

from celery_debounce import DebounceBackendError, Dispatcher
from celery_debounce.ops import metrics
from celery_debounce.store.idents import window_ident
from celery_debounce.testing.servers import LocalRedis


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    reg = CollectorRegistry()
    enabled = metrics.enable(reg)
    yield reg
    enabled.disable()


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(f"celery_debounce_{name}", labels) or 0.0


def test_enable_twice_returns_the_same_metrics_and_counts_each_call_once(
    redis_server: str, redis_client: redis.Redis
) -> None:
    reg = CollectorRegistry()
    first = metrics.enable(reg)
    try:
        again = metrics.enable(reg)  # no "Duplicated timeseries in CollectorRegistry"
        assert again is first
        first.disable()
        assert metrics.enable(reg) is first  # connected again after disable()
        other = CollectorRegistry()
        assert metrics.enable(other) is not first  # another registry: its own metrics
        metrics.enable(other).disable()
        app = make_app(redis_server)

        @debounced(
            app,
            debounce="1h",
            debounce_max_wait="2h",
            debounce_key="{0}",
        )
        def twice(k: str) -> None:
            pass

        twice.delay("a")
        twice.delay("a")
        assert sample(reg, "windows_opened_total", task=twice.name) == 1
        assert sample(reg, "calls_absorbed_total", task=twice.name) == 1
        assert sample(reg, "calls_total", task=twice.name, outcome="opened") == 1
        assert sample(reg, "calls_total", task=twice.name, outcome="absorbed") == 1
        assert sample(reg, "call_duration_seconds_count", task=twice.name) == 2
        assert 0 < sample(reg, "call_duration_seconds_sum", task=twice.name) < 2
    finally:
        first.disable()


def test_enable_twice_on_the_global_registry_does_not_raise() -> None:
    from prometheus_client import REGISTRY

    first = metrics.enable()
    try:
        assert metrics.enable() is first
        assert (
            REGISTRY.get_sample_value("celery_debounce_windows_opened_total", {"task": "never"})
            is None
        )
    finally:
        first.disable()


def test_a_call_redis_does_not_answer_is_counted_by_error_and_timed(
    registry: CollectorRegistry,
) -> None:
    server = LocalRedis().start()
    try:
        app = make_app(server.url, debounce_redis_timeout=1)

        @debounced(app, debounce="1s", debounce_max_wait="2s")
        def lost() -> None:
            pass

        lost.delay()  # the store has read the server's version
        server.cleanup()
        for _ in range(2):
            with pytest.raises(DebounceBackendError):
                lost.delay()
    finally:
        server.cleanup()
    assert sample(registry, "call_errors_total", task=lost.name, error="DebounceBackendError") == 2
    assert sample(registry, "call_duration_seconds_count", task=lost.name) == 3
    assert sample(registry, "windows_opened_total", task=lost.name) == 1


def test_windows_a_dead_broker_kept_back_are_counted_as_broker_failures(
    redis_server: str, redis_client: redis.Redis, registry: CollectorRegistry
) -> None:
    broker = LocalRedis().start()
    try:
        app = make_app(
            redis_server,
            broker_url=f"{broker.url}/1",
            broker_connection_timeout=1,
            broker_connection_max_retries=0,
        )

        @debounced(
            app,
            debounce="1ms",
            debounce_max_wait="1ms",
            debounce_key="{0}",
        )
        def held(n: int) -> None:
            pass

        dispatcher = Dispatcher(app)
        port = broker.port
        broker.cleanup()
        for n in range(3):
            held.delay(n)
        time.sleep(0.01)
        assert dispatcher.dispatch_once()[0] == 0
        assert sample(registry, "publish_failures_total", task=held.name, kind="broker") == 3
        assert sample(registry, "publish_failures_total", task=held.name, kind="message") == 0
        broker = LocalRedis(port=port).start()
        wait_until(lambda: dispatcher.dispatch_once()[0], timeout=10, interval=0.2)
        assert sample(registry, "windows_quarantined_total", task=held.name, kind="message") == 0
    finally:
        broker.cleanup()


def test_a_window_whose_message_cannot_be_built_is_counted_as_quarantined_by_kind(
    redis_server: str, redis_client: redis.Redis, registry: CollectorRegistry
) -> None:
    app = make_app(redis_server)

    @debounced(
        app,
        debounce="1ms",
        debounce_max_wait="1ms",
        debounce_key="{0}",
    )
    def spoilt(k: str) -> None:
        pass

    spoilt.delay("bad")
    spoilt.delay("good")
    # Redis only: a corrupt body
    redis_client.hset(f"debounce:{{0}}:open:{window_ident(spoilt.name, 'bad')}", "p", b"{not json")
    time.sleep(0.01)
    assert Dispatcher(app).dispatch_once()[0] == 1
    assert sample(registry, "windows_quarantined_total", task=spoilt.name, kind="message") == 1
    assert sample(registry, "windows_dispatched_total", task=spoilt.name) == 1


def _commands(client: redis.Redis) -> dict[str, int]:
    return {name: row["calls"] for name, row in client.info("commandstats").items()}


def test_metrics_add_no_redis_command_to_a_call(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server)

    @debounced(app, debounce="1h", debounce_max_wait="2h", debounce_key="{0}")
    def counted(k: int) -> None:
        pass

    counted.delay(-1)  # the store and the script are ready

    def per_call(first: int, n: int = 50) -> dict[str, int]:
        """Commands Redis ran (scripts' own included) for n calls opening n windows."""
        before = _commands(redis_client)
        for i in range(first, first + n):
            counted.delay(i)
        after = _commands(redis_client)
        return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}

    off = per_call(0)
    reg = CollectorRegistry()
    enabled = metrics.enable(reg)
    try:
        on = per_call(100)
    finally:
        enabled.disable()
    # INFO itself is counted once per reading; the calls are one EVALSHA each
    assert off == on and off["cmdstat_evalsha"] == 50, (off, on)
    assert sample(reg, "call_duration_seconds_count", task=counted.name) == 50
