"""``celery debounce exporter``: the store gauges from a process that needs only Redis.

The exporter is started as an operator would (``celery -A app debounce exporter``),
scraped over HTTP, and its values compared with what is really in Redis; a reading
costs the same few commands whatever the number of windows, and scrapes closer than
``--min-interval`` share one reading.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import debounced, make_app, stop_process, wait_until
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from reads import store_time_ms

from celery_debounce import enqueue_many
from celery_debounce.ops.exporter import StoreCollector, exporter_registry
from celery_debounce.store.redis.operators import SNAPSHOT_COMMANDS
from celery_debounce.testing.servers import LocalRedis, free_port

CELERY = str(Path(sys.executable).with_name("celery"))

APP = """
import os

from celery import Celery

from celery_debounce import DebouncedTask

URL = os.environ["EXPAPP_REDIS"]
app = Celery("expapp", broker=f"{URL}/1", backend=f"{URL}/2")
app.conf.update(debounce_redis_url=f"{URL}/0", debounce_redis_timeout=1,
                debounce_shards=int(os.environ.get("EXPAPP_SHARDS", "1")))


@app.task(base=DebouncedTask, debounce="1h", debounce_max_wait="2h", debounce_key="u:{0}")
def touch(user):
    return user
"""


def scrape(port: int) -> dict[str, float]:
    """Every sample of the exporter's /metrics as 'name{labels}' -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def start_exporter(
    tmp_path: Path, url: str, port: int, *extra: str, shards: int = 1
) -> subprocess.Popen[bytes]:
    (tmp_path / "expapp.py").write_text(APP)
    env = {
        **os.environ,
        "EXPAPP_REDIS": url,
        "EXPAPP_SHARDS": str(shards),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [
            CELERY,
            "-A",
            "expapp",
            "debounce",
            "exporter",
            "--port",
            str(port),
            "--addr",
            "127.0.0.1",
            *extra,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _up(port: int) -> dict[str, float] | None:
    try:
        return scrape(port)
    except OSError:
        return None


def test_the_exporter_exports_what_redis_holds_and_stops_cleanly_on_sigterm(
    tmp_path: Path, redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server, debounce_shards=2)

    @debounced(
        app,
        name="expapp.touch",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="u:{0}",
    )
    def touch(user: int) -> None:
        pass

    enqueue_many(touch, [((i,), {}) for i in range(25)])
    # Redis only, planted by hand: one window due 5 s ago, nobody took it; two
    # quarantined; a dispatcher seen 30 s ago
    now_ms = store_time_ms(app) // 1000 * 1000
    redis_client.zadd("debounce:{1}:due", {"overdue": now_ms - 5000})
    redis_client.zadd("debounce:{0}:quarantine", {"q1": 1, "q2": 2})
    redis_client.zadd("debounce:{0}:dispatchers", {"worker-gone@host": now_ms - 30_000})
    # the store's own counters (take.lua writes them): 4 runs carrying 9 calls
    redis_client.hset("debounce:{1}:stats", mapping={"r|expapp.touch": 4, "c|expapp.touch": 9})
    port = free_port()
    proc = start_exporter(tmp_path, redis_server, port, "--min-interval", "0", shards=2)
    try:
        got = wait_until(lambda: _up(port), timeout=30, interval=0.2)
        assert got["celery_debounce_store_up"] == 1
        assert got["celery_debounce_open_windows"] == 26
        assert got["celery_debounce_due_windows"] == 1
        assert 4 <= got["celery_debounce_oldest_due_age_seconds"] < 30
        assert got["celery_debounce_quarantined_windows"] == 2
        assert got["celery_debounce_inflight_windows"] == 0
        assert got["celery_debounce_dispatchers_seen"] == 1
        assert 29 <= got["celery_debounce_seconds_since_last_batch"] < 60
        assert (
            29
            <= got["celery_debounce_dispatcher_last_batch_age_seconds{dispatcher=worker-gone@host}"]
            < 60
        )
        assert got["celery_debounce_store_runs_total{task=expapp.touch}"] == 4
        assert got["celery_debounce_store_calls_total{task=expapp.touch}"] == 9
        assert got["celery_debounce_exporter_reads_total"] >= 1
        assert got["celery_debounce_exporter_read_errors_total"] == 0
        # nothing but the store and the exporter: no process_* or python_* series
        assert all(name.startswith("celery_debounce_") for name in got), sorted(got)
        # every scrape reads Redis again (--min-interval 0)
        redis_client.zrem("debounce:{1}:due", "overdue")  # Redis only: by hand
        redis_client.delete("debounce:{0}:dispatchers")
        after = scrape(port)
        assert after["celery_debounce_oldest_due_age_seconds"] == 0
        assert "celery_debounce_seconds_since_last_batch" not in after  # none recorded
        assert after["celery_debounce_dispatchers_seen"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=20)[0].decode()
    assert proc.returncode == 0, out
    assert re.search(r"serving the store gauges on http://127\.0\.0\.1:\d+/metrics", out), out
    assert "stopped" in out, out


def test_the_exporter_keeps_answering_while_redis_is_down(tmp_path: Path) -> None:
    server = LocalRedis().start()
    port = free_port()
    proc = start_exporter(tmp_path, server.url, port, "--min-interval", "0")
    try:
        assert (
            wait_until(lambda: _up(port), timeout=30, interval=0.2)["celery_debounce_store_up"] == 1
        )
        redis_port = server.port
        server.cleanup()
        down = scrape(port)
        assert down["celery_debounce_store_up"] == 0
        assert "celery_debounce_open_windows" not in down  # no made-up value
        assert down["celery_debounce_exporter_read_errors_total"] >= 1
        server = LocalRedis(port=redis_port).start()
        wait_until(lambda: scrape(port)["celery_debounce_store_up"] == 1, timeout=15, interval=0.3)
    finally:
        stop_process(proc)
        server.cleanup()


def test_a_port_in_use_is_a_clear_error(tmp_path: Path, redis_server: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = start_exporter(tmp_path, redis_server, taken.getsockname()[1])
        out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 1, out
    assert "cannot listen on 127.0.0.1:" in out, out


def test_a_wrong_configuration_stops_it_at_start(tmp_path: Path) -> None:
    proc = start_exporter(tmp_path, "http://nowhere", free_port())
    out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 1, out
    assert "debounce_redis_url='http://nowhere/0': expected a redis://" in out, out


def _commands(client: redis.Redis) -> int:
    return sum(row["calls"] for row in client.info("commandstats").values())


def test_a_reading_costs_the_same_few_commands_whatever_the_windows_and_is_shared(
    app_factory: Callable[..., Any], redis_client: redis.Redis
) -> None:
    app = app_factory(debounce_shards=3)

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="u:{0}",
    )
    def work(user: int) -> None:
        pass

    registry = CollectorRegistry()
    collector = StoreCollector(app)
    registry.register(collector)
    costs = []
    for n in (20, 5000):
        enqueue_many(work, [((i,), {}) for i in range(n)])
        before = _commands(redis_client)
        assert registry.get_sample_value("celery_debounce_open_windows") == n
        # INFO commandstats itself is one command
        costs.append(_commands(redis_client) - before - 1)
        redis_client.flushdb()  # Redis only: set-up
    assert costs == [1 + SNAPSHOT_COMMANDS * 3] * 2, costs
    # scrapes within min_interval (as from several Prometheus servers) share one reading
    shared = exporter_registry(app, min_interval=60)
    before = _commands(redis_client)
    for _ in range(5):
        assert shared.get_sample_value("celery_debounce_store_up") == 1
    assert _commands(redis_client) - before - 1 == 1 + SNAPSHOT_COMMANDS * 3
    assert shared.get_sample_value("celery_debounce_exporter_reads_total") == 1


@pytest.mark.usefixtures("store")
def test_a_reading_that_fails_unexpectedly_says_store_down_and_the_exporter_keeps_serving(
    app_factory: Callable[..., Any], monkeypatch: Any
) -> None:
    from celery_debounce.ops import exporter

    app = app_factory()
    registry = exporter_registry(app, min_interval=0)

    def broken(store: Any) -> Any:
        raise RuntimeError("an odd reply")

    monkeypatch.setattr(exporter, "read_snapshot", broken)
    once = {s.name: s.value for family in registry.collect() for s in family.samples}
    assert once["celery_debounce_store_up"] == 0
    assert "celery_debounce_open_windows" not in once
    assert once["celery_debounce_exporter_read_errors_total"] == 1
    monkeypatch.undo()
    assert registry.get_sample_value("celery_debounce_store_up") == 1
