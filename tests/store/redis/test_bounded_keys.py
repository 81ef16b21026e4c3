"""Every structure the package writes is bounded in time: runs killed without
``acks_late`` by a real prefork worker leave nothing behind once their records
expire (the ids they left in ``active`` are pruned by the dispatcher)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis
from helpers import package_keys, stop_process, wait_until

from celery_debounce.ops.admin import DebounceAdmin

TESTS = Path(__file__).parents[2]


def test_runs_killed_without_acks_late_leave_no_key_after_the_record_ttl(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "KILLED_REDIS": redis_server}
    sys.path.insert(0, str(TESTS))
    os.environ["KILLED_REDIS"] = redis_server
    try:
        import killed_app
    finally:
        sys.path.remove(str(TESTS))
    log = tmp_path / "worker.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "killed_app",
                "worker",
                "--pool",
                "prefork",
                "-c",
                "1",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=TESTS,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: b"ready." in log.read_bytes() or proc.poll() is not None, 30)
        assert proc.poll() is None, log.read_text()
        admin = DebounceAdmin(killed_app.app)
        task_id = killed_app.die.delay("u1").id
        # the run starts (claimed) and is killed; the worker's main process finishes the
        # window (FAILURE, WorkerLostError), or if it cannot the record stays claimed
        # until its TTL: either way the keys go and the dispatcher prunes its id
        wait_until(
            lambda: (w := admin.find(task_id)) is not None and w.state in ("claimed", "finished"),
            30,
        )
        wait_until(lambda: b"WorkerLostError" in log.read_bytes(), 30)
        wait_until(lambda: package_keys(redis_client) == [], 20)
        assert admin.find(task_id) is None
    finally:
        stop_process(proc)
