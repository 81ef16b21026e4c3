"""The ``celery debounce`` commands, admin API, beat scheduler, standalone dispatcher,
signals and metrics, against a real redis-server and real workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from celery.exceptions import TaskRevokedError
from helpers import StoreCase, cli, debounced, running_worker, wait_until

from celery_debounce import signals
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.ops.admin import DebounceAdmin
from celery_debounce.store import store_for

pytestmark = pytest.mark.usefixtures("store")

TESTS = Path(__file__).parents[1]
JSON_FIELDS = {
    "task",
    "key",
    "task_id",
    "state",
    "first_seen",
    "deadline",
    "max_wait_at",
    "calls",
    "shard",
    "error",
    "forced_by_max_wait",
}


def celery_subprocess(redis_server: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    """The real ``celery`` entry point in a child process, tests/ on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(TESTS), "DEBOUNCE_OPS_REDIS": redis_server}
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ops_app", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def state_of(ops: ModuleType, task_id: str) -> str | None:
    info = DebounceAdmin(ops.app).find(task_id)
    return info.state if info else None


# -- inspect -------------------------------------------------------------------
def test_inspect_empty(ops: ModuleType) -> None:
    result = cli("inspect")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "No debounce windows."
    result = cli("inspect", "--json")
    assert result.exit_code == 0 and json.loads(result.output) == []


def test_inspect_filters_sort_and_json_shape(ops: ModuleType) -> None:
    for user, calls in (("u1", 3), ("u2", 1), ("admin", 2)):
        for i in range(calls):
            ops.report.delay(user, n=i)
    ops.sync.delay("orders")
    result = cli("inspect", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {r["key"] for r in rows} == {"user:u1", "user:u2", "user:admin", "orders"}
    assert all(set(r) >= JSON_FIELDS for r in rows)
    assert [r["deadline"] for r in rows] == sorted(r["deadline"] for r in rows)
    u1 = next(r for r in rows if r["key"] == "user:u1")
    assert u1["task"] == "ops.report" and u1["state"] == "pending" and u1["calls"] == 3
    assert u1["first_seen"] <= u1["deadline"] <= u1["max_wait_at"]
    assert u1["max_wait_at"] == pytest.approx(u1["first_seen"] + 7200, abs=0.01)
    assert u1["deadline"] == pytest.approx(time.time() + 3600, abs=60)

    by_task = json.loads(cli("inspect", "--task", "ops.sync", "--json").output)
    assert [r["key"] for r in by_task] == ["orders"]
    globbed = json.loads(cli("inspect", "--match", "user:u?", "--json").output)
    assert sorted(r["key"] for r in globbed) == ["user:u1", "user:u2"]
    sets = json.loads(
        cli("inspect", "--task", "ops.report", "--match", "user:[!u]*", "--json").output
    )
    assert [r["key"] for r in sets] == ["user:admin"]
    limited = json.loads(cli("inspect", "--limit", "2", "--json").output)
    assert [r["key"] for r in limited] == [r["key"] for r in rows[:2]]
    assert json.loads(cli("inspect", "--state", "queued", "--json").output) == []
    assert json.loads(cli("inspect", "--task", "ops.nothing", "--json").output) == []
    by_id = json.loads(cli("inspect", "--id", u1["task_id"], "--json").output)
    assert [r["key"] for r in by_id] == ["user:u1"]

    table = cli("inspect", "--task", "ops.report").output
    assert table.splitlines()[0].split()[:4] == ["TASK", "KEY", "TASK", "ID"]
    assert "user:u1" in table and re.search(r"in 59m\d\ds", table) and "orders" not in table


def test_inspect_limit_walks_past_other_tasks_in_deadline_order(ops: ModuleType) -> None:
    """--task with --limit must skip other tasks' windows without losing its own."""
    for i in range(1500):  # more than list.lua's first step of 1,000 members
        ops.sync.delay(f"s{i}")
    ops.report.delay("late")
    rows = DebounceAdmin(ops.app).windows(task="ops.report", limit=5)
    assert [w.key for w in rows] == ["user:late"]
    all_sync = DebounceAdmin(ops.app).windows(task="ops.sync", key_glob="s1??")
    assert len(all_sync) == 100


def test_bad_options_are_usage_errors(ops: ModuleType) -> None:
    assert cli("inspect", "--state", "nope").exit_code == 2
    assert cli("inspect", "--limit", "0").exit_code == 2
    for args in (
        ("flush",),
        ("flush", "--task", "ops.report"),
        ("flush", "--key", "k"),
        ("cancel", "--id", "x", "--all"),
        ("cancel", "--task", "t", "--key", "k", "--all"),
    ):
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert "Error:" in result.output


def test_unknown_window_exits_1_with_a_clear_message(ops: ModuleType) -> None:
    result = cli("flush", "--task", "ops.report", "--key", "user:nobody")
    assert result.exit_code == 1
    assert "no pending window for task 'ops.report' key 'user:nobody'" in result.output
    result = cli("cancel", "--id", "no-such-id")
    assert result.exit_code == 1 and "no window with task id 'no-such-id'" in result.output


def test_help_is_complete(ops: ModuleType) -> None:
    for command in ("inspect", "flush", "cancel", "stats", "dispatch"):
        result = cli(command, "--help")
        assert result.exit_code == 0
        for line in result.output.splitlines():
            if line.strip().startswith("--") and "--help" not in line:
                assert len(line.split(None, 2)) >= 2, (command, line)
    assert "Exit status" in cli("--help").output


# -- flush and cancel on a real worker ------------------------------------------
def test_flush_runs_a_pending_hour_long_window_now(ops: ModuleType) -> None:
    with running_worker(ops.app):
        first = ops.report.delay("u1", n=0)
        ops.report.delay("u1", n=1)
        other = ops.report.delay("u2")
        assert cli("inspect", "--task", "ops.report", "--key", "user:u1").exit_code == 0
        result = cli("flush", "--task", "ops.report", "--key", "user:u1")
        assert result.exit_code == 0, result.output
        assert f"Flushed ops.report[{first.id}] key='user:u1' calls=2." in result.output
        assert first.get(timeout=10) == "report u1"
        assert ops.runs == [("report", "u1")]
        assert state_of(ops, other.id) == "pending"
        # By id: the other window runs too; a second flush finds it taken.
        result = cli("flush", "--id", other.id)
        assert result.exit_code == 0, result.output
        assert other.get(timeout=10) == "report u2"
        again = cli("flush", "--id", other.id)
        assert again.exit_code == 1 and "already taken for dispatch" in again.output


def test_flush_closes_the_window_and_the_next_call_opens_a_new_one(ops: ModuleType) -> None:
    """With a worker's dispatcher up, a call right after flush must not join the flushed
    window (and push its deadline an hour out): it opens a new one."""
    admin = DebounceAdmin(ops.app)
    with running_worker(ops.app):
        for i in range(5):
            first = ops.report.delay(f"f{i}")
            info = admin.flush("ops.report", f"user:f{i}")
            assert info.task_id == first.id and info.deadline <= time.time() + 1
            second = ops.report.delay(f"f{i}")
            assert second.id != first.id
            assert first.get(timeout=10) == f"report f{i}"
            assert state_of(ops, second.id) == "pending"
    assert sorted(ops.runs) == [("report", f"f{i}") for i in range(5)]


def test_flush_all_of_a_task_and_everything(ops: ModuleType) -> None:
    results = [ops.report.delay(f"u{i}") for i in range(3)]
    kept = ops.sync.delay("x")
    result = cli("flush", "--task", "ops.report", "--all")
    assert result.exit_code == 0 and "Flushed 3 window(s) of ops.report." in result.output
    published, _ = Dispatcher(ops.app).dispatch_once()
    assert published == 3
    assert {state_of(ops, r.id) for r in results} == {"queued"}
    assert state_of(ops, kept.id) == "pending"
    assert "Flushed 1 window(s)." in cli("flush", "--all").output


def test_cancel_never_runs_and_get_raises_revoked(ops: ModuleType) -> None:
    with running_worker(ops.app):
        doomed = ops.report.delay("u1")
        assert ops.report.delay("u1").id == doomed.id
        survivor = ops.report.delay("u2")
        result = cli("cancel", "--task", "ops.report", "--key", "user:u1")
        assert result.exit_code == 0, result.output
        assert "result marked revoked" in result.output
        with pytest.raises(TaskRevokedError):
            doomed.get(timeout=10)
        assert state_of(ops, doomed.id) is None
        # The key is free again: the next call opens a new window.
        fresh = ops.report.delay("u1")
        assert fresh.id != doomed.id
        cli("flush", "--all")
        assert fresh.get(timeout=10) == "report u1"
        assert survivor.get(timeout=10) == "report u2"
    assert sorted(ops.runs) == [("report", "u1"), ("report", "u2")]  # the fresh one only


def test_cancel_by_id_and_all(ops: ModuleType) -> None:
    a = ops.sync.delay("a")
    b = ops.sync.delay("b")
    r = ops.report.delay("u1")
    result = cli("cancel", "--id", a.id)
    assert result.exit_code == 0 and "ops.sync" in result.output
    assert a.state == "REVOKED"
    aborted = cli("cancel", "--all", input="n\n")
    assert aborted.exit_code == 1 and "Aborted" in aborted.output
    assert state_of(ops, b.id) == "pending"
    result = cli("cancel", "--all", "--task", "ops.sync", "--force")
    assert result.exit_code == 0 and "Cancelled 1 window(s) of ops.sync." in result.output
    assert b.state == "REVOKED" and state_of(ops, r.id) == "pending"
    assert "Cancelled 0 window(s)" in cli("cancel", "--all", "-f", "--task", "ops.sync").output


def test_cancel_of_a_dispatched_window_exits_1(ops: ModuleType) -> None:
    result = ops.sync.delay("x")
    DebounceAdmin(ops.app).flush("ops.sync", "x")
    Dispatcher(ops.app).dispatch_once()
    out = cli("cancel", "--id", result.id)
    assert out.exit_code == 1 and "is queued" in out.output
    assert f"control revoke {result.id}" in out.output


# -- stats -----------------------------------------------------------------------
def test_stats_figures(ops: ModuleType) -> None:
    empty = cli("stats")
    assert empty.exit_code == 0 and "open windows: 0   due now: 0" in empty.output
    for _ in range(4):
        ops.quick.delay("a")  # 4 calls, one window
    ops.quick.delay("b")
    ops.tick.delay("t")  # window == max wait: forced
    ops.report.delay("u1")
    ops.report.delay("u1")
    ops.sync.delay("gone")
    DebounceAdmin(ops.app).cancel("ops.sync", "gone")
    wait_until(lambda: DebounceAdmin(ops.app).stats().due == 3, timeout=5)
    assert Dispatcher(ops.app).dispatch_once()[0] == 3
    data = json.loads(cli("stats", "--json").output)
    tasks = {t["task"]: t for t in data["tasks"]}
    assert data["open"] == 1 and data["due"] == 0
    assert tasks["ops.quick"]["runs"] == 2 and tasks["ops.quick"]["calls"] == 5
    assert tasks["ops.quick"]["coalescing_ratio"] == 2.5
    assert tasks["ops.quick"]["forced_by_max_wait"] == 0
    assert tasks["ops.tick"]["forced_by_max_wait"] == 1
    assert tasks["ops.report"]["open"] == 1 and tasks["ops.report"]["calls_waiting"] == 2
    assert tasks["ops.report"]["oldest_first_seen"] == pytest.approx(time.time(), abs=30)
    assert tasks["ops.sync"]["cancelled"] == 1
    assert sum(tasks["ops.quick"]["lateness_buckets"].values()) == 2
    assert tasks["ops.quick"]["lateness_ms"]["p50"] is not None
    assert data["total"]["runs"] == 3 and data["total"]["calls"] == 6
    table = cli("stats").output
    assert "ops.quick" in table and "2.5" in table and "(all)" in table
    quick = cli("stats", "--quick", "--reset")
    assert quick.exit_code == 0 and "skipped" in quick.output
    after = json.loads(cli("stats", "--json").output)
    assert after["total"]["runs"] == 0 and after["open"] == 1


# -- dispatchers -----------------------------------------------------------------
def test_standalone_dispatch_process_publishes_and_stops_on_sigterm(
    ops: ModuleType, redis_server: str
) -> None:
    proc = celery_subprocess(redis_server, "debounce", "dispatch", "-l", "info")
    try:
        result = ops.quick.delay("standalone")
        wait_until(lambda: state_of(ops, result.id) == "queued", timeout=20)
        err = _stop_with(proc, signal.SIGTERM)
    finally:
        _reap(proc)
    assert proc.returncode == 0, err
    assert "dispatched ops.quick" in err and "SIGTERM received, stopping" in err
    assert "stopped" in err.splitlines()[-1]


def test_standalone_dispatch_stops_on_sigint(
    ops: ModuleType, redis_server: str, store: StoreCase
) -> None:
    proc = celery_subprocess(redis_server, "debounce", "dispatch")
    try:
        wait_until(lambda: proc.poll() is not None or _running(ops, store), timeout=20)
        err = _stop_with(proc, signal.SIGINT)
    finally:
        _reap(proc)
    assert proc.returncode == 0, err
    assert "SIGINT received" in err


def _stop_with(proc: subprocess.Popen[str], sig: signal.Signals) -> str:
    """Send ``sig`` and wait for a clean exit; returns what the process wrote to stderr."""
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=15)
    return str(err)


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _running(ops: ModuleType, store: StoreCase) -> bool:
    """The standalone dispatcher runs: on Redis it listens on the wake channel; on
    PostgreSQL (no such channel to count) its heartbeat is in the store."""
    if store.name == "redis":  # Redis only: the wake channel's subscribers
        client = DebounceAdmin(ops.app).store.client
        return int(dict(client.pubsub_numsub("debounce:wake"))[b"debounce:wake"]) > 0
    return bool(store_for(ops.app).liveness()[1])


def test_beat_scheduler_tick_dispatches_and_wakes_at_the_next_deadline(
    ops: ModuleType, tmp_path: Path
) -> None:
    from celery_debounce.dispatch.beat import DebounceScheduler

    scheduler = DebounceScheduler(app=ops.app, schedule_filename=str(tmp_path / "sched"))
    try:
        due = ops.sync.delay("now")
        DebounceAdmin(ops.app).flush("ops.sync", "now")
        interval = scheduler.tick()
        assert state_of(ops, due.id) == "queued"
        assert 0 < interval <= 0.2  # capped by debounce_poll_interval (beat cannot be woken)
    finally:
        scheduler.close()


def test_beat_scheduler_interval_follows_the_next_deadline(
    app_factory: Any, tmp_path: Path
) -> None:
    from celery_debounce.dispatch.beat import DebounceScheduler

    app = app_factory(debounce_poll_interval=600, beat_max_loop_interval=300)

    @debounced(app, debounce="30s", debounce_max_wait="1m")
    def later() -> None:
        pass

    later.delay()
    scheduler = DebounceScheduler(app=app, schedule_filename=str(tmp_path / "sched"))
    try:
        assert 20 < scheduler.tick() <= 30
    finally:
        scheduler.close()


def test_celery_beat_with_the_debounce_scheduler_dispatches(
    ops: ModuleType, redis_server: str, tmp_path: Path
) -> None:
    """``celery beat -S debounce`` (the entry point alias) publishes a due window."""
    proc = celery_subprocess(
        redis_server,
        "beat",
        "-S",
        "debounce",
        "-s",
        str(tmp_path / "schedule"),
        "-l",
        "info",
        cwd=tmp_path,
    )
    try:
        result = ops.quick.delay("beat")
        wait_until(lambda: state_of(ops, result.id) == "queued", timeout=30)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "dispatched ops.quick" in err


def test_any_mix_of_dispatchers_publishes_each_window_once(ops: ModuleType) -> None:
    ids = {ops.sync.delay(f"k{i}").id for i in range(200)}
    DebounceAdmin(ops.app).flush_all()
    published: list[str] = []

    def record(sender: str, task_id: str, **_: Any) -> None:
        published.append(task_id)

    signals.window_dispatched.connect(record, weak=False)
    try:
        import threading

        dispatchers = [Dispatcher(ops.app, name=f"d{i}") for i in range(3)]
        threads = [threading.Thread(target=d.dispatch_once) for d in dispatchers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        signals.window_dispatched.disconnect(record)
    assert sorted(published) == sorted(ids)


# -- signals and metrics ----------------------------------------------------------
def test_signals_fire_with_task_key_and_lateness(ops: ModuleType) -> None:
    seen: list[tuple[str, str, dict[str, Any]]] = []

    def receiver(name: str) -> Any:
        def on(sender: str, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            seen.append((name, sender, kwargs))

        return on

    pairs = [(getattr(signals, n), receiver(n)) for n in signals.__all__]
    for sig, rec in pairs:
        sig.connect(rec, weak=False)
    try:
        opener = ops.tick.delay("s")
        ops.tick.delay("s")
        ops.sync.delay("c")
        DebounceAdmin(ops.app).cancel("ops.sync", "c")
        wait_until(lambda: DebounceAdmin(ops.app).stats(census=False).due == 1, timeout=5)
        Dispatcher(ops.app).dispatch_once()
    finally:
        for sig, rec in pairs:
            sig.disconnect(rec)
    names = [(name, sender) for name, sender, _ in seen]
    assert names == [
        ("window_opened", "ops.tick"),
        ("call_absorbed", "ops.tick"),
        ("window_opened", "ops.sync"),
        ("window_cancelled", "ops.sync"),
        ("window_dispatched", "ops.tick"),
        ("window_forced_by_max_wait", "ops.tick"),
    ]
    opened, absorbed = seen[0][2], seen[1][2]
    assert opened["task_id"] == opener.id and opened["key"] == "s" and opened["calls"] == 1
    assert absorbed["calls"] == 2
    dispatched = seen[4][2]
    assert dispatched["calls"] == 2 and 0 <= dispatched["lateness"] < 30
    assert seen[5][2]["max_wait_at"] == pytest.approx(opened["deadline"], abs=0.001)


def test_prometheus_metrics_count_the_events(ops: ModuleType) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from celery_debounce.ops import metrics

    registry = prometheus_client.CollectorRegistry()
    enabled = metrics.enable(registry)
    try:
        for _ in range(3):
            ops.tick.delay("m")
        wait_until(lambda: DebounceAdmin(ops.app).stats(census=False).due == 1, timeout=5)
        Dispatcher(ops.app).dispatch_once()
    finally:
        enabled.disable()

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, {"task": "ops.tick"})

    assert value("celery_debounce_windows_opened_total") == 1
    assert value("celery_debounce_calls_absorbed_total") == 2
    assert value("celery_debounce_windows_dispatched_total") == 1
    assert value("celery_debounce_windows_forced_by_max_wait_total") == 1
    assert value("celery_debounce_dispatched_calls_total") == 3
    assert value("celery_debounce_dispatch_lateness_seconds_count") == 1
