"""``celery beat -S debounce`` never delays a periodic task because of debouncing:
not while a backlog of 20,000 flushed windows (5,000 on PostgreSQL) is dispatched, not
while the windows' Redis hangs (accepts connections, never answers). Real ``celery
beat`` processes; the backlog's test over both stores (the windows in Redis or
PostgreSQL; the broker Redis)."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from beat_app import build
from helpers import StoreCase, made_apps, stop_process, wait_until
from reads import open_count

from celery_debounce import DebounceAdmin, enqueue_many

pytestmark = pytest.mark.usefixtures("store")

TESTS = Path(__file__).resolve().parents[1]
#: A 1 s schedule: consecutive sends may be this far apart at most (1 s + 2 s of slack).
MAX_GAP = 3.0


def _beat(windows: str, broker: str, tmp_path: Path, batch: int = 500) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "DEBOUNCE_BEAT_WINDOWS": windows,
        "DEBOUNCE_BEAT_BROKER": broker,
        "DEBOUNCE_BEAT_BATCH": str(batch),
    }
    with open(tmp_path / "beat.log", "w") as log:  # a file: a full pipe would block beat
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "beat_app",
                "beat",
                "-S",
                "debounce",
                "-s",
                str(tmp_path / "schedule"),
                "-l",
                "info",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
            cwd=tmp_path,
        )


def _stop(proc: subprocess.Popen[str], tmp_path: Path) -> str:
    stop_process(proc)
    return (tmp_path / "beat.log").read_text()


def _heartbeats(
    broker: redis.Redis,
    seconds: float,
    until: Callable[[], bool] = lambda: True,
    samples: list[tuple[float, int]] | None = None,
) -> list[float]:
    """Times (monotonic) at which beat's heartbeat messages arrived, over ``seconds``
    counted from the first one (and on until ``until()``, at most 60 s). ``samples``
    gets (time, length of the broker's default queue) at each heartbeat."""
    wait_until(lambda: broker.llen("heartbeat") > 0, timeout=30, interval=0.05)
    seen, times = broker.llen("heartbeat"), [time.monotonic()]
    end = times[0] + seconds
    while time.monotonic() < end or (not until() and time.monotonic() < end + 60):
        n = broker.llen("heartbeat")
        if n > seen and samples is not None:
            samples.append((time.monotonic(), broker.llen("celery")))
        times += [time.monotonic()] * (n - seen)
        seen = n
        time.sleep(0.05)
    return times


def _assert_keeps_firing(times: list[float], seconds: float) -> None:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert len(times) >= seconds / MAX_GAP, times
    assert max(gaps, default=0.0) <= MAX_GAP, f"beat stalled {max(gaps):.1f}s: {gaps}"


def test_beat_keeps_firing_while_20000_flushed_windows_are_dispatched(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path, store: StoreCase
) -> None:
    windows = store.conf.get("debounce_store_url") or f"{redis_server}/0"
    app = build(windows, f"{redis_server}/1")
    made_apps.add(app)
    sync = app.tasks["beat_app.sync"]
    # on PostgreSQL 5,000: its flush (a statement per window, ~2,000/s) and its take at
    # batches of 5 (~600 windows/s) would make 20,000 take a minute; 5,000 still keep
    # beat publishing for ~8 s, over several of its heartbeats
    backlog = 20_000 if store.name == "redis" else 5_000
    enqueue_many(sync, [((f"k{i}",), {}) for i in range(backlog)], chunk_size=2000)
    assert DebounceAdmin(app).flush_all() == backlog
    broker = redis.Redis.from_url(f"{redis_server}/1")
    # batches of 5: publishing the backlog takes several seconds (thousands of passes)
    proc = _beat(windows, f"{redis_server}/1", tmp_path, batch=5)
    samples: list[tuple[float, int]] = []
    try:
        times = _heartbeats(broker, 8.0, samples=samples)
        _assert_keeps_firing(times, 8.0)
        # heartbeats went out while the backlog was being published (not only around it)
        assert any(0 < queued < backlog for _, queued in samples), samples
        # and the backlog is dispatched meanwhile, every window once
        wait_until(lambda: broker.llen("celery") == backlog, timeout=90, interval=0.5)
        assert open_count(app) == 0
    finally:
        err = _stop(proc, tmp_path)
    assert "Traceback" not in err, err[-3000:]


@pytest.fixture
def hung_redis() -> Iterator[str]:
    """A TCP server that accepts connections and never answers (a hung Redis)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.redis_only("a hung Redis (a TCP server that never answers) as the windows' store")
def test_beat_keeps_firing_while_the_debounce_redis_hangs(
    redis_server: str, redis_client: redis.Redis, hung_redis: str, tmp_path: Path
) -> None:
    broker = redis.Redis.from_url(f"{redis_server}/1")
    proc = _beat(hung_redis, f"{redis_server}/1", tmp_path)
    log = tmp_path / "beat.log"
    try:
        # beat's dispatch passes hang 2 x 3 s (timeout, one retry) each, again and again
        times = _heartbeats(
            broker, 10.0, until=lambda: "beat could not dispatch windows" in log.read_text()
        )
        _assert_keeps_firing(times, 10.0)
    finally:
        err = _stop(proc, tmp_path)
    assert "beat could not dispatch windows" in err  # it did try, and said so
