"""A real ``celery worker`` subprocess (prefork) with the embedded dispatcher."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def celery_worker(
    url: str, concurrency: int = 1, pool: str = "prefork", switch: float = 0.0, **conf: str
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a worker on ``bench.apps`` and wait until its dispatcher published a probe window."""
    env = dict(os.environ, BENCH_REDIS_URL=url, PYTHONPATH=str(ROOT))
    if switch:
        env["BENCH_SWITCH"] = str(switch)
    for name, value in conf.items():
        env[f"BENCH_CONF_{name.upper()}"] = value
    log = tempfile.NamedTemporaryFile(prefix="bench-worker-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.apps",
            "worker",
            "--pool",
            pool,
            "-c",
            str(concurrency),
            "-l",
            "warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        env=env,
        cwd=str(ROOT),
        stdout=log,
        stderr=log,
    )
    try:
        _wait_ready(url, proc, log.name)
        yield proc
    finally:
        _stop(proc)
        log.close()
        if not os.environ.get("BENCH_KEEP_LOGS"):
            os.unlink(log.name)


@contextmanager
def dispatcher_process(url: str) -> Iterator[subprocess.Popen[bytes]]:
    """``celery debounce dispatch`` in its own process (start it before the worker)."""
    env = dict(os.environ, BENCH_REDIS_URL=url, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "bench.apps:app", "debounce", "dispatch"],
        env=env,
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: str, timeout: float = 120.0) -> None:
    from bench.apps import make_app

    app = make_app(url)
    probe = app.tasks["bench.debounced"].apply_async(
        (f"probe-{time.time_ns()}",), debounce="1ms", debounce_max_wait="1ms"
    )
    key = f"debounce:{{0}}:win:{probe.id}"
    windows = redis.Redis.from_url(f"{url}/0")
    deadline = time.monotonic() + timeout
    seen = False
    while True:
        state = windows.hget(key, "st")
        if state in (b"claimed", b"finished") or (seen and state is None):
            return  # ran (and maybe its short history already expired)
        seen = seen or state is not None
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited: {Path(log).read_text()[-2000:]}")
        if time.monotonic() > deadline:
            tail = Path(log).read_text()[-2000:]
            raise TimeoutError(f"worker did not run the probe window: {tail}")
        time.sleep(0.02)
