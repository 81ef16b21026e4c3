"""`celery -A app debounce inspect` through the real celery entry point."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import redis
from helpers import debounce_command, debounced

HERE = Path(__file__).parents[1]


def celery(redis_server: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DEBOUNCE_TEST_REDIS_URL": redis_server,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    return debounce_command("cli_app", env, *args)


def test_inspect_empty(redis_server: str, redis_client: redis.Redis) -> None:
    out = celery(redis_server, "inspect")
    assert out.returncode == 0, out.stderr
    assert "No debounce windows" in out.stdout
    out = celery(redis_server, "inspect", "--json")
    assert json.loads(out.stdout) == []


def test_inspect_table_and_json(redis_server: str, redis_client: redis.Redis) -> None:
    os.environ["DEBOUNCE_TEST_REDIS_URL"] = redis_server
    sys.path.insert(0, str(HERE))
    import cli_app

    first = cli_app.build.delay("u1")
    for _ in range(4):
        cli_app.build.delay("u1")
    other = cli_app.build.delay("u2")

    table = celery(redis_server, "inspect")
    assert table.returncode == 0, table.stderr
    assert "report:u1" in table.stdout and first.id in table.stdout
    assert re.search(r"in (59m\d\ds|1h00m)", table.stdout)

    rows = json.loads(celery(redis_server, "inspect", "--json").stdout)
    assert {r["task_id"] for r in rows} == {first.id, other.id}
    row = next(r for r in rows if r["task_id"] == first.id)
    assert row["task"] == "reports.build"
    assert row["key"] == "report:u1"
    assert row["state"] == "pending"
    assert row["calls"] == 5
    assert isinstance(row["first_seen"], float)
    assert row["deadline"] - row["first_seen"] > 3590  # a 1 h window, slid by each call
    assert row["max_wait_at"] - row["first_seen"] == 7200

    limited = json.loads(celery(redis_server, "inspect", "--json", "--limit", "1").stdout)
    assert [r["task_id"] for r in limited] == [first.id]  # earliest deadline first
    filtered = json.loads(celery(redis_server, "inspect", "--json", "--match", "*u2").stdout)
    assert [r["task_id"] for r in filtered] == [other.id]


def test_control_characters_in_keys_cannot_forge_rows(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """A newline in a key must not add a fake row, nor an ANSI escape reach the terminal."""
    os.environ["DEBOUNCE_TEST_REDIS_URL"] = redis_server
    sys.path.insert(0, str(HERE))
    import cli_app

    forged = "x\nreports.build  report:admin  FAKE-ID  pending  99"
    real = cli_app.build.delay(forged)
    cli_app.build.delay("\x1b[2Jcleared\u2028sep")
    table = celery(redis_server, "inspect")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) == 3  # the header and one line per window
    assert not any(line.startswith("reports.build  report:admin") for line in lines)
    row = next(line for line in lines if real.id in line)
    assert "report:x\\nreports.build" in row  # escaped, on its own row
    assert "\x1b" not in table.stdout and "\u2028" not in table.stdout
    assert "report:\\x1b[2Jcleared\\u2028sep" in table.stdout
    # --json keeps the exact key
    rows = json.loads(celery(redis_server, "inspect", "--json").stdout)
    assert {r["key"] for r in rows} == {f"report:{forged}", "report:\x1b[2Jcleared\u2028sep"}


def test_listing_never_skips_a_window_when_one_at_the_same_deadline_leaves(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """flush --all gives many windows one deadline; one of those already listed is taken
    between two steps of the walk: every window is still listed, none twice."""
    from helpers import make_app

    from celery_debounce import enqueue_many
    from celery_debounce.ops.read_view import walk_pending
    from celery_debounce.store import store_for

    app = make_app(redis_server)

    @debounced(app, debounce="1h", debounce_max_wait="2h", debounce_key="{0}")
    def job(key: str) -> None:
        pass

    enqueue_many(job, [((f"k{i:04d}",), {}) for i in range(2500)])
    due = "debounce:{0}:due"  # Redis only: deadlines set and windows dropped by hand
    members = redis_client.zrange(due, 0, -1)
    redis_client.zadd(due, dict.fromkeys(members, 1_700_000_000_000))  # one deadline
    walk = walk_pending(store_for(app), 0)
    seen = [next(walk).task_id for _ in range(1000)]  # the first step examined 1,000
    # two listed ones leave (a dispatcher took them): one in the middle of the step and
    # the last one examined, where the next step resumes
    # Redis only: two windows leave by hand
    members = redis_client.zrange(due, 0, -1)
    redis_client.zrem(due, members[10], members[999])
    seen += [w.task_id for w in walk]
    assert len(seen) == len(set(seen)) == 2500
