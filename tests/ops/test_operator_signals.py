"""The operator's signals: the held-windows gauges, ``inspect``'s "after <id> ends" for a
held window, and the max-wait violation counter measured where a run starts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, running_worker, wait_until
from prometheus_client import CollectorRegistry
from reads import store_time_ms

from celery_debounce import DebounceAdmin
from celery_debounce.ops import metrics
from celery_debounce.ops.cli import render_table
from celery_debounce.store.idents import window_ident
from celery_debounce.store.redis.keys import held_key, open_key, run_key, win_key
from celery_debounce.worker import ceiling

pytestmark = pytest.mark.usefixtures("store")


def _hold_one(app: Celery, redis_client: redis.Redis) -> tuple[Any, str]:
    """A window of an exclusive task held behind a (hand-made) queued run of its key."""

    @debounced(
        app,
        name="sig.ex",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k",
        debounce_exclusive=True,
    )
    def ex() -> None:
        pass

    ex.delay()
    tag, ident = "debounce:{0}", window_ident("sig.ex", "k")
    # Redis only: a run of the key and the window held behind it, planted by hand
    now_ms = store_time_ms(app) // 1000 * 1000
    redis_client.hset(win_key(tag, "the-run"), mapping={"st": "queued", "i": ident})
    redis_client.hset(run_key(tag, ident), "id", "the-run")
    redis_client.hset(open_key(tag, ident), "hs", now_ms - 90_000)
    redis_client.zadd(held_key(tag), {ident: now_ms - 90_000})
    return ex, ident


@pytest.mark.redis_only("a held window planted in Redis")
def test_inspect_shows_a_held_window_as_after_its_runner_ends(
    app: Celery, redis_client: redis.Redis
) -> None:
    _hold_one(app, redis_client)
    windows = DebounceAdmin(app).windows()
    assert [w.waits_for for w in windows] == ["the-run"]
    table = render_table(windows, time.time())
    assert "after the-run ends" in table and "pending (held)" in table, table
    assert " in " not in table.splitlines()[1].split("pending (held)")[1], table


@pytest.mark.redis_only("a held window planted in Redis")
def test_the_exporter_gauges_held_windows_and_the_longest_hold(
    app: Celery, redis_client: redis.Redis
) -> None:
    registry = CollectorRegistry()
    metrics.enable_store_gauges(app, registry=registry)
    assert registry.get_sample_value("celery_debounce_held_windows") == 0
    assert registry.get_sample_value("celery_debounce_oldest_held_age_seconds") == 0
    _hold_one(app, redis_client)
    registry = CollectorRegistry()  # a fresh reading (the collector shares one per interval)
    metrics.enable_store_gauges(app, registry=registry)
    assert registry.get_sample_value("celery_debounce_held_windows") == 1
    age = registry.get_sample_value("celery_debounce_oldest_held_age_seconds")
    assert age is not None and 89 <= age < 120


def test_an_exclusive_window_held_behind_a_run_is_not_a_max_wait_violation(
    app_factory: Callable[..., Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A debounce_exclusive window's ceiling is its own or the end of the run it was
    held behind, whichever is later: held past its own, its run is on time."""
    monkeypatch.setattr(ceiling, "MAX_WAIT_TOLERANCE_S", 0.2)
    app = app_factory(debounce_poll_interval=0.05)
    started = threading.Event()

    @debounced(
        app,
        name="sig.exclusive",
        debounce="50ms",
        debounce_max_wait="100ms",
        debounce_key="k",
        debounce_exclusive=True,
    )
    def exclusive(x: int) -> int:
        started.set()
        time.sleep(0.8 if x == 1 else 0)  # the second window is held behind this run
        return x

    registry = CollectorRegistry()
    enabled = metrics.enable(registry)
    try:
        with running_worker(app):
            first = exclusive.delay(1)
            assert started.wait(10)
            second = exclusive.delay(2)  # due in 50 ms, held about 0.7 s: past its own
            assert first.get(timeout=20) == 1 and second.get(timeout=20) == 2
        assert (
            registry.get_sample_value(
                "celery_debounce_windows_held_total", {"task": "sig.exclusive"}
            )
            == 1
        )  # it was held
        assert registry.get_sample_value(
            "celery_debounce_max_wait_violations_total", {"task": "sig.exclusive"}
        ) in (None, 0.0)
    finally:
        enabled.disable()


def test_a_run_past_its_ceiling_counts_one_max_wait_violation(
    app_factory: Callable[..., Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ceiling, "MAX_WAIT_TOLERANCE_S", 0.2)
    app = app_factory(debounce_poll_interval=0.05)

    @debounced(
        app,
        name="sig.late",
        debounce="50ms",
        debounce_max_wait="100ms",
        debounce_key="{0}",
    )
    def late(x: int) -> int:
        return x

    @debounced(
        app,
        name="sig.on_time",
        debounce="50ms",
        debounce_max_wait="30s",
        debounce_key="{0}",
    )
    def on_time(x: int) -> int:
        return x

    registry = CollectorRegistry()
    enabled = metrics.enable(registry)
    try:

        def count(task: str = "sig.late") -> float:
            return (
                registry.get_sample_value(
                    "celery_debounce_max_wait_violations_total", {"task": task}
                )
                or 0.0
            )

        first = late.delay(1)  # no dispatcher yet: its run starts well past its ceiling
        time.sleep(0.6)
        with running_worker(app):
            assert first.get(timeout=20) == 1
            wait_until(lambda: count() == 1, timeout=10)
            assert on_time.delay(2).get(timeout=20) == 2  # within its ceiling: not counted
            assert count("sig.on_time") == 0 and count() == 1
    finally:
        enabled.disable()
