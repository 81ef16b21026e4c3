"""Chaos: a stream of calls while dispatchers are SIGKILLed and the worker stalls.

A real worker (prefork, ``acks_late``, its embedded dispatcher) and two standalone
``celery debounce dispatch`` processes serve one stream of calls over many keys. During
the stream, dispatchers are SIGKILLed at random moments and started again, and
"doomed" dispatchers take the due windows, publish them and are SIGKILLed before
``ack.lua`` (the case that used to run a body twice), sometimes while the worker is
stopped (SIGSTOP) for longer than the dispatch lease, so that those windows are
published a second time. The rules checked at the end:

* every window a caller was given ran (nothing lost);
* no window's body ran twice (effectively once: a second delivery of a finished or
  live window is skipped before the body), and the skips are counted.

It runs with the windows in Redis and in PostgreSQL (Redis stays the broker). The seed
of the random schedule is printed; ``CHAOS_SEED=<n>`` replays one.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fault_app import build
from helpers import stop_process, wait_until
from test_faults import TESTS, doomed_dispatcher, env_for, worker_process

from celery_debounce import DebounceBackendError
from celery_debounce.ops.admin import DebounceAdmin
from celery_debounce.ops.read_view import list_windows
from celery_debounce.testing.postgres import LocalPostgres

pytestmark = pytest.mark.slow

#: How long calls keep coming (seconds), and over how many keys.
STREAM_S = 10.0
KEYS = 40


def _dispatcher(redis_url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "fault_app",
                "debounce",
                "dispatch",
                "--loglevel",
                "INFO",
            ],
            cwd=TESTS,
            env=env_for(redis_url),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _signal_tree(pid: int, signum: int) -> None:
    """``signum`` to a process and its children (a prefork worker's pool)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    pids = [pid, *(int(p) for p in children.read_text().split())] if children.exists() else [pid]
    for target in pids:
        try:
            os.kill(target, signum)
        except ProcessLookupError:
            pass


@pytest.fixture(
    params=["redis", "postgres", pytest.param("pgbouncer", marks=pytest.mark.pgbouncer)]
)
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Where the windows live: Redis, or a fresh PostgreSQL database (migrated), directly
    or through the session's PgBouncer in transaction mode, named to every process of
    the test by FAULT_STORE; Redis is the broker either way."""
    if request.param == "redis":
        yield "redis"
        return
    psycopg = pytest.importorskip("psycopg")
    from celery_debounce.store.postgres import PostgresStore

    server: LocalPostgres = request.getfixturevalue("postgres_server")
    name = f"chaos_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a name made here, not user data
    with PostgresStore(server.url(name)) as made:
        made.migrate()
    url = server.url(name)
    if request.param == "pgbouncer":
        url = request.getfixturevalue("pgbouncer_server").url(name)
    monkeypatch.setenv("FAULT_STORE", url)
    yield url
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_dispatchers_killed_at_random_lose_nothing_and_run_no_body_twice(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path, store: str
) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"\nCHAOS_SEED={seed}")
    rng = random.Random(seed)
    postgres = {"debounce_store_url": store, "debounce_redis_url": None}
    app = build(redis_server, **(postgres if store != "redis" else {}))
    record = app.tasks["faults.record"]
    given: dict[str, set[str]] = {}  # key -> window ids handed to callers
    stop = threading.Event()
    refused: list[str] = []
    calls = 0

    def produce() -> None:
        nonlocal calls
        keys = [f"c{i}" for i in range(KEYS)]
        while not stop.is_set():
            key = rng.choice(keys)
            try:
                given.setdefault(key, set()).add(record.delay(key).id)
                calls += 1
            except DebounceBackendError as exc:  # never expected: Redis stays up
                refused.append(str(exc))
            time.sleep(0.004)

    log = tmp_path / "worker.log"
    dispatchers = [_dispatcher(redis_server, tmp_path / f"d{i}.log") for i in range(2)]
    kills = doomed = stalls = doomed_windows = 0
    try:
        with worker_process(
            redis_server, log, pool="prefork", extra_env={"FAULT_CLAIM_LEASE": "8"}
        ) as worker:
            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            ends = time.monotonic() + STREAM_S
            # at least five disturbances however slow the machine (each takes a few
            # seconds on a loaded one, so the stream's time alone may hold fewer)
            while time.monotonic() < ends or kills + doomed + stalls < 5:
                time.sleep(rng.uniform(0.2, 0.8))
                if not stalls or rng.random() < 0.3:
                    # a stall (a GC pause, a VM steal, a debugger) of the worker and the
                    # dispatchers while a doomed one takes and publishes what came due;
                    # the dispatchers go on first, past the dispatch lease, so they
                    # publish those windows again before the worker reads either copy;
                    # shorter than the claim lease, so no live run's claim goes stale
                    stalled = [worker.pid, *(d.pid for d in dispatchers)]
                    for pid in stalled:
                        _signal_tree(pid, signal.SIGSTOP)
                    time.sleep(0.3)
                    doomed_windows += len(doomed_dispatcher(redis_server, publish=True))
                    for pid in stalled[1:]:
                        _signal_tree(pid, signal.SIGCONT)
                    time.sleep(rng.uniform(1.3, 1.8))
                    _signal_tree(worker.pid, signal.SIGCONT)
                    stalls += 1
                elif rng.random() < 0.5:
                    doomed_windows += len(
                        doomed_dispatcher(redis_server, publish=rng.random() < 0.8)
                    )
                    doomed += 1
                else:
                    i = rng.randrange(len(dispatchers))
                    dispatchers[i].send_signal(signal.SIGKILL)
                    dispatchers[i].wait(10)
                    kills += 1
                    dispatchers[i] = _dispatcher(redis_server, tmp_path / f"d{i}.log")
            stop.set()
            producer.join(10)
            ids = set().union(*given.values())

            def ran() -> set[str]:
                out: set[str] = set()
                for key in given:
                    out.update(r.decode() for r in redis_client.lrange(f"runs:{key}", 0, -1))
                return out

            wait_until(lambda: ids <= ran() and not list_windows(app), timeout=60, interval=0.25)
            # past two dispatch leases: a copy still in the broker (a window published
            # twice) is delivered, and skipped or run, before the bodies are counted
            time.sleep(2.5)
            wait_until(lambda: not list_windows(app), timeout=20, interval=0.25)
    finally:
        for proc in dispatchers:
            stop_process(proc)
    bodies = Counter(r.decode() for key in given for r in redis_client.lrange(f"runs:{key}", 0, -1))
    twice = {task_id: n for task_id, n in bodies.items() if n > 1}
    skipped = DebounceAdmin(app).stats().tasks["faults.record"].duplicates_skipped
    figures = {
        "seed": seed,
        "calls": calls,
        "windows": len(ids),
        "dispatcher_kills": kills,
        "doomed_dispatchers": doomed,
        "worker_stalls": stalls,
        "windows_taken_by_doomed": doomed_windows,
        "duplicates_skipped": skipped,
        "bodies_twice": len(twice),
        "lost": len(ids - set(bodies)),
        "refused": len(refused),
    }
    print(f"CHAOS {figures}")
    assert not refused, refused[:3]
    assert kills + doomed + stalls >= 5, figures  # the schedule did disturb them
    assert ids - set(bodies) == set(), figures  # every id a caller holds ran
    assert twice == {}, figures  # and no body ran twice
    assert set(bodies) == ids, figures  # nothing ran that no caller was given
