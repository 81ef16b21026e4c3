"""Helpers shared by the tests (import them with ``from helpers import ...``)."""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.contrib.testing.worker import start_worker
from click.testing import CliRunner, Result
from kombu.asynchronous import set_event_loop

from celery_debounce import DebouncedTask

_counter = itertools.count()
#: tests/, where the test apps (fault_app, pg_app, ...) are imported from
TESTS = Path(__file__).resolve().parent


def debounced(app: Celery, **options: Any) -> Callable[[Callable[..., Any]], Any]:
    """The one factory of a debounced test task: ``app.task(base=DebouncedTask,
    shared=False, **options)`` (``shared=False``: the task is the test app's alone).
    The task modules a test worker imports by name (``-A``) declare theirs as users do."""
    options.setdefault("shared", False)
    decorate: Callable[[Callable[..., Any]], Any] = app.task(base=DebouncedTask, **options)
    return decorate


#: Every app make_app built (the ``store`` fixture closes their PostgreSQL stores' pools
#: when the test ends).
made_apps: weakref.WeakSet[Celery] = weakref.WeakSet()


def make_app(redis_url: str, name: str | None = None, **conf: Any) -> Celery:
    """A fresh app: windows in DB 0, broker in DB 1, results in DB 2 (``conf`` of the
    ``store`` fixture's PostgreSQL case: the windows in PostgreSQL instead)."""
    app = Celery(name or f"t{next(_counter)}", set_as_current=False)
    made_apps.add(app)
    app.conf.update(
        broker_url=f"{redis_url}/1",
        result_backend=f"{redis_url}/2",
        debounce_redis_url=f"{redis_url}/0",
        debounce_poll_interval=0.2,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.conf.update(**conf)
    return app


@dataclass(frozen=True)
class Broker:
    """One case of the ``broker`` fixture (conftest.py): its name ("redis" or "rabbitmq")
    and the settings that put an app's messages on it: ``app_factory(**broker.conf)``."""

    name: str
    conf: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StoreCase:
    """One case of the ``store`` fixture (conftest.py): its name ("redis" or "postgres")
    and the settings that put an app's windows in it (``app_factory`` applies them; a
    test calling ``make_app`` itself passes ``**store.conf``). Broker and results stay on
    Redis DB 1 and 2."""

    name: str
    conf: dict[str, Any] = field(default_factory=dict)


@contextmanager
def running_worker(app: Celery, **kwargs: Any) -> Iterator[Any]:
    """A real in-process Celery worker (solo pool) with the embedded dispatcher."""
    kwargs.setdefault("pool", "solo")
    kwargs.setdefault("perform_ping_check", False)
    kwargs.setdefault("shutdown_timeout", 10)
    # A worker reuses kombu's process-wide event loop if one is set, and with it the
    # timer of the worker that created it. On Celery 5.3 the new worker schedules
    # ETA messages (a retry's countdown) on its own timer, which that loop never
    # fires: each in-process worker gets a fresh loop (one worker per process in
    # production never meets this).
    set_event_loop(None)
    try:
        with start_worker(app, **kwargs) as worker:
            yield worker
    finally:
        set_event_loop(None)


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


def package_keys(client: redis.Redis, prefix: str = "debounce") -> list[bytes]:
    """The package's keys under ``prefix`` that windows leave: every one but the task
    definitions (``<prefix>:tasks``, kept for producers by name: docs/design.md)."""
    kept = f"{prefix}:tasks".encode()
    return sorted(k for k in client.scan_iter(match=f"{prefix}:*") if k != kept)


@contextmanager
def celery_worker(
    app_module: str,
    log: Path,
    env: dict[str, str],
    pool: str = "solo",
    name: str | None = None,
    ready_timeout: float = 30,
    queues: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A <app_module> worker`` (2 processes for a pool that has them, the
    embedded dispatcher; ``queues``: its ``-Q``) in a subprocess run from tests/, its
    output in ``log``; yields once it is ready, stops it after (SIGTERM, then SIGKILL)."""
    command = [sys.executable, "-m", "celery", "-A", app_module, "worker", "--pool", pool]
    command += ["--concurrency", "2", "--loglevel", "INFO"]
    command += ["-n", f"{name}@%h"] if name else []
    command += ["-Q", queues] if queues else []
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, cwd=TESTS, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: b"ready." in log.read_bytes() or proc.poll() is not None, ready_timeout)
        assert proc.poll() is None, log.read_text()
        yield proc
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15.0) -> Any:
    """SIGTERM ``proc``, SIGKILL it if it has not exited within ``timeout`` seconds.

    Returns what is left of its stdout (None when it has no pipe).
    """
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def debounce_command(
    app_module: str, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """``celery -A <app_module> debounce ARGS`` in a fresh process run from tests/, its
    output captured as text (a minute at most)."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", app_module, "debounce", *args],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def cli(*args: str, input: str | None = None) -> Result:
    """Run ``celery -A ops_app debounce ARGS`` (tests/ops_app.py, fixture ``ops``)
    in-process through Celery's own CLI."""
    from celery.bin.celery import celery as celery_cli  # here: 0.4 s of every pytest start

    return CliRunner().invoke(celery_cli, ["-A", "ops_app", "debounce", *args], input=input)


@contextmanager
def silent_listener() -> Iterator[tuple[int, list[socket.socket]]]:
    """A port that accepts every connection and never answers (bytes are read, dropped):
    ``(port, the connections accepted so far)``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)  # kept open, never answered

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], held
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def collect_only(ids: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only -q`` of the test ids ``ids``, run from the repository's
    root in a subprocess (its output: one collected id per line)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
