"""Metrics agree with `stats`, also for windows whose first publish failed."""

from __future__ import annotations

import time

import redis
from celery import Celery
from helpers import debounced, make_app, wait_until
from prometheus_client import CollectorRegistry

from celery_debounce import DebounceAdmin, Dispatcher
from celery_debounce.ops import metrics
from celery_debounce.testing.servers import LocalRedis


def test_forced_metric_counts_windows_whose_first_publish_failed(
    redis_server: str, redis_client: redis.Redis
) -> None:
    broker = LocalRedis().start()
    registry = CollectorRegistry()
    enabled = metrics.enable(registry)
    try:
        app: Celery = make_app(
            redis_server,
            broker_url=f"{broker.url}/1",
            broker_connection_timeout=1,
            broker_connection_max_retries=0,
        )

        @debounced(app, debounce="1ms", debounce_max_wait="1ms")
        def forced(n: int) -> None:
            pass

        dispatcher = Dispatcher(app)
        forced.delay(0)
        time.sleep(0.01)
        assert dispatcher.dispatch_once()[0] == 1  # first publish succeeds
        port = broker.port
        broker.cleanup()
        for n in (1, 2, 3):
            forced.delay(n)
        time.sleep(0.01)
        assert dispatcher.dispatch_once()[0] == 0  # publish fails: tries 1 handed back
        broker = LocalRedis(port=port).start()
        wait_until(lambda: dispatcher.dispatch_once()[0], timeout=10, interval=0.2)

        def value(name: str) -> float:
            return (
                registry.get_sample_value(f"celery_debounce_{name}_total", {"task": forced.name})
                or 0.0
            )

        stats = DebounceAdmin(app).stats().tasks[forced.name]
        assert stats.runs == 4 and stats.forced == 4
        assert value("windows_dispatched") == 4
        assert value("windows_forced_by_max_wait") == stats.forced
    finally:
        enabled.disable()
        broker.cleanup()
