"""Operator surface: `stats --reset` loses no increment; the maxmemory-policy check;
against a real redis-server."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner
from helpers import debounce_command, debounced, make_app, running_worker, wait_until
from reads import counters

from celery_debounce import DebounceAdmin
from celery_debounce.store.redis.server import maxmemory_policy

HERE = Path(__file__).parents[1]


def _cli(redis_server: str, *args: str) -> Any:
    os.environ["DEBOUNCE_TEST_REDIS_URL"] = redis_server
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return CliRunner().invoke(celery_cli, ["-A", "cli_app", "debounce", *args])


def _hammer(client: redis.Redis, stop: threading.Event, done: list[int]) -> None:
    """Bump a run counter as fast as take.lua would, counting every increment."""
    while not stop.is_set():
        client.hincrby("debounce:{0}:stats", "r|reports.build", 1)
        done[0] += 1


def test_stats_reset_loses_no_increment(redis_server: str, redis_client: redis.Redis) -> None:
    stop, done = threading.Event(), [0]
    thread = threading.Thread(
        target=_hammer, args=(redis.Redis.from_url(f"{redis_server}/0"), stop, done)
    )
    thread.start()
    printed = 0
    try:
        wait_until(lambda: done[0] > 100)
        for _ in range(10):
            out = _cli(redis_server, "stats", "--reset", "--json")
            assert out.exit_code == 0, out.output
            printed += json.loads(out.output)["total"]["runs"]
    finally:
        stop.set()
        thread.join(10)
    left = counters(make_app(redis_server)).get("r|reports.build", 0)
    assert printed + left == done[0]  # every increment printed once or still counted


def test_reset_stats_returns_what_it_zeroed(app: Celery, redis_client: redis.Redis) -> None:
    # Redis only: counters planted by hand
    redis_client.hset("debounce:{0}:stats", mapping={"r|a": 3, "c|a": 7, "x|b": 1})
    removed = DebounceAdmin(app).reset_stats()
    assert (removed["a"].runs, removed["a"].calls, removed["b"].cancelled) == (3, 7, 1)
    assert DebounceAdmin(app).reset_stats() == {}
    assert redis_client.keys("debounce:*") == []  # Redis only: the renamed copy is gone too


@pytest.fixture
def evicting(redis_client: redis.Redis) -> Any:
    # Redis only: an evicting server
    before = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    redis_client.config_set("maxmemory-policy", "allkeys-lru")
    yield
    redis_client.config_set("maxmemory-policy", before)


def test_an_evicting_redis_is_reported_by_workers_and_stats(
    app: Celery, redis_server: str, evicting: None, caplog: pytest.LogCaptureFixture
) -> None:
    @debounced(app, debounce="1s", debounce_max_wait="2s")
    def noop() -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="celery_debounce"), running_worker(app):
        wait_until(lambda: "maxmemory-policy allkeys-lru" in caplog.text)
    assert "noeviction" in caplog.text
    out = _cli(redis_server, "stats")
    assert out.exit_code == 0, out.output
    assert "maxmemory-policy: allkeys-lru  WARNING" in out.output
    data = json.loads(_cli(redis_server, "stats", "--json").output)
    assert (data["maxmemory_policy"], data["evicts_windows"]) == ("allkeys-lru", True)


def test_a_standalone_dispatcher_warns_about_an_evicting_redis(
    redis_server: str, evicting: None, tmp_path: Path
) -> None:
    env = {**os.environ, "DEBOUNCE_TEST_REDIS_URL": redis_server, "PYTHONPATH": str(HERE)}
    log = tmp_path / "dispatch.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "cli_app", "debounce", "dispatch"],
            env=env,
            cwd=HERE,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "maxmemory-policy allkeys-lru" in log.read_text(), timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    assert "WARNING" in log.read_text()


def test_a_refused_config_get_is_unknown_never_an_error(
    redis_server: str, redis_client: redis.Redis
) -> None:
    # Redis only: a user without CONFIG
    redis_client.execute_command(
        "ACL", "SETUSER", "nocfg", "reset", "on", ">pw", "~*", "&*", "+@all", "-config"
    )
    try:
        host_port = redis_server.split("://", 1)[1]
        client = redis.Redis.from_url(f"redis://nocfg:pw@{host_port}/0")
        assert maxmemory_policy(client) == "unknown"
        assert maxmemory_policy(redis.Redis.from_url(f"{redis_server}/0")) == "noeviction"
        # the real CLI in a fresh process, as that user
        env = {
            **os.environ,
            "DEBOUNCE_TEST_REDIS_URL": f"redis://nocfg:pw@{host_port}",
            "PYTHONPATH": str(HERE),
        }
        out = debounce_command("cli_app", env, "stats")
        assert out.returncode == 0, out.stderr
        assert "maxmemory-policy: unknown" in out.stdout
    finally:
        redis_client.execute_command("ACL", "DELUSER", "nocfg")
