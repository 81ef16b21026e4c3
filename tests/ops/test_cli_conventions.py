"""CLI conventions (issue 22, item 4): ``-j`` on every verb, exact ``--key`` and glob
``--match``, daemon flags and ``ping`` for ``dispatch``, tables aligned by terminal
cells, the ``-A`` hint, the worker's dispatcher log lines."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner
from helpers import cli, running_worker, wait_until

from celery_debounce.ops.cli import render_table
from celery_debounce.ops.formatting import cell_width, clip, table_lines
from celery_debounce.ops.read_view import WindowInfo

TESTS = Path(__file__).parents[1]


def test_every_verb_takes_dash_j(ops: ModuleType) -> None:
    first = ops.report.delay("u1")
    ops.report.delay("u2")
    ops.sync.delay("s1")
    ops.sync.delay("s2")
    rows = json.loads(cli("inspect", "-j").output)
    assert {r["task_id"] for r in rows} >= {first.id}
    stats = json.loads(cli("stats", "-j").output)
    assert stats["open"] == 4 and stats["total"]["calls_in"] == 4  # counted by the gate
    assert "CALLS IN" in cli("stats").output
    flushed = cli("flush", "-j", "--task", "ops.report", "--key", "user:u1")
    assert flushed.exit_code == 0, flushed.output
    one = json.loads(flushed.output)
    assert one["flushed"] == 1 and one["task_id"] == first.id and one["key"] == "user:u1"
    assert one["calls"] == 1
    everything = json.loads(cli("flush", "-j", "--all", "--task", "ops.report").output)
    assert everything == {"flushed": 1, "task": "ops.report"}
    cancelled = json.loads(cli("cancel", "-j", "--task", "ops.sync", "--key", "s1").output)
    assert cancelled["cancelled"] == 1 and cancelled["key"] == "s1"
    rest = json.loads(cli("cancel", "--json", "--all", "-f").output)
    assert rest == {"cancelled": 1, "task": None}
    assert json.loads(cli("ping", "-j").output)["ok"] is False


def test_key_is_exact_everywhere_and_match_is_the_glob(ops: ModuleType) -> None:
    a = ops.report.delay("u1")
    ops.report.delay("u10")
    exact = json.loads(cli("inspect", "-j", "--key", "user:u1").output)
    assert [r["task_id"] for r in exact] == [a.id]
    globbed = json.loads(cli("inspect", "-j", "--match", "user:u1*").output)
    assert len(globbed) == 2
    old = CliRunner().invoke(
        celery_cli, ["-A", "ops_app", "debounce", "inspect", "-j", "--key", "user:u1*"]
    )
    assert old.exit_code == 0
    assert "deprecated" in old.stderr and "--match" in old.stderr
    assert len(json.loads(old.stdout)) == 2  # the old meaning still works
    both = cli("inspect", "--key", "a", "--match", "b*")
    assert both.exit_code == 2 and "cannot be combined" in both.output
    help_text = cli("flush", "--help").output
    assert "exact key" in help_text and "no glob" in help_text


def test_stats_quick_json_says_null_for_what_it_did_not_count(ops: ModuleType) -> None:
    ops.report.delay("u1")
    data = json.loads(cli("stats", "--quick", "-j").output)
    assert data["census"] is False and data["open"] == 1
    assert data["total"]["open"] == 1  # exact without the scan
    assert data["total"]["calls_waiting"] is None and data["total"]["oldest_first_seen"] is None
    full = json.loads(cli("stats", "-j").output)
    assert full["total"]["calls_waiting"] == 1


def test_wide_characters_keep_the_columns_aligned() -> None:
    assert cell_width("報告") == 4 and cell_width("e\u0301") == 1 and cell_width("🎉") == 2
    assert cell_width(clip("報" * 30, 10)) <= 10
    lines = table_lines(("A", "B"), [("報告", "x"), ("ab", "y"), ("🎉🎉🎉", "z")])
    # every B value starts in the same terminal cell
    assert len({cell_width(line[: line.rindex(" ") + 1]) for line in lines}) == 1, lines
    now = time.time()
    infos = [
        WindowInfo(
            task="t",
            key=key,
            task_id="id",
            state="pending",
            calls=1,
            first_seen=now,
            deadline=now + 10,
            max_wait_at=now + 20,
            shard=0,
        )
        for key in ("報告:42", "plain:42", "🎉:1")
    ]
    table = render_table(infos, now).splitlines()
    starts = {cell_width(line[: line.index("id ")]) for line in table[1:]}
    assert len(starts) == 1, table


def test_no_app_gets_a_hint_about_dash_a(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    out = subprocess.run(
        [sys.executable, "-m", "celery", "debounce", "inspect"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 1
    assert "not a Redis URL" in out.stderr and "-A/--app" in out.stderr


def _celery(redis_server: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "DEBOUNCE_OPS_REDIS": redis_server,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ops_app", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=TESTS,
        **kwargs,
    )  # type: ignore[call-overload]


def test_dispatch_detaches_with_pidfile_and_logfile_and_answers_ping(
    ops: ModuleType, redis_server: str, tmp_path: Path
) -> None:
    pidfile, logfile = tmp_path / "d.pid", tmp_path / "d.log"
    proc = _celery(
        redis_server,
        "debounce",
        "dispatch",
        "--detach",
        "-n",
        "bg-1",
        "--pidfile",
        str(pidfile),
        "--logfile",
        str(logfile),
    )
    proc.communicate(timeout=30)
    assert proc.returncode == 0
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), timeout=20)
    pid = int(pidfile.read_text())
    try:
        wait_until(lambda: json.loads(cli("ping", "-j").output)["ok"], timeout=20)
        answer = cli("ping", "-n", "bg-1")
        assert answer.exit_code == 0 and "bg-1: ALIVE" in answer.output
        assert cli("ping", "-n", "bg-1", "-n", "nobody").exit_code == 1
        result = ops.quick.delay("bg")
        wait_until(lambda: "dispatched ops.quick" in logfile.read_text(), timeout=20)
        assert result.id
        # a second one on the same pidfile refuses to start
        again = _celery(redis_server, "debounce", "dispatch", "--pidfile", str(pidfile))
        _, err = again.communicate(timeout=30)
        assert again.returncode != 0 and "pidfile" in err.lower()
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not pidfile.exists(), timeout=20)
    data = json.loads(cli("ping", "-j").output)
    assert [(r["name"], r["status"]) for r in data["dispatchers"]] == [("bg-1", "stopped")]
    stopped = cli("ping")
    assert stopped.exit_code == 1 and "bg-1: STOPPED" in stopped.output
    assert "started" in logfile.read_text() and "stopped" in logfile.read_text()


def test_the_worker_logs_when_its_dispatcher_starts_and_stops(
    ops: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="celery_debounce.worker")
    with running_worker(ops.app):
        wait_until(
            lambda: any(
                "embedded dispatcher" in r.getMessage() and "started" in r.getMessage()
                for r in caplog.records
            ),
            timeout=20,
        )
    messages = [r.getMessage() for r in caplog.records]
    assert any("embedded dispatcher" in m and "stopped" in m for m in messages), messages


def test_top_takes_dash_j_too(ops: ModuleType) -> None:
    ops.report.delay("u1")
    out = cli("top", "-j", "-n", "2", "-i", "0.3")
    assert out.exit_code == 0, out.output
    first, second = (json.loads(line) for line in out.output.splitlines())
    assert first["open"] == 1 and first["calls_in_per_s"] is None  # rates need two readings
    assert second["calls_in_per_s"] == 0.0
    (task,) = second["tasks"]
    assert task["task"] == "ops.report" and task["open"] == 1 and task["calls_in_total"] == 1


def test_the_dash_a_hint_is_only_for_celerys_default_app() -> None:
    from celery import Celery

    from celery_debounce.errors import DebounceConfigError
    from celery_debounce.ops.cli import config_error

    exc = DebounceConfigError(
        "debounce_redis_url is not set and the broker URL ('amqp://') "
        "is not a Redis URL: set app.conf.debounce_redis_url"
    )
    named = Celery("proj", broker="amqp://", set_as_current=False)
    assert "-A" not in config_error(exc, named).message  # its app was named: no hint
    assert "-A/--app" in config_error(exc, Celery("default", set_as_current=False)).message


def test_stats_shows_lateness_as_the_bucket_bound_that_holds_it_not_as_a_figure() -> None:
    """Runs 6.4 to 7.0 s late fall in the (5000, 10000] bucket: ``stats`` shows
    ``<=10000``, never a bare ``10000`` that reads as what they measured; past the last
    bound, ``>30000``."""
    from celery_debounce.ops.admin import LATE_BUCKETS_MS, Stats, TaskStats
    from celery_debounce.ops.cli_common import render_stats

    buckets = [0] * (len(LATE_BUCKETS_MS) + 1)
    buckets[LATE_BUCKETS_MS.index(5)] = 8  # (1, 5]
    buckets[LATE_BUCKETS_MS.index(10000)] = 1  # (5000, 10000]
    buckets[-1] = 1  # over 30 s
    row = TaskStats(task="t.late", runs=10, calls=10, lateness_buckets=buckets)
    shown = render_stats(Stats(now=0.0, open=0, due=0, census=True, tasks={"t.late": row}))
    line = next(line for line in shown.splitlines() if line.startswith("t.late"))
    assert line.split()[-1] == "<=5/<=10000/>30000"
