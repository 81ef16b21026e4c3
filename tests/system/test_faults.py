"""Faults against real processes: killed dispatchers and workers, a refusing broker,
a restarted redis-server, corrupt records and skewed producer clocks.

Each test uses a 1 s dispatch lease and a 2 s broker visibility timeout
(tests/fault_app.py) so that recovery happens within seconds.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from fault_app import build
from helpers import celery_worker, running_worker, wait_until

from celery_debounce import DebounceBackendError
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.ops.admin import DebounceAdmin
from celery_debounce.ops.read_view import list_windows
from celery_debounce.signals import duplicate_skipped, window_held
from celery_debounce.testing.servers import LocalRedis

pytestmark = pytest.mark.slow
TESTS = Path(__file__).parents[1]


def env_for(redis_url: str, broker_url: str | None = None) -> dict[str, str]:
    # tests/ and the tree they belong to come first: a subprocess imports the same
    # celery_debounce as this process (scripts/mutation_check.py runs a mutated copy)
    path = [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, FAULT_REDIS=redis_url, PYTHONPATH=os.pathsep.join(filter(None, path)))
    if broker_url:
        env["FAULT_BROKER"] = broker_url
    return env


@contextmanager
def worker_process(
    redis_url: str,
    log: Path,
    broker_url: str | None = None,
    name: str = "w1",
    extra_env: dict[str, str] | None = None,
    pool: str = "solo",
) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A fault_app worker`` (solo pool unless told, embedded dispatcher) in a
    subprocess."""
    env = {**env_for(redis_url, broker_url), **(extra_env or {})}
    with celery_worker("fault_app", log, env, pool=pool, name=name) as proc:
        yield proc


def runs(client: redis.Redis, key: str) -> list[str]:
    return [r.decode() for r in client.lrange(f"runs:{key}", 0, -1)]


def doomed_dispatcher(redis_url: str, publish: bool) -> list[str]:
    """A dispatcher process that takes the due windows (and publishes them if asked),
    then is SIGKILLed before ack.lua runs. Returns the ids it took."""
    args = [sys.executable, str(TESTS / "fault_app.py"), "take"] + (
        ["--publish"] if publish else []
    )
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


def test_dispatcher_killed_after_publish_before_ack_runs_the_body_once(
    redis_server: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The publish reached the broker, the ack did not reach Redis, no worker claimed
    the window before the lease expired: the window is published again (two messages),
    and the second delivery, finding the window finished, is skipped before the body."""
    app = build(redis_server)
    call = app.tasks["faults.record"].delay("b")
    wait_until(lambda: list_windows(app)[0].deadline <= time.time(), 5)
    time.sleep(0.05)
    assert doomed_dispatcher(redis_server, publish=True) == [call.id]
    dispatcher = Dispatcher(app, name="survivor")
    wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)  # after the lease: republished
    caplog.set_level(logging.INFO, "celery_debounce.worker")
    key = f"debounce:{{0}}:win:{call.id}"
    skipped: list[dict[str, Any]] = []

    def on_skip(sender: str, **kwargs: Any) -> None:
        skipped.append(dict(kwargs, sender=sender))

    duplicate_skipped.connect(on_skip)
    try:
        with running_worker(app, loglevel="INFO"):
            wait_until(lambda: skipped, 15)
            wait_until(lambda: not list_windows(app), 10)
    finally:
        duplicate_skipped.disconnect(on_skip)
    assert runs(redis_client, "b") == [call.id]  # the body ran once
    first = redis_client.hgetall(key)
    assert (first[b"st"], first[b"rs"]) == (b"finished", b"SUCCESS")  # not IGNORED
    assert redis_client.zscore("debounce:{0}:active", call.id) is None
    assert f"faults.record[{call.id}] skipped: a duplicate delivery" in caplog.text
    assert skipped == [
        {
            "sender": "faults.record",
            "task_id": call.id,
            "state": "finished",
            "signal": duplicate_skipped,
        }
    ]
    assert redis_client.hget("debounce:{0}:stats", "d|faults.record") == b"1"
    assert DebounceAdmin(app).stats().tasks["faults.record"].duplicates_skipped == 1
    # the next call opens a new window, which runs once
    nxt = app.tasks["faults.record"].delay("b")
    assert nxt.id != call.id
    with running_worker(app):
        wait_until(lambda: len(runs(redis_client, "b")) == 2, 15)
        wait_until(lambda: not list_windows(app), 10)
    assert runs(redis_client, "b") == [call.id, nxt.id]


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_duplicate_delivery_is_skipped_in_a_worker_of_every_pool(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path, pool: str
) -> None:
    """As above, in a worker process of each pool: the skip hook reaches prefork
    children (installed before the fork) and threads; the claim of the first run is
    renewed from the process that runs it."""
    app = build(redis_server)
    call = app.tasks["faults.record"].delay("p")
    wait_until(lambda: list_windows(app)[0].deadline <= time.time(), 5)
    time.sleep(0.05)
    assert doomed_dispatcher(redis_server, publish=True) == [call.id]
    dispatcher = Dispatcher(app, name="survivor")
    wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)  # after the lease: republished
    log = tmp_path / "w.log"
    with worker_process(redis_server, log, pool=pool):
        wait_until(lambda: "skipped: a duplicate delivery" in log.read_text(), 20)
        wait_until(lambda: not list_windows(app), 10)
    assert runs(redis_client, "p") == [call.id]
    assert redis_client.hget("debounce:{0}:stats", "d|faults.record") == b"1"


def test_a_worker_claiming_before_the_lease_expires_stops_the_republish(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """Crash-table row 3: the dispatcher died after publishing, before its ack, and a
    worker claims the message before the lease expires: the window runs once."""
    # visibility well above the run: the broker must not redeliver the held message
    app = build(redis_server, visibility=60)
    redis_client.set("block:c", 1)
    call = app.tasks["faults.record"].delay("c")
    wait_until(lambda: list_windows(app)[0].deadline <= time.time(), 5)
    time.sleep(0.05)
    assert doomed_dispatcher(redis_server, publish=True) == [call.id]
    record = f"debounce:{{0}}:win:{call.id}"
    with running_worker(app):  # its embedded dispatcher takes expired leases
        wait_until(lambda: runs(redis_client, "c") == [call.id], 15)
        assert redis_client.hget(record, "st") == b"claimed"
        assert redis_client.zscore("debounce:{0}:leased", call.id) is None
        claimed_at = redis_client.zscore("debounce:{0}:active", call.id)
        # an ack arriving after the claim (a slow dispatcher) leaves the claim alone
        backend = Dispatcher(app).store
        acked = backend.run(
            "ack", ["debounce:{0}:leased", "debounce:{0}:active"], ["debounce:{0}", call.id]
        )
        assert acked[0] == 0 and redis_client.hget(record, "st") == b"claimed"
        assert redis_client.zscore("debounce:{0}:active", call.id) == claimed_at
        # well past the 1 s lease: passes of the embedded dispatcher leave it alone
        leased_at = time.time()
        wait_until(lambda: time.time() > leased_at + 2.5, 5)
        assert runs(redis_client, "c") == [call.id]
        assert redis_client.hget(record, "tries") == b"1"
        redis_client.delete("block:c")
        wait_until(lambda: redis_client.hget(record, "st") == b"finished", 10)
    assert runs(redis_client, "c") == [call.id]


def test_a_publish_is_not_started_after_half_the_lease(
    redis_server: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The half-lease guard: a batch whose first publish blocks past half the lease
    leaves the rest leased (not acked, not published); they are published once, by
    the next take after the lease, and every window runs once."""
    from celery.signals import before_task_publish

    app = build(redis_server, lease=2.0)
    calls = [app.tasks["faults.record"].delay(f"h{i}") for i in range(3)]
    wait_until(lambda: all(w.deadline <= time.time() for w in list_windows(app)), 5)
    time.sleep(0.05)
    slow = threading.Event()

    def block_first_publish(**_: Any) -> None:
        if not slow.is_set():  # the broker hangs for longer than the whole lease
            slow.set()
            time.sleep(2.5)

    dispatcher = Dispatcher(app, name="slow-broker")
    caplog.set_level(logging.WARNING, "celery_debounce.dispatcher")
    before_task_publish.connect(block_first_publish, weak=False)
    try:
        published, _ = dispatcher.dispatch_once()
    finally:
        before_task_publish.disconnect(block_first_publish)
    assert published == 1
    assert caplog.text.count("half its 2000ms lease passed") == 2
    states = {w.task_id: w.state for w in list_windows(app)}
    assert sorted(states.values()) == ["dispatching", "dispatching", "queued"]
    skipped = [tid for tid, st in states.items() if st == "dispatching"]
    # after the lease the next take publishes them (attempt 2), each once
    wait_until(lambda: dispatcher.dispatch_once()[0] == 2, 10)
    for tid in skipped:
        assert redis_client.hget(f"debounce:{{0}}:win:{tid}", "tries") == b"2"
    with running_worker(app):
        wait_until(lambda: all(runs(redis_client, f"h{i}") for i in range(3)), 15)
        wait_until(lambda: not list_windows(app), 10)
    assert [runs(redis_client, f"h{i}") for i in range(3)] == [[c.id] for c in calls]


def test_many_dispatchers_with_small_batches_publish_each_window_once(
    redis_server: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Real contention: 200 due windows, batches of 4, four dispatcher loops at once
    (and no embedded one); every window is published once and runs once. The lease is
    5 s, not the fault tests' 1 s: a dispatcher that a loaded machine stalls past a 1 s
    lease has its windows taken over, which is the lease working (tested on its own),
    not the contention under test."""
    app = build(redis_server, lease=5.0, debounce_dispatch_batch=4, debounce_dispatcher=False)
    task = app.tasks["faults.record"]
    ids = [task.delay(f"m{i}").id for i in range(200)]
    wait_until(lambda: all(w.deadline <= time.time() for w in list_windows(app)), 10)
    caplog.set_level(logging.INFO, "celery_debounce.dispatcher")
    dispatchers = [Dispatcher(app, name=f"d{i}") for i in range(4)]
    for d in dispatchers:
        d.start()
    try:
        with running_worker(app):
            wait_until(lambda: not list_windows(app), 60)
    finally:
        for d in dispatchers:
            d.stop()
    assert [runs(redis_client, f"m{i}") for i in range(200)] == [[tid] for tid in ids]
    sent = [r for r in caplog.records if r.getMessage().startswith("debounce: dispatched")]
    assert sorted(r.getMessage().split("[")[1].split("]")[0] for r in sent) == sorted(ids)
    assert not any("attempt" in r.getMessage() for r in sent)
    # the dispatchers did contend: more than one of them published windows
    assert len({r.threadName for r in sent}) >= 2, {r.threadName for r in sent}


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
        subprocess.run(
            ["redis-cli", "-p", str(broker.port), "shutdown", "nosave"],
            capture_output=True,
            timeout=10,
        )
        broker.cleanup()


# -- worker killed mid-run ---------------------------------------------------------


def test_worker_killed_mid_run_with_acks_late_is_redelivered(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The killed run's claim goes stale within its 2 s lease; the redelivered message
    then runs again (at least once for a crash mid-run)."""
    app = build(redis_server)
    redis_client.set("block:w", 1)
    call = app.tasks["faults.record"].delay("w")
    with worker_process(redis_server, tmp_path / "w1.log") as worker:
        wait_until(lambda: runs(redis_client, "w") == [call.id], 15)
        delivered = time.monotonic()
        assert [w.state for w in list_windows(app)] == ["claimed"]
        # renewed while the run lasts: past two leases it is still claimed
        time.sleep(4.5)
        assert [w.state for w in list_windows(app)] == ["claimed"]
        delivered = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    redis_client.delete("block:w")
    # A new worker restores the unacked message once the 2 s visibility timeout has
    # passed. Every kombu sweeps when a worker starts; kombu >= 5.7 also sweeps every
    # unacked_restore_interval, older ones only every ~100 s (docs/guarantees.md).
    # Starting the new worker after the timeout makes this hold on every kombu.
    wait_until(lambda: time.monotonic() > delivered + 3.0, 10)
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
    assert not redis_client.exists("debounce:{0}:claims")
    assert "runs again: its previous claim went stale" in (tmp_path / "w2.log").read_text()


def test_worker_killed_mid_run_without_acks_late_releases_its_claim_within_the_lease(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Without acks_late the run is lost (Celery's at-most-once; no worker consumes the
    queue after the kill here), and its claim goes stale within one claim lease (2 s)
    and is released, instead of staying claimed until debounce_record_ttl."""
    app = build(redis_server)
    redis_client.set("block:n", 1)
    call = app.tasks["faults.record"].delay("n")
    with worker_process(
        redis_server, tmp_path / "w1.log", extra_env={"FAULT_ACKS_LATE": "0"}
    ) as worker:
        wait_until(lambda: runs(redis_client, "n") == [call.id], 15)
        assert [w.state for w in list_windows(app)] == ["claimed"]
        # the solo pool: Celery sends even an early ack through the event loop, which
        # the run blocks, so the message is still unacked at the broker (guarantees.md)
        assert redis.Redis.from_url(f"{redis_server}/1").hlen("unacked") == 1
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        killed = time.monotonic()
    redis_client.delete("block:n")
    record = f"debounce:{{0}}:win:{call.id}"
    dispatcher = Dispatcher(app, name="survivor")
    wait_until(
        lambda: (
            dispatcher.dispatch_once() is not None and redis_client.hget(record, "st") == b"stale"
        ),
        10,
    )
    assert time.monotonic() - killed < 2.0 + 1.5  # one lease and a dispatcher pass
    assert redis_client.zscore("debounce:{0}:active", call.id) is None
    assert not redis_client.exists("debounce:{0}:claims")
    assert not list_windows(app)
    assert runs(redis_client, "n") == [call.id]  # nothing redelivered it


def test_a_run_that_stored_its_result_then_lost_its_process_resolves_every_id(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The pool child stored SUCCESS, then died before task_postrun finished the window
    (here: in after_return). Celery keeps the run's SUCCESS ("succeeded before the
    worker was lost"); the main process finishes the window with it, so the group
    members that joined it get the same result instead of staying PENDING."""
    from celery import group

    results = f"{redis_server}/2"
    app = build(redis_server, result_backend=results)
    task = app.tasks["faults.stored_then_lost"]
    first = task.delay("s")
    members = group(task.s("s") for _ in range(3)).apply_async()
    ids = [first.id] + [m.id for m in members.results]
    log = tmp_path / "w1.log"
    env = {"FAULT_RESULTS": results, "FAULT_ACKS_LATE": "0", "FAULT_VISIBILITY": "120"}
    with worker_process(redis_server, log, extra_env=env, pool="prefork"):
        outcomes = [app.AsyncResult(i) for i in ids]
        wait_until(lambda: all(r.ready() for r in outcomes), 20)
    assert [r.get(timeout=5) for r in outcomes] == ["s"] * 4
    assert len(runs(redis_client, "s")) == 1
    record = redis_client.hgetall(f"debounce:{{0}}:win:{first.id}")
    assert (record[b"st"], record[b"rs"]) == (b"finished", b"SUCCESS")
    assert "succeeded, then lost its worker process" in log.read_text()


@pytest.mark.parametrize(
    "how",
    [
        "child, no acks_late",
        "child, acks_late",
        "child, acks_late, reject_on_worker_lost",
        "child, hard time limit",
        "whole worker, acks_late",
    ],
)
def test_a_run_whose_worker_process_is_killed_resolves_every_id_its_callers_hold(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path, how: str
) -> None:
    """A window that a plain call and a group of three joined; its run's process is
    SIGKILLed mid-run. Killing a prefork child: the worker's main process stores
    FAILURE (WorkerLostError) for the run's id, and finishes the window with it, so
    every group member's id (an alias) fails the same way at once, instead of staying
    PENDING forever; with reject_on_worker_lost Celery puts the message back instead,
    and the redelivery runs at once (the dead claim ended) and resolves every id with
    its result. Killing the whole worker with acks_late: the redelivered run, on a new
    worker, resolves every id with its result."""
    from celery import group

    results = f"{redis_server}/2"
    app = build(redis_server, result_backend=results)
    task = app.tasks["faults.lost"]
    redis_client.set("block:c:1", 1)  # the first run blocks (a redelivery does not)
    env = {
        "FAULT_RESULTS": results,
        "FAULT_ACKS_LATE": "0" if "no acks_late" in how else "1",
        "FAULT_REJECT_ON_WORKER_LOST": "1" if "reject_on_worker_lost" in how else "0",
    }
    child = how.startswith("child")
    if child:  # the broker must not redeliver, nor the claim lapse, before the main
        # process sees its child die (that took up to 4 s on the loaded test machine)
        env["FAULT_VISIBILITY"] = "120"
        env["FAULT_CLAIM_LEASE"] = "60"
    if "time limit" in how:  # the main process kills the child at the limit
        env["FAULT_TIME_LIMIT"] = "2"
    first = task.delay("c")
    members = group(task.s("c") for _ in range(3)).apply_async()
    ids = [first.id] + [m.id for m in members.results]
    assert len(set(ids)) == 4  # one window: the run's id and three aliases
    log = tmp_path / "w1.log"
    with worker_process(
        redis_server, log, extra_env=env, pool="prefork" if child else "solo"
    ) as worker:
        wait_until(lambda: runs(redis_client, "c"), 15)
        ((run_id, pid),) = (r.split() for r in runs(redis_client, "c"))
        assert run_id == first.id
        killed = time.monotonic()
        if child:
            if "time limit" not in how:
                os.kill(int(pid), signal.SIGKILL)  # the pool child, mid-run
            if "reject_on_worker_lost" in how:  # put back, and run again at once
                wait_until(lambda: len(runs(redis_client, "c")) == 2, 20)
            outcomes = [app.AsyncResult(i) for i in ids]
            wait_until(lambda: all(r.ready() for r in outcomes), 20)
        else:
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
    if not child:
        wait_until(lambda: time.monotonic() > killed + 3.0, 10)  # the visibility timeout
        with worker_process(redis_server, tmp_path / "w2.log", name="w2", extra_env=env):
            outcomes = [app.AsyncResult(i) for i in ids]
            wait_until(lambda: all(r.ready() for r in outcomes), 30)
    record = redis_client.hgetall(f"debounce:{{0}}:win:{first.id}")
    if how in ("child, no acks_late", "child, acks_late", "child, hard time limit"):
        assert [r.state for r in outcomes] == ["FAILURE"] * 4
        lost = "TimeLimitExceeded" if "time limit" in how else "WorkerLostError"
        assert all(type(r.result).__name__ == lost for r in outcomes), outcomes
        assert (record[b"st"], record[b"rs"]) == (b"finished", b"FAILURE")
        assert len(runs(redis_client, "c")) == 1  # nothing ran it again
        assert "lost its worker process mid-run" in log.read_text()
    else:
        assert [r.get(timeout=5) for r in outcomes] == ["c"] * 4
        assert (record[b"st"], record[b"rs"]) == (b"finished", b"SUCCESS")
        assert [r.split()[0] for r in runs(redis_client, "c")] == [first.id] * 2
        if child:  # the dead run's claim ended at once: the delivery put back ran as it came
            assert "skipped: a duplicate delivery" not in log.read_text()
    assert not redis_client.zrange("debounce:{0}:claims", 0, -1)
    assert not list_windows(app)


# -- debounce_exclusive --------------------------------------------------------------


def test_a_burst_during_a_run_of_an_exclusive_task_gives_one_follow_up_after_the_run(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """Done when of issue 21, on a real worker that could overlap runs (threads pool, 4
    at once): a burst during a 3 s run of an exclusive task gives exactly one follow-up,
    which starts after the run ended; the follow-up got the burst's calls (its window
    kept absorbing them while held). A plain task on the same worker is not held."""
    from prometheus_client import CollectorRegistry

    from celery_debounce.ops import metrics

    app = build(redis_server)
    task = app.tasks["faults.exclusive"]
    registry = CollectorRegistry()
    enabled = metrics.enable(registry)
    held_signals: list[dict[str, Any]] = []

    def on_held(sender: str, **kwargs: Any) -> None:
        held_signals.append(dict(kwargs, sender=sender))

    window_held.connect(on_held)
    try:
        _burst_during_an_exclusive_run(app, task, redis_client)
    finally:
        window_held.disconnect(on_held)
        enabled.disable()
    (signal_,) = held_signals
    assert signal_["sender"] == "faults.exclusive" and signal_["held"] > 1.0
    assert (
        registry.get_sample_value(
            "celery_debounce_windows_held_total", {"task": "faults.exclusive"}
        )
        == 1
    )
    assert (
        registry.get_sample_value(
            "celery_debounce_held_seconds_total", {"task": "faults.exclusive"}
        )
        == signal_["held"]
    )


def test_a_burst_during_a_30_s_run_of_an_exclusive_task_gives_one_follow_up_after_it(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """The done-when of run-aware windows as written: a 30 s run (fifteen claim leases of
    2 s, renewed; thirty ceilings of the burst's 1 s max wait) and a burst during it:
    exactly one follow-up, which starts after the run ends."""
    app = build(redis_server)
    _burst_during_an_exclusive_run(app, app.tasks["faults.exclusive"], redis_client, seconds=30.0)


def _burst_during_an_exclusive_run(
    app: Celery, task: Any, redis_client: redis.Redis, seconds: float = 3.0
) -> None:
    with running_worker(app, pool="threads", concurrency=4):
        first = task.delay("e", seconds)
        wait_until(lambda: any(r.startswith("start") for r in runs(redis_client, "e")), 15)
        burst = [task.delay("e", 0.0, i) for i in range(20)]
        time.sleep(0.3)  # the burst's window is due well before the run ends: held
        assert {b.id for b in burst} == {burst[0].id}
        assert redis_client.zscore("debounce:{0}:held", "16:faults.exclusive:x:e") is not None
        (held,) = [w for w in list_windows(app) if w.task_id == burst[0].id]
        assert held.state == "pending" and held.waits_for == first.id
        assert held.held_since is not None
        later = task.delay("e", 0.0, 99)  # still absorbed while held
        assert later.id == burst[0].id
        wait_until(lambda: len(runs(redis_client, "e")) == 4, 15 + seconds)
        wait_until(lambda: not list_windows(app), 10)
        time.sleep(1.0)  # nothing more runs
    events = [r.split() for r in runs(redis_client, "e")]
    assert [(e[0], e[1]) for e in events] == [
        ("start", first.id),
        ("end", first.id),
        ("start", burst[0].id),
        ("end", burst[0].id),
    ]
    first_end, follow_start = int(events[1][2]), int(events[2][2])
    assert follow_start >= first_end
    assert follow_start - first_end < 1500  # published when the run ended (poll 0.2 s)
    stats = DebounceAdmin(app).stats().tasks["faults.exclusive"]
    assert (stats.runs, stats.calls, stats.holds) == (2, 22, 1)
    assert stats.held_ms > 1000


@pytest.mark.parametrize("acks_late", [False, True])
def test_a_window_held_behind_a_killed_exclusive_run_runs_within_one_claim_lease(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path, acks_late: bool
) -> None:
    """A SIGKILLed worker holds its exclusive key for at most one claim lease (2 s
    here): its claim goes stale, the key is freed and the held window runs. With
    acks_late the killed run is redelivered too and runs again (at least once).

    The threads pool: the solo pool's run blocks the event loop through which Celery
    sends even an early ack, so without acks_late its message would stay unacked at
    the Redis broker and be delivered again as well (guarantees.md)."""
    app = build(redis_server)
    task = app.tasks["faults.exclusive"]
    broker = redis.Redis.from_url(f"{redis_server}/1")
    env = {"FAULT_ACKS_LATE": "1" if acks_late else "0"}
    first = task.delay("z", 30.0)
    with worker_process(redis_server, tmp_path / "w1.log", extra_env=env, pool="threads") as worker:
        wait_until(lambda: runs(redis_client, "z"), 15)
        follow = task.delay("z", 0.0, 1)
        wait_until(
            lambda: redis_client.zscore("debounce:{0}:held", "16:faults.exclusive:x:z") is not None,
            5,
        )
        # acked early, or unacked until the run ends (acks_late)
        wait_until(lambda: broker.hlen("unacked") == (1 if acks_late else 0), 5)
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        killed = time.monotonic()
    # a second run of the killed window (the redelivery with acks_late) ends at once,
    # so the held window's start measures the key's release, not that run's 30 s
    redis_client.set("stop:z", 1)
    with worker_process(
        redis_server, tmp_path / "w2.log", name="w2", extra_env=env, pool="threads"
    ):
        wait_until(lambda: f"end {follow.id}" in " ".join(runs(redis_client, "z")), 20)
        started = [r for r in runs(redis_client, "z") if r.startswith(f"start {follow.id}")]
        assert len(started) == 1
        # at most a claim lease (2 s) + a dispatcher pass + the new worker's start
        assert time.monotonic() - killed < 2.0 + 8.0
        if acks_late:  # the killed run is redelivered after the visibility timeout
            wait_until(
                lambda: [r for r in runs(redis_client, "z") if r.startswith(f"start {first.id}")][
                    1:
                ],
                20,
            )
    starts = [r.split()[1] for r in runs(redis_client, "z") if r.startswith("start")]
    assert starts.count(follow.id) == 1
    # Without acks_late the killed run is not run again, unless a copy of its message was
    # delivered and skipped while it ran (a loaded machine stalled the dispatcher past its
    # 1 s lease: published twice): claim.lua marks the claim, and once the claim is stale
    # take.lua publishes the window again rather than trust a skipped copy (design.md)
    copies = int(redis_client.hget("debounce:{0}:stats", "d|faults.exclusive") or 0)
    assert starts.count(first.id) == (2 if acks_late or copies else 1), copies


def test_a_killed_pool_child_frees_its_exclusive_key_at_once(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """A prefork child killed mid-run of an exclusive task: the worker's main process
    finishes the window FAILURE, which frees the key, so the window held behind it runs
    then, not a claim lease later (60 s here, past the test's timeout)."""
    app = build(redis_server)
    task = app.tasks["faults.exclusive"]
    first = task.delay("p", 30.0)
    env = {"FAULT_ACKS_LATE": "0", "FAULT_CLAIM_LEASE": "60", "FAULT_VISIBILITY": "120"}
    with worker_process(redis_server, tmp_path / "w1.log", extra_env=env, pool="prefork") as worker:
        wait_until(lambda: runs(redis_client, "p"), 15)
        follow = task.delay("p", 0.0, 1)
        wait_until(
            lambda: redis_client.zscore("debounce:{0}:held", "16:faults.exclusive:x:p") is not None,
            5,
        )
        children = Path(f"/proc/{worker.pid}/task/{worker.pid}/children").read_text().split()
        assert len(children) == 2, children  # --concurrency 2
        for child in children:  # the one running the first window, and an idle one
            os.kill(int(child), signal.SIGKILL)
        wait_until(lambda: f"end {follow.id}" in " ".join(runs(redis_client, "p")), 20)
    record = redis_client.hgetall(f"debounce:{{0}}:win:{first.id}")
    assert (record[b"st"], record[b"rs"]) == (b"finished", b"FAILURE")
    starts = [r.split()[1] for r in runs(redis_client, "p") if r.startswith("start")]
    assert starts == [first.id, follow.id]


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
            wait_until(
                lambda: (
                    ids
                    <= {
                        r.decode()
                        for k in client.scan_iter("runs:*")
                        for r in client.lrange(k, 0, -1)
                    }
                ),
                30,
            )
            assert worker.poll() is None, "the worker died"
            wait_until(lambda: not list_windows(app), 10)
        # a refused connection: the error within about a second (timeout 1 s + margin)
        assert failed and max(failed) < 1.0 + 1.0, failed
        text = log.read_text()
        # the dispatcher backs off: 0.1 s doubling to 5 s, back to 0.1 s after a success
        delays = [float(d) for d in re.findall(r"window store error, retrying in ([\d.]+)s", text)]
        assert delays[:3] == [0.1, 0.2, 0.4], text[-3000:]  # the outage lasts > 1.2 s
        for before, after in itertools.pairwise(delays):
            assert after in (0.1, round(min(before * 2, 5.0), 1)), delays
    finally:
        server.cleanup()


@pytest.mark.parametrize("how", ["SIGSTOP", "silent socket"])
def test_an_unresponsive_redis_is_an_error_within_the_timeout(redis_server: str, how: str) -> None:
    """A server that accepts connections and never answers (a stopped redis-server, or a
    socket nobody reads): the caller gets DebounceBackendError within
    debounce_redis_timeout (1 s here) plus a margin, never a hang."""
    import socket

    server: LocalRedis | None = None
    listener: socket.socket | None = None
    if how == "SIGSTOP":
        server = LocalRedis().start()
        url = server.url
    else:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # connections complete in the backlog; nothing ever replies
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}"
    try:
        app = build(url, broker_url=f"{redis_server}/1")
        task = app.tasks["faults.record"]
        if server is not None:
            task.delay("before")  # a pooled connection and loaded scripts, then the stop
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSTOP)
        outcome: list[BaseException | float] = []

        def call() -> None:
            start = time.monotonic()
            try:
                task.delay("during")
            except BaseException as exc:  # reported below
                outcome.extend([exc, time.monotonic() - start])

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(10)
        assert not caller.is_alive(), "the call hung"
        error, elapsed = outcome
        assert isinstance(error, DebounceBackendError), repr(error)
        assert "unreachable" in str(error) and "Timeout" in str(error), str(error)
        assert isinstance(elapsed, float) and 0.8 <= elapsed < 1.0 + 1.5, elapsed
        if server is not None:  # and once it answers again, calls go through
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGCONT)
            wait_until(lambda: _succeeds(lambda: task.delay("after")), 10)
    finally:
        if server is not None:
            if server.process is not None:
                os.kill(server.process.pid, signal.SIGCONT)
            server.cleanup()
        if listener is not None:
            listener.close()


def _succeeds(fn: Any) -> bool:
    try:
        fn()
    except DebounceBackendError:
        return False
    return True


# -- corrupt records ---------------------------------------------------------------


def corrupt(client: redis.Redis, app: Celery, key: str, **fields: Any) -> str:
    """Open a window for ``key`` and overwrite fields of its record."""
    tid = (
        app.tasks["faults.record"].apply_async((key,), debounce="300ms", debounce_max_wait="2s").id
    )
    (open_key,) = client.keys(f"debounce:{{0}}:open:*:k:{key}")
    client.hset(open_key, mapping=fields)
    return tid


def test_corrupt_records_are_quarantined_and_do_not_block_others(
    redis_server: str,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    app = build(redis_server)
    # The dispatcher never decodes a body of another content type than JSON: one the
    # worker cannot decode is published and refused by the worker (as Celery always
    # did), which finishes it as REJECTED.
    rejected = [corrupt(redis_client, app, "c1", ct="application/x-unknown")]
    # what each corruption is, and the reason the record must be quarantined with
    bad = {
        corrupt(redis_client, app, "c2", p=b"{not json"): (
            "c2",
            r"^ValueError: body is not JSON: ",
        ),  # payload is not JSON
        corrupt(redis_client, app, "c3", o=b"{broken"): (
            "c3",
            r"^JSONDecodeError: ",
        ),  # options are not JSON
        corrupt(redis_client, app, "c4", o=b"[1, 2]"): (
            "c4",
            r"^ValueError: options are not a JSON object$",
        ),  # options are not an object
        corrupt(redis_client, app, "c5", o=b'{"expires": "soon"}'): (
            "c5",
            r"^ValueError: could not convert string to float: 'soon'",
        ),  # bad option value
        corrupt(redis_client, app, "c6", o=b'{"headers": "x"}'): (
            "c6",
            r"^ValueError: dictionary update sequence",
        ),  # headers not a mapping
        corrupt(redis_client, app, "c7", o=b'{"expires_at": "not a time"}'): (
            "c7",
            r"^ValueError: invalid literal for int\(\)",
        ),  # bad time
    }
    good = [app.tasks["faults.record"].delay(f"g{i}") for i in range(3)]
    caplog.set_level(logging.ERROR, "celery_debounce.dispatcher")
    with running_worker(app):
        wait_until(lambda: all(runs(redis_client, f"g{i}") == [good[i].id] for i in range(3)), 15)
        quarantined = wait_until(
            lambda: (q := list_windows(app, states=["quarantined"])) and len(q) == len(bad) and q,
            15,
        )
        wait_until(
            lambda: all(
                redis_client.hget(f"debounce:{{0}}:win:{tid}", "rs") == b"REJECTED"
                for tid in rejected
            ),
            15,
        )
    assert {w.task_id for w in quarantined} == set(bad)
    for window in quarantined:
        key, reason = bad[window.task_id]
        assert window.key == f"k:{key}"
        assert re.search(reason, window.error or ""), (key, window.error)
        # the ERROR line the docs promise, with the same reason
        assert (
            f"debounce: quarantined faults.record[{window.task_id}] key={window.key!r}: "
            f"cannot publish its message: {window.error}"
        ) in caplog.text
    assert all(not runs(redis_client, f"c{i}") for i in range(1, 8))
    # operators see them in `celery debounce inspect --state quarantined`
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "fault_app",
            "debounce",
            "inspect",
            "--state",
            "quarantined",
        ],
        cwd=TESTS,
        env=env_for(redis_server),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert all(tid in shown.stdout for tid in bad)
    assert not list_windows(app, states=["pending", "dispatching", "queued", "claimed"])


@pytest.mark.parametrize(
    "ident",
    [
        "garbage",
        "99:short",  # a length prefix past the end of the ident
    ],
)
def test_a_malformed_ident_is_quarantined(
    redis_server: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture, ident: str
) -> None:
    """A taken record whose ident (field ``i``) is garbled: the dispatcher that takes it
    again after the lease quarantines it as unreadable; other windows run."""
    app = build(redis_server, lease=0.3)
    tid = app.tasks["faults.record"].delay("mi").id
    backend = Dispatcher(app).store

    wait_until(lambda: backend.take(0, 10).windows, 5)  # taken; the dispatcher "dies"
    redis_client.hset(f"debounce:{{0}}:win:{tid}", "i", ident)
    good = app.tasks["faults.record"].delay("fine")
    caplog.set_level(logging.ERROR, "celery_debounce.dispatcher")
    with running_worker(app):
        wait_until(lambda: runs(redis_client, "fine") == [good.id], 15)
        (window,) = wait_until(lambda: list_windows(app, states=["quarantined"]), 10)
    assert window.task_id == tid
    assert (window.error or "").startswith("unreadable record: ValueError"), window.error
    assert f"debounce: quarantined window {tid}: unreadable record" in caplog.text
    assert not runs(redis_client, "mi")


def test_a_message_the_worker_rejects_finishes_its_window(
    redis_server: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """task_rejected: a message the worker cannot read (here an unparsable ``expires``
    header) is rejected without running; its window is finished as REJECTED and kept
    for the history TTL, not left queued for the record TTL."""
    app = build(redis_server, debounce_history_ttl="30s")
    tid = app.tasks["faults.record"].apply_async(("rj",), headers={"expires": "not a time"}).id
    record = f"debounce:{{0}}:win:{tid}"
    caplog.set_level(logging.WARNING, "celery_debounce.worker")
    with running_worker(app):
        wait_until(lambda: redis_client.hget(record, "st") == b"finished", 15)
    assert redis_client.hget(record, "rs") == b"REJECTED"
    assert 0 < redis_client.pttl(record) <= 30_000
    assert f"faults.record[{tid}] was rejected by the worker (invalid message)" in caplog.text
    assert not runs(redis_client, "rj")
    assert not list_windows(app)


def test_an_ignored_run_finishes_its_window(redis_server: str, redis_client: redis.Redis) -> None:
    """A run that ends with ``raise Ignore()`` (state IGNORED) finishes its window."""
    app = build(redis_server, debounce_history_ttl="30s")
    tid = app.tasks["faults.ignored"].delay("ig").id
    record = f"debounce:{{0}}:win:{tid}"
    with running_worker(app):
        wait_until(lambda: redis_client.hget(record, "st") == b"finished", 15)
    assert runs(redis_client, "ig") == [tid]
    assert redis_client.hget(record, "rs") == b"IGNORED"
    assert 0 < redis_client.pttl(record) <= 30_000
    assert not list_windows(app)


def test_a_record_nobody_finishes_expires_after_the_record_ttl(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """Every taken record carries debounce_record_ttl: a window handed to the broker
    whose message is never run (lost) is queued until then, and then gone."""
    app = build(redis_server, debounce_record_ttl="5s", debounce_history_ttl="1h")
    tid = app.tasks["faults.record"].delay("ttl").id
    record = f"debounce:{{0}}:win:{tid}"
    dispatcher = Dispatcher(app, name="no-worker")
    wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)
    assert redis_client.hget(record, "st") == b"queued"
    assert 2_000 < redis_client.pttl(record) <= 5_000  # the record TTL, not the history's
    assert [(w.task_id, w.state) for w in list_windows(app)] == [(tid, "queued")]
    wait_until(lambda: not redis_client.exists(record), 15)
    assert not list_windows(app)


def test_a_record_nobody_finishes_leaves_no_key_after_the_record_ttl(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = build(
        redis_server,
        debounce_record_ttl="2s",
        debounce_dispatch_lease="0.5s",
        debounce_history_ttl="1s",
    )
    app.tasks["faults.record"].delay("ttl")
    dispatcher = Dispatcher(app, name="no-worker")
    wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)
    # past the record TTL and the stats hash's history TTL, and after dispatcher passes
    # (which prune ids whose record expired from the active set), nothing is left
    wait_until(lambda: dispatcher.dispatch_once() and not redis_client.keys("debounce:*"), 15)


def test_claim_and_finish_failures_leave_the_record_queued(
    redis_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The package's Redis is unreachable while the worker runs the window: claim and
    finish fail with a WARNING each, the run goes ahead, and the record stays queued
    (until debounce_record_ttl) once Redis is back."""
    windows = LocalRedis(appendonly=True).start()
    try:
        app = build(windows.url, broker_url=f"{redis_server}/1", debounce_dispatcher=False)
        tid = app.tasks["faults.ignored"].delay("cf").id  # its body needs no Redis either
        dispatcher = Dispatcher(app, name="before-the-outage")
        wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)
        windows.stop()  # SIGTERM: the AOF has the queued record
        caplog.set_level(logging.WARNING, "celery_debounce.worker")
        with running_worker(app):
            wait_until(lambda: f"could not mark faults.ignored[{tid}] finished" in caplog.text, 20)
        assert f"could not mark faults.ignored[{tid}] claimed" in caplog.text
        windows.start()
        client = redis.Redis.from_url(f"{windows.url}/0")
        record = f"debounce:{{0}}:win:{tid}"
        assert client.hget(record, "st") == b"queued"
        assert client.pttl(record) > 3600 * 1000  # the 7-day record TTL
        client.close()
    finally:
        windows.cleanup()


# -- skewed producer clocks --------------------------------------------------------


@pytest.mark.parametrize("skew", [-7200.0, 3600.0, 86400.0 * 365])
def test_producer_clock_skew_does_not_change_deadlines(
    redis_server: str,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
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
