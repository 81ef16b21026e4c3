"""A gevent worker (``celery worker -P gevent``), which the docs name for claim renewal:
runs happen, their claims are renewed past the lease while a run waits on I/O, and
``debounce_dispatcher_process`` falls back to a thread there (no fork under gevent)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from fault_app import build
from helpers import wait_until
from test_faults import runs, worker_process

pytest.importorskip("gevent", reason="the test extra installs gevent")  # declared: CI has it


def test_a_gevent_worker_runs_windows_and_renews_a_long_runs_claim(
        redis_server: str, redis_client: redis.Redis, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    app = build(redis_server)
    redis_client.set("block:g", 1)  # the run waits (gevent-patched sleeps) until we delete it
    with worker_process(redis_server, log, pool="gevent",
                        extra_env={"FAULT_DISPATCHER_PROCESS": "1"}):
        calls = [app.tasks["faults.record"].delay("g") for _ in range(3)]
        assert len({c.id for c in calls}) == 1
        wait_until(lambda: runs(redis_client, "g") == [calls[0].id], 15)
        key = f"debounce:{{0}}:win:{calls[0].id}"
        began = time.monotonic()
        while time.monotonic() - began < 3 * 2.0:  # three claim leases (2 s in fault_app)
            assert redis_client.hget(key, "st") == b"claimed", \
                "the claim went stale while its run was alive"
            time.sleep(0.25)
        redis_client.delete("block:g")
        wait_until(lambda: redis_client.hget(key, "st") == b"finished", 15)
        other = app.tasks["faults.record"].delay("h")
        wait_until(lambda: runs(redis_client, "h") == [other.id], 15)
    assert runs(redis_client, "g") == [calls[0].id]  # once
    text = log.read_text()
    assert "ignored under a gevent or eventlet pool" in text, text
