"""Prometheus multiprocess mode: calls made in prefork children and in pre-forked
producers (gunicorn's model) are counted.

A prefork worker's tasks run in pool children; a `.delay()` there counts in the
child's memory, which the main process's /metrics never shows. With
``PROMETHEUS_MULTIPROC_DIR`` set before prometheus_client is imported, every
process writes its values to that directory and :func:`metrics.serve` (through
:func:`metrics.exposition_registry`) sums them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis
from helpers import stop_process, wait_until
from prometheus_client.parser import text_string_to_metric_families

from celery_debounce.testing.servers import free_port

CELERY = str(Path(sys.executable).with_name("celery"))

APP = '''
import os

from celery import Celery
from celery.signals import worker_init

from celery_debounce import DebouncedTask
from celery_debounce.ops import metrics

URL = os.environ["MPAPP_REDIS"]
app = Celery("mpapp", broker=f"{URL}/1", backend=f"{URL}/2")
app.conf.update(debounce_redis_url=f"{URL}/0", debounce_poll_interval=0.2,
                worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)


@app.task(base=DebouncedTask, debounce="200ms", debounce_max_wait="1s", debounce_key="k:{0}")
def inner(key):
    return key


@app.task
def outer(key):
    """A plain task that calls a debounced one: runs in a prefork child."""
    inner.delay(key)
    return os.getpid()


@worker_init.connect
def expose(sender, **_):
    metrics.enable()  # before the pool forks: the children inherit the receivers
    serving = os.environ.get("MPAPP_SERVING_NODE")  # celery multi: one node serves the host
    if serving is None or sender.hostname.startswith(serving + "@"):
        metrics.serve(int(os.environ["MPAPP_METRICS_PORT"]), addr="127.0.0.1")


def preforked_producers(children, calls):
    """gunicorn's model: the master imports the app and enables the metrics, then forks
    workers that serve requests (here: make calls); the master serves /metrics."""
    metrics.enable()
    metrics.serve(int(os.environ["MPAPP_METRICS_PORT"]), addr="127.0.0.1")
    pids = []
    for c in range(children):
        pid = os.fork()
        if pid == 0:
            for i in range(calls):
                inner.delay(f"p{c}-{i}")
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    print("done", flush=True)
    import time
    time.sleep(60)
'''


def counted(port: int, name: str, **labels: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return -1.0
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _env(tmp_path: Path, redis_server: str, port: int, multiproc: Path | None) -> dict[str, str]:
    (tmp_path / "mpapp.py").write_text(APP)
    env = {
        **os.environ,
        "MPAPP_REDIS": redis_server,
        "MPAPP_METRICS_PORT": str(port),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("prometheus_multiproc_dir", None)
    if multiproc is not None:
        multiproc.mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(multiproc)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("multiprocess", [True, False], ids=["multiproc-dir", "no-dir"])
def test_a_delay_inside_a_task_on_a_prefork_worker_is_counted(
    tmp_path: Path, redis_server: str, redis_client: redis.Redis, multiprocess: bool
) -> None:
    port = free_port()
    env = _env(tmp_path, redis_server, port, tmp_path / "prom" if multiprocess else None)
    worker = subprocess.Popen(
        [
            CELERY,
            "-A",
            "mpapp",
            "worker",
            "-P",
            "prefork",
            "-c",
            "2",
            "-l",
            "warning",
            "-n",
            "mpworker@%h",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    calls = 12
    try:
        wait_until(
            lambda: counted(port, "celery_debounce_windows_opened_total") >= 0,
            timeout=60,
            interval=0.3,
        )
        sender = subprocess.run(
            [
                sys.executable,
                "-c",
                "import mpapp\n"
                f"rs = [mpapp.outer.delay(f'c{{i}}') for i in range({calls})]\n"
                "print(len({r.get(timeout=60) for r in rs}))",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sender.returncode == 0, sender.stderr
        assert sender.stdout.strip() in {"1", "2"}  # pool children ran them
        # the runs of the inner windows were dispatched by the main process's dispatcher
        wait_until(
            lambda: (
                counted(port, "celery_debounce_windows_dispatched_total", task="mpapp.inner")
                == calls
            ),
            timeout=30,
            interval=0.3,
        )
        opened = counted(port, "celery_debounce_calls_total", task="mpapp.inner", outcome="opened")
        timed = counted(port, "celery_debounce_call_duration_seconds_count", task="mpapp.inner")
    finally:
        stop_process(worker)
    if multiprocess:
        assert (opened, timed) == (calls, calls)
    else:  # what the issue found: the children's calls never appear
        assert (opened, timed) == (0, 0)


@pytest.mark.slow
def test_calls_of_preforked_producers_are_counted_by_the_master(
    tmp_path: Path, redis_server: str, redis_client: redis.Redis
) -> None:
    port = free_port()
    env = _env(tmp_path, redis_server, port, tmp_path / "prom")
    master = subprocess.Popen(
        [sys.executable, "-c", "import mpapp; mpapp.preforked_producers(3, 7)"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert master.stdout is not None
        assert master.stdout.readline().strip() == "done"
        assert counted(port, "celery_debounce_windows_opened_total", task="mpapp.inner") == 21
        assert (
            counted(port, "celery_debounce_call_duration_seconds_count", task="mpapp.inner") == 21
        )
    finally:
        stop_process(master)


@pytest.mark.slow
def test_two_nodes_sharing_a_directory_are_served_by_one(
    tmp_path: Path, redis_server: str, redis_client: redis.Redis
) -> None:
    """docs/monitoring.md's celery multi recipe: w1 serves the host's directory, w2 runs
    every task (it alone consumes their queue); w1's /metrics counts w2's children."""
    port = free_port()
    env = {**_env(tmp_path, redis_server, port, tmp_path / "prom"), "MPAPP_SERVING_NODE": "w1"}
    nodes = [
        subprocess.Popen(
            [
                CELERY,
                "-A",
                "mpapp",
                "worker",
                "-P",
                "prefork",
                "-c",
                "1",
                "-l",
                "warning",
                "-n",
                f"{node}@%h",
                "-Q",
                queue,
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for node, queue in (("w1", "celery"), ("w2", "only-w2"))
    ]
    calls = 6
    try:
        wait_until(
            lambda: counted(port, "celery_debounce_windows_opened_total") >= 0,
            timeout=60,
            interval=0.3,
        )
        sender = subprocess.run(
            [
                sys.executable,
                "-c",
                "import mpapp\n"
                f"rs = [mpapp.outer.apply_async((f'n{{i}}',), queue='only-w2') "
                f"for i in range({calls})]\n"
                "print([r.get(timeout=60) for r in rs])",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert sender.returncode == 0, sender.stderr
        wait_until(
            lambda: (
                counted(port, "celery_debounce_calls_total", task="mpapp.inner", outcome="opened")
                == calls
            ),
            timeout=30,
            interval=0.3,
        )
    finally:
        for node in nodes:
            stop_process(node)
