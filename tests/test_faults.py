"""Faults against real processes: killed dispatchers and workers, a refusing broker,
a restarted redis-server, corrupt records and skewed producer clocks.

Each test uses a 1 s dispatch lease and a 2 s broker visibility timeout
(tests/fault_app.py) so that recovery happens within seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kombu.transport.redis
import pytest
import redis
from celery import Celery
from fault_app import build
from helpers import running_worker, wait_until

from celery_debounce import DebounceBackendError
from celery_debounce.dispatcher import Dispatcher
from celery_debounce.local_redis import LocalRedis
from celery_debounce.windows import list_windows

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parent


def env_for(redis_url: str, broker_url: str | None = None) -> dict[str, str]:
    env = dict(os.environ, FAULT_REDIS=redis_url, PYTHONPATH=str(TESTS))
    if broker_url:
        env["FAULT_BROKER"] = broker_url
    return env


@contextmanager
def worker_process(redis_url: str, log: Path, broker_url: str | None = None,
                   name: str = "w1") -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A fault_app worker`` (solo pool, embedded dispatcher) in a subprocess."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "fault_app", "worker", "--pool", "solo",
             "--loglevel", "INFO", "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
             "--without-heartbeat"],
            cwd=TESTS, env=env_for(redis_url, broker_url), stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: b"ready." in log.read_bytes() or proc.poll() is not None, 30)
        assert proc.poll() is None, log.read_text()
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def runs(client: redis.Redis, key: str) -> list[str]:
    return [r.decode() for r in client.lrange(f"runs:{key}", 0, -1)]


def doomed_dispatcher(redis_url: str, publish: bool) -> list[str]:
    """A dispatcher process that takes the due windows (and publishes them if asked),
    then is SIGKILLed before ack.lua runs. Returns the ids it took."""
    args = [sys.executable, str(TESTS / "fault_app.py"), "take"] + (["--publish"] if publish
                                                                     else [])
    proc = subprocess.Popen(args, cwd=TESTS, env=env_for(redis_url), stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode().split()
        assert line[:1] == ["TAKEN"], line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    return line[1:]


# -- dispatcher killed -----------------------------------------------------------


def test_dispatcher_killed_between_take_and_publish_the_window_runs_once(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = build(redis_server)
    call = app.tasks["faults.record"].delay("a")
    wait_until(lambda: list_windows(app)[0].deadline <= time.time(), 5)
    time.sleep(0.05)
    assert doomed_dispatcher(redis_server, publish=False) == [call.id]
    (left,) = list_windows(app)
    assert left.state == "dispatching"  # leased by a dead dispatcher
    with running_worker(app):  # another dispatcher: takes it again once the 1 s lease expires
        wait_until(lambda: runs(redis_client, "a"), 15)
        wait_until(lambda: not list_windows(app), 10)
    assert runs(redis_client, "a") == [call.id]  # exactly once: nothing reached the broker
    record = redis_client.hgetall(f"debounce:{{0}}:win:{call.id}")
    assert record[b"st"] == b"finished" and record[b"tries"] == b"2"


def test_dispatcher_killed_after_publish_before_ack_runs_twice(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """The documented at-least-once case: the publish reached the broker, the ack did
    not reach Redis, no worker claimed the window before the lease expired."""
    app = build(redis_server)
    call = app.tasks["faults.record"].delay("b")
    wait_until(lambda: list_windows(app)[0].deadline <= time.time(), 5)
    time.sleep(0.05)
    assert doomed_dispatcher(redis_server, publish=True) == [call.id]
    dispatcher = Dispatcher(app, name="survivor")
    wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)  # after the lease: republished
    with running_worker(app, loglevel="INFO"):
        wait_until(lambda: len(runs(redis_client, "b")) == 2, 15)
        wait_until(lambda: not list_windows(app), 10)
    assert runs(redis_client, "b") == [call.id, call.id]
    record = redis_client.hgetall(f"debounce:{{0}}:win:{call.id}")
    assert record[b"st"] == b"finished"
    # the next call opens a new window, which runs once
    nxt = app.tasks["faults.record"].delay("b")
    assert nxt.id != call.id
    with running_worker(app):
        wait_until(lambda: len(runs(redis_client, "b")) == 3, 15)
        wait_until(lambda: not list_windows(app), 10)
    assert runs(redis_client, "b") == [call.id, call.id, nxt.id]


# -- broker refusing publishes ---------------------------------------------------


def test_broker_down_windows_wait_and_run_once_it_is_back(
    redis_server: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    broker = LocalRedis().start()
    try:
        # a production-like lease (well above the broker's connect time): a publish that
        # blocks for longer than the lease could be taken and sent again (docs/guarantees.md)
        app = build(redis_server, broker_url=f"{broker.url}/0", lease=5.0)
        app.conf.broker_connection_timeout = 1
        app.conf.broker_connection_max_retries = 1
        broker.stop()
        ids = [app.tasks["faults.record"].delay(f"d{i}").id for i in range(5)]
        dispatcher = Dispatcher(app, name="while-down")
        caplog.set_level(logging.WARNING, "celery_debounce.dispatcher")
        dispatcher.start()
        try:
            wait_until(lambda: "will retry" in caplog.text, 15)
            # nothing dropped: every window is still there, leased or pending
            assert sorted(w.task_id for w in list_windows(app)) == sorted(ids)
            time.sleep(1.5)  # a few refused rounds
            assert {w.state for w in list_windows(app)} <= {"dispatching", "pending"}
            LocalRedis(port=broker.port).start()  # the broker is back, same port
            with running_worker(app, without_heartbeat=True):
                wait_until(lambda: all(runs(redis_client, f"d{i}") for i in range(5)), 30)
                wait_until(lambda: not list_windows(app), 10)
        finally:
            dispatcher.stop()
        assert [runs(redis_client, f"d{i}") for i in range(5)] == [[tid] for tid in ids]
    finally:
        subprocess.run(["redis-cli", "-p", str(broker.port), "shutdown", "nosave"],
                       capture_output=True, timeout=10)
        broker.cleanup()


# -- worker killed mid-run ---------------------------------------------------------


@pytest.mark.skipif(
    "unacked_restore_interval" not in (kombu.transport.redis.__doc__ or ""),
    reason="this kombu restores unacked messages only at worker start-up (no "
    "unacked_restore_interval): redelivery after a killed worker needs a restart",
)
def test_worker_killed_mid_run_with_acks_late_is_redelivered(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    app = build(redis_server)
    redis_client.set("block:w", 1)
    call = app.tasks["faults.record"].delay("w")
    with worker_process(redis_server, tmp_path / "w1.log") as worker:
        wait_until(lambda: runs(redis_client, "w") == [call.id], 15)
        assert [w.state for w in list_windows(app)] == ["claimed"]
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    redis_client.delete("block:w")
    # a new worker: the broker restores the unacked message after the visibility timeout
    with worker_process(redis_server, tmp_path / "w2.log", name="w2"):
        wait_until(lambda: len(runs(redis_client, "w")) == 2, 30)
        wait_until(lambda: not list_windows(app), 10)
        record = redis_client.hgetall(f"debounce:{{0}}:win:{call.id}")
        assert record[b"st"] == b"finished" and record[b"rs"] == b"SUCCESS"
        # not stuck: the next call opens a new window and runs once
        nxt = app.tasks["faults.record"].delay("w")
        assert nxt.id != call.id
        wait_until(lambda: len(runs(redis_client, "w")) == 3, 15)
        wait_until(lambda: not list_windows(app), 10)
    assert runs(redis_client, "w") == [call.id, call.id, nxt.id]
    assert "runs again (window was claimed)" in (tmp_path / "w2.log").read_text()


# -- redis-server restart ----------------------------------------------------------


def test_redis_restart_with_aof_during_a_stream_of_calls(tmp_path: Path) -> None:
    server = LocalRedis(appendonly=True).start()
    log = tmp_path / "worker.log"
    try:
        url = server.url
        app = build(url)
        task = app.tasks["faults.record"]
        ok: list[tuple[str, str]] = []
        failed: list[float] = []
        stop = threading.Event()

        def produce() -> None:
            i = 0
            while not stop.is_set():
                key = f"r{i % 10}"
                start = time.monotonic()
                try:
                    ok.append((key, task.delay(key, i).id))
                except DebounceBackendError:
                    failed.append(time.monotonic() - start)
                    time.sleep(0.05)
                i += 1
                time.sleep(0.01)

        with worker_process(url, log) as worker:
            producer = threading.Thread(target=produce)
            producer.start()
            try:
                wait_until(lambda: len(ok) > 50, 15)
                server.stop()  # SIGTERM: redis-server flushes its AOF and exits
                wait_until(lambda: len(failed) >= 3, 15)
                time.sleep(1.0)
                server.start()
                before = len(ok)
                wait_until(lambda: len(ok) > before + 50, 20)
            finally:
                stop.set()
                producer.join(20)
            assert not producer.is_alive(), "a producer call hung"
            client = redis.Redis.from_url(f"{url}/0")
            ids = {tid for _, tid in ok}
            wait_until(lambda: ids <= {r.decode() for k in client.scan_iter("runs:*")
                                       for r in client.lrange(k, 0, -1)}, 30)
            assert worker.poll() is None, "the worker died"
            wait_until(lambda: not list_windows(app), 10)
        assert failed and max(failed) < 5, failed  # an error within seconds, never a hang
        text = log.read_text()
        # reconnects with back-off, no crash loop: a bounded number of retries
        assert text.count("Redis error, retrying") < 30, text[-3000:]
    finally:
        server.cleanup()


# -- corrupt records ---------------------------------------------------------------


def corrupt(client: redis.Redis, app: Celery, key: str, **fields: Any) -> str:
    """Open a window for ``key`` and overwrite fields of its record."""
    tid = app.tasks["faults.record"].apply_async(
        (key,), debounce="300ms", debounce_max_wait="2s").id
    (open_key,) = client.keys(f"debounce:{{0}}:open:*:k:{key}")
    client.hset(open_key, mapping=fields)
    return tid


def test_corrupt_records_are_quarantined_and_do_not_block_others(
    redis_server: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    app = build(redis_server)
    # The dispatcher never decodes a body of another content type than JSON: one the
    # worker cannot decode is published and refused by the worker (as Celery always
    # did), which finishes it as REJECTED.
    rejected = [corrupt(redis_client, app, "c1", ct="application/x-unknown")]
    bad = {
        corrupt(redis_client, app, "c2", p=b"{not json"): "payload is not JSON",
        corrupt(redis_client, app, "c3", o=b"{broken"): "options are not JSON",
        corrupt(redis_client, app, "c4", o=b"[1, 2]"): "options are not an object",
        corrupt(redis_client, app, "c5", o=b'{"expires": "soon"}'): "bad option value",
        corrupt(redis_client, app, "c6", o=b'{"headers": "x"}'): "headers not a mapping",
        corrupt(redis_client, app, "c7", o=b'{"expires_at": "not a time"}'): "bad time",
    }
    good = [app.tasks["faults.record"].delay(f"g{i}") for i in range(3)]
    caplog.set_level(logging.ERROR, "celery_debounce.dispatcher")
    with running_worker(app):
        wait_until(lambda: all(runs(redis_client, f"g{i}") == [good[i].id] for i in range(3)), 15)
        quarantined = wait_until(
            lambda: (q := list_windows(app, states=["quarantined"])) and len(q) == len(bad)
            and q, 15)
        wait_until(lambda: all(
            redis_client.hget(f"debounce:{{0}}:win:{tid}", "rs") == b"REJECTED"
            for tid in rejected), 15)
    assert {w.task_id for w in quarantined} == set(bad)
    assert all(w.error for w in quarantined)
    assert all(not runs(redis_client, f"c{i}") for i in range(1, 8))
    for tid in bad:
        assert f"quarantined faults.record[{tid}]" in caplog.text
    # operators see them in `celery debounce inspect --state quarantined`
    shown = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "fault_app", "debounce", "inspect",
         "--state", "quarantined"],
        cwd=TESTS, env=env_for(redis_server), capture_output=True, text=True, timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert all(tid in shown.stdout for tid in bad)
    assert not list_windows(app, states=["pending", "dispatching", "queued", "claimed"])


# -- skewed producer clocks --------------------------------------------------------


@pytest.mark.parametrize("skew", [-7200.0, 3600.0, 86400.0 * 365])
def test_producer_clock_skew_does_not_change_deadlines(
    redis_server: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
    skew: float,
) -> None:
    app = build(redis_server)
    real_time = time.time
    before = redis_client.time()
    monkeypatch.setattr(time, "time", lambda: real_time() + skew)
    app.tasks["faults.record"].delay("skew")
    monkeypatch.undo()
    after = redis_client.time()
    (window,) = list_windows(app)
    lo = before[0] + before[1] / 1e6
    hi = after[0] + after[1] / 1e6
    assert lo - 0.002 <= window.first_seen <= hi + 0.002
    assert window.deadline == pytest.approx(window.first_seen + 0.2, abs=0.0011)
    assert window.max_wait_at == pytest.approx(window.first_seen + 2.0, abs=0.0011)
