"""The PostgreSQL store end to end: ``debounce_store_url = "postgresql://..."`` in a real
prefork ``celery worker`` (tests/pg_app.py), on a Redis broker (with a debounce_collect
task) and on RabbitMQ with no Redis anywhere; ``celery debounce migrate`` and the
worker's refusal of a database without the schema; stats, top and the exporter on it,
and doctor (Redis's own invariants) refused by name.

The session's private PostgreSQL server (fixture ``postgres_server``), a database of
its own per test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import celery_worker, debounce_command, debounced, wait_until
from pg_app import MAX_WAIT_S, WINDOW_S, build
from prometheus_client.parser import text_string_to_metric_families
from rabbitmq_node import RabbitNode, own_queue

from celery_debounce import WindowNotFound, enqueue_many
from celery_debounce.errors import DebounceBackendError, DebounceConfigError, DebounceOutcomeUnknown
from celery_debounce.settings import Settings, settings_for
from celery_debounce.store.idents import window_ident
from celery_debounce.store.postgres import SCHEMA_VERSION
from celery_debounce.testing import (
    assert_not_pending,
    assert_pending,
    clear_windows,
    debounce_windows,
    flush_windows,
    run_windows,
)
from celery_debounce.testing.pgbouncer import LocalPgBouncer
from celery_debounce.testing.postgres import LocalPostgres
from celery_debounce.testing.servers import free_port

psycopg = pytest.importorskip("psycopg")

pytestmark = [pytest.mark.timeout(120)]

TESTS = Path(__file__).parents[1]
UNFINISHED = "SELECT task_id, state FROM debounce_taken WHERE state <> 'finished'"


# -- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture
def database(postgres_server: LocalPostgres) -> Iterator[str]:
    """The URL of a new, empty database (dropped afterwards)."""
    name = f"e2e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a name made here, not user data
    yield postgres_server.url(name)
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sql(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(query).fetchall()


def env_for(store_url: str, broker_url: str, runs: Path, queue: str = "celery") -> dict[str, str]:
    # tests/ and its tree first: a subprocess imports the same celery_debounce as this
    # process (scripts/mutation_check.py runs a mutated copy)
    path = [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    env = {k: v for k, v in os.environ.items() if k != "DEBOUNCE_TEST_REDIS_URL"}
    env.update(
        PG_STORE=store_url,
        PG_BROKER=broker_url,
        PG_RUNS=str(runs),
        PG_QUEUE=queue,
        PYTHONPATH=os.pathsep.join(filter(None, path)),
    )
    return env


def migrate(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A pg_app debounce migrate ARGS`` in a subprocess."""
    return debounce_command("pg_app", env, "migrate", *args)


@contextmanager
def pg_worker(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A pg_app worker`` (prefork, 2 processes, embedded dispatcher)."""
    with celery_worker("pg_app", log, env, pool="prefork", ready_timeout=60) as proc:
        yield proc


def runs(where: Path, key: str | None = None) -> list[dict[str, Any]]:
    path = where / "runs.jsonl"
    if not path.exists():
        return []
    found = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [r for r in found if key is None or r["key"] == key]


def settled(url: str) -> bool:
    """No open window, and every taken one finished: nothing more will run."""
    (open_,) = sql(url, "SELECT count(*) FROM debounce_open")[0]
    (unfinished,) = sql(url, "SELECT count(*) FROM debounce_taken WHERE state <> 'finished'")[0]
    return open_ == 0 and unfinished == 0


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    where = tmp_path / "runs"
    where.mkdir()
    return where


@pytest.fixture
def migrated(database: str, runs_dir: Path) -> str:
    done = migrate(env_for(database, "memory://", runs_dir))
    assert done.returncode == 0, done.stderr
    return database


@pytest.fixture(params=["direct", pytest.param("pgbouncer", marks=pytest.mark.pgbouncer)])
def store_url(request: pytest.FixtureRequest, migrated: str) -> str:
    """The store's URL for the workers, producers and operators: the migrated database
    directly, or through the session's PgBouncer in transaction mode (its dispatchers
    find that no notification arrives and poll). The tests read the tables directly."""
    if request.param == "direct":
        return migrated
    bouncer: LocalPgBouncer = request.getfixturevalue("pgbouncer_server")
    return bouncer.url(migrated.rsplit("/", 1)[1])


def burst_is_one_run(app: Celery, url: str, where: Path) -> None:
    """Ten calls in a burst: one window, one run, with the opener's arguments."""
    record = app.tasks["pg.record"]
    ids = {record.delay("burst", n).id for n in range(10)}
    assert len(ids) == 1  # every call joined the opener's window
    wait_until(lambda: runs(where, "burst"), 30)
    wait_until(lambda: settled(url), 30)
    done = runs(where, "burst")
    assert [(r["id"], r["n"]) for r in done] == [(ids.pop(), 0)]
    (calls,) = sql(url, "SELECT count(*) FROM debounce_taken WHERE state = 'finished'")[0]
    assert calls == 1


# -- (a) a Redis broker, the windows in PostgreSQL ------------------------------------------


def test_a_real_worker_runs_debounced_windows_from_postgres(
    migrated: str, store_url: str, runs_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    broker = f"{redis_server}/5"
    redis.Redis.from_url(broker).flushdb()
    env = env_for(store_url, broker, runs_dir)
    app = build(store_url, broker, str(runs_dir))
    assert settings_for(app).postgres_url == store_url
    with pg_worker(env, tmp_path / "worker.log"):
        # a burst: one run, the opener's arguments
        burst_is_one_run(app, migrated, runs_dir)

        # enqueue_many: two keys, two windows, each run once with its opener's arguments
        record = app.tasks["pg.record"]
        bulk = enqueue_many(record, [(("b1", 1), {}), (("b2", 2), {}), (("b1", 3), {})])
        assert bulk[0].id == bulk[2].id != bulk[1].id
        wait_until(lambda: runs(runs_dir, "b1") and runs(runs_dir, "b2"), 30)
        wait_until(lambda: settled(migrated), 30)
        assert [(r["id"], r["n"]) for r in runs(runs_dir, "b1")] == [(bulk[0].id, 1)]
        assert [(r["id"], r["n"]) for r in runs(runs_dir, "b2")] == [(bulk[1].id, 2)]

        # debounce_collect: one run gets every call of the burst, in call order
        collect = app.tasks["pg.collect"]
        gathered = {collect.delay("gather", n).id for n in range(25)}
        assert len(gathered) == 1
        wait_until(lambda: runs(runs_dir, "gather"), 30)
        wait_until(lambda: settled(migrated), 30)
        assert [(r["id"], r["ns"]) for r in runs(runs_dir, "gather")] == [
            (gathered.pop(), list(range(25)))
        ]

        # a stream of calls closer together than the window: the ceiling forces runs
        start = time.monotonic()
        first_call = time.time()
        n = 0
        while time.monotonic() - start < 3 * MAX_WAIT_S:
            record.delay("stream", n)
            n += 1
            time.sleep(WINDOW_S / 3)  # the stream's pace: each call within the window
        stream_end = time.time()
        during = [r for r in runs(runs_dir, "stream") if r["at"] < stream_end]
        assert len(during) >= 2, during  # without the ceiling: no run before the stream ends
        assert during[0]["at"] - first_call <= MAX_WAIT_S + 1.0
        assert during[0]["n"] == 0

        # a call during a run opens a new window
        block = runs_dir / "block-during"
        block.touch()
        first = record.delay("during", 1)
        wait_until(lambda: runs(runs_dir, "during"), 30)  # running, held by the block
        second = record.delay("during", 2)
        assert second.id != first.id
        block.unlink()
        wait_until(lambda: len(runs(runs_dir, "during")) == 2, 30)
        assert [(r["id"], r["n"]) for r in runs(runs_dir, "during")] == [
            (first.id, 1),
            (second.id, 2),
        ]


def test_the_least_privileged_role_runs_every_part_after_migrate_grants_it(
    database: str, runs_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """Finding 12: ``migrate --grant-to app`` as the schema's owner, then the worker, its
    dispatcher, the producer and the operators' commands as ``app`` (no superuser, no
    DDL, no right to change the schema's version): a burst runs once, a collect window
    and a cancel work, inspect and stats answer."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN NOSUPERUSER')  # a name made here
    try:
        owner_env = env_for(database, "memory://", runs_dir)
        granted = migrate(owner_env, "--grant-to", role)
        assert granted.returncode == 0, granted.stderr
        as_app = database.replace("postgresql://debounce@", f"postgresql://{role}@")
        broker = f"{redis_server}/6"
        env = env_for(as_app, broker, runs_dir)
        app = build(as_app, broker, str(runs_dir))
        with pg_worker(env, tmp_path / "worker.log"):
            burst_is_one_run(app, database, runs_dir)
            collect = app.tasks["pg.collect"]
            gathered = {collect.delay("gather", n).id for n in range(5)}
            wait_until(lambda: runs(runs_dir, "gather"), 30)
            assert [r["ns"] for r in runs(runs_dir, "gather")] == [list(range(5))]
            assert len(gathered) == 1
            app.tasks["pg.record"].apply_async(("cancelled", 1), debounce=60, debounce_max_wait=120)
            cancelled = debounce_command(
                "pg_app", env, "cancel", "--task", "pg.record", "--key", "k:cancelled", "-j"
            )
            assert cancelled.returncode == 0, cancelled.stderr
            for verb in (("inspect", "-j"), ("stats", "-j"), ("ping",)):
                done = debounce_command("pg_app", env, *verb)
                assert done.returncode == 0, (verb, done.stdout, done.stderr)
        with psycopg.connect(as_app, autocommit=True) as conn:  # no DDL, no version change
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("UPDATE debounce_schema SET version = 99")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("DROP TABLE debounce_open")
    finally:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


# -- (b) RabbitMQ, no Redis anywhere ------------------------------------------------------


def test_rabbitmq_and_postgres_with_no_redis_anywhere(
    migrated: str, runs_dir: Path, rabbitmq_server: RabbitNode, tmp_path: Path
) -> None:
    queue = own_queue()
    env = env_for(migrated, rabbitmq_server.url, runs_dir, queue)
    app = build(migrated, rabbitmq_server.url, str(runs_dir), queue)
    assert not app.conf.get("debounce_redis_url")
    assert not any(
        str(value).startswith(("redis://", "rediss://", "unix://", "sentinel://"))
        for name, value in app.conf.items()
        if name.endswith("_url")
    )
    with pg_worker(env, tmp_path / "worker.log"):
        burst_is_one_run(app, migrated, runs_dir)


# -- (c) the schema: migrate, and a worker refusing a database without it ----------------


def test_migrate_creates_the_schema_then_a_worker_starts(
    database: str, runs_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    env = env_for(database, f"{redis_server}/5", runs_dir)
    first = migrate(env, "-j")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {
        "store": "postgresql",
        "schema": None,
        "before": None,
        "after": SCHEMA_VERSION,
    }
    assert sql(database, "SELECT version FROM debounce_schema") == [(SCHEMA_VERSION,)]
    again = migrate(env)
    assert again.returncode == 0, again.stderr
    assert f"version {SCHEMA_VERSION}: up to date" in again.stdout
    with pg_worker(env, tmp_path / "worker.log") as proc:
        assert proc.poll() is None


def test_a_worker_refuses_a_database_without_the_schema(
    database: str, runs_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    env = env_for(database, f"{redis_server}/5", runs_dir)
    env["PG_DISPATCHER"] = "0"
    log = tmp_path / "worker.log"
    with pytest.raises(AssertionError):
        with pg_worker(env, log):
            pass
    text = log.read_text()
    assert "has no celery_debounce schema" in text
    assert "celery -A proj debounce migrate" in text
    assert "ready." not in text
    assert sql(database, "SELECT to_regclass('debounce_open')") == [(None,)]  # nothing made


# -- (c') gevent: a call waiting on the server never holds the other greenlets -------------


def python_in_tests(store_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` run from tests/ with the store's settings; it must exit 0."""
    env = env_for(store_url, "memory://", Path("/nonexistent"))
    out = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=90, env=env, cwd=TESTS
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.parametrize("patched", ["first", "late"])
def test_greenlets_wait_for_postgres_without_blocking_each_other(
    migrated: str, patched: str
) -> None:
    """One call waits on a row lock another greenlet holds for 1.5 s; ten greenlets'
    calls of other keys finish meanwhile, and the holder commits on time. ``late``:
    gevent patched after the process made its store (gunicorn ``--preload``): the store
    is built anew and psycopg waits cooperatively."""
    pytest.importorskip("gevent", reason="the test extra installs gevent")  # CI has it
    from pg_green import HOLD_S

    out = python_in_tests(migrated, str(TESTS / "pg_green.py"), patched, migrated)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    took, error = got["blocked"]
    assert error is None and took >= HOLD_S - 0.1, got["blocked"]
    assert got["held"] < HOLD_S + 0.5, got  # the holder was not kept from committing
    assert len(got["others"]) == 10 and all(e is None for _, e in got["others"]), got
    # the others finished while the lock was held, not after it
    assert max(t for t, _ in got["others"]) < HOLD_S - 0.3, got["others"]
    (opened,) = sql(migrated, "SELECT count(*) FROM debounce_open WHERE ident LIKE '%other%'")[0]
    assert opened == 50


def test_a_child_patched_after_a_fork_leaves_its_parents_postgres_connections_alone(
    migrated: str,
) -> None:
    """gunicorn ``--preload`` with gevent workers: the master made its store (unpatched),
    a worker forks, patches and calls. The worker builds its own store and never closes
    the master's copy (its connections are the master's): the master's server process
    lives on."""
    pytest.importorskip("gevent", reason="the test extra installs gevent")  # CI has it
    out = python_in_tests(migrated, str(TESTS / "pg_green.py"), "fork", migrated)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["child"] == 0, out.stderr[-3000:]  # the child's call returned
    assert got["alive"] == 1 and got["call"], got
    (opened,) = sql(migrated, "SELECT count(*) FROM debounce_open")[0]
    assert opened == 2  # the parent's window and the child's


def test_under_eventlet_the_postgres_store_is_refused_by_name_and_nothing_written(
    migrated: str,
) -> None:
    if importlib.util.find_spec("eventlet") is None:  # not imported here: it warns at forks
        pytest.skip("the test extra installs eventlet")  # CI has it
    script = (
        "import eventlet; eventlet.monkey_patch()\n"
        "import sys\n"
        "from pg_green import build\n"
        "try:\n"
        "    build(sys.argv[1]).tasks['green.pg'].delay('k')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = python_in_tests(migrated, "-c", script, migrated)
    assert out.stdout.startswith("DebounceConfigError debounce_store_url"), out.stdout
    assert "eventlet" in out.stdout
    assert sql(migrated, "SELECT count(*) FROM debounce_open") == [(0,)]


def test_a_gevent_worker_runs_windows_from_postgres_and_renews_a_long_runs_claim(
    migrated: str, runs_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    pytest.importorskip("gevent", reason="the test extra installs gevent")  # CI has it
    broker = f"{redis_server}/6"
    env = {**env_for(migrated, broker, runs_dir), "PG_CLAIM_LEASE": "2"}
    app = build(migrated, broker, str(runs_dir))
    with celery_worker("pg_app", tmp_path / "worker.log", env, pool="gevent", ready_timeout=60):
        burst_is_one_run(app, migrated, runs_dir)
        (runs_dir / "block-long").touch()  # the run waits (gevent sleeps) until unlinked
        call = app.tasks["pg.record"].delay("long", 1)
        wait_until(lambda: runs(runs_dir, "long"), 30)
        state = f"SELECT state FROM debounce_taken WHERE task_id = '{call.id}'"
        began = time.monotonic()
        while time.monotonic() - began < 3 * 2.0:  # three claim leases
            assert sql(migrated, state) == [("claimed",)], "the claim lapsed while it ran"
            time.sleep(0.25)
        (runs_dir / "block-long").unlink()
        wait_until(lambda: sql(migrated, state) == [("finished",)], 30)
    assert [(r["id"], r["n"]) for r in runs(runs_dir, "long")] == [(call.id, 1)]  # once


# -- (d) PostgreSQL restarted under a stream of calls --------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_postgres_restart_mid_stream_loses_no_accepted_call_and_runs_nothing_twice(
    redis_server: str, tmp_path: Path, mode: str
) -> None:
    """PostgreSQL restarted (``fast``: sessions ended; ``immediate``: as a crash,
    recovered from the WAL) under a stream of calls to 12 keys, a real prefork worker
    with its embedded dispatcher running them. Every call that returned an id runs, that
    id exactly once; a call made while the server was down waited for it or failed,
    within seconds, and only one whose reply was lost (``DebounceOutcomeUnknown``) may
    have opened a window; once the server is back, calls succeed again and the worker
    (claims, finishes, the dispatcher) recovers without a restart of its own."""
    server = LocalPostgres(settings={"synchronous_commit": "on"}).start()
    try:
        url = server.url()
        where = tmp_path / "runs"
        where.mkdir()
        broker = f"{redis_server}/7"
        redis.Redis.from_url(broker).flushdb()
        env = env_for(url, broker, where)
        done = migrate(env)
        assert done.returncode == 0, done.stderr
        app = build(url, broker, str(where))
        record = app.tasks["pg.record"]
        accepted: dict[str, int] = {}  # id -> calls that got it
        unknown = failed = 0
        slowest = 0.0
        with pg_worker(env, tmp_path / "worker.log"):
            restart = threading.Thread(target=server.restart, args=(mode,))
            ok_after = n = during = 0
            started = time.monotonic()
            while ok_after < 40:
                assert time.monotonic() - started < 90, (ok_after, n)
                if n == 60:
                    restart.start()  # the calls go on while the server stops and starts
                began = time.monotonic()
                during += restart.is_alive()
                try:
                    got = record.delay(f"r{n % 12}", n)
                except DebounceOutcomeUnknown:
                    unknown += 1
                except DebounceBackendError:
                    failed += 1
                else:
                    accepted[got.id] = accepted.get(got.id, 0) + 1
                    if n > 60 and not restart.is_alive():
                        ok_after += 1
                slowest = max(slowest, time.monotonic() - began)
                n += 1
                time.sleep(0.01)
            restart.join()
            try:
                wait_until(lambda: set(accepted) <= {r["id"] for r in runs(where)}, 60)
                wait_until(lambda: settled(url), 60)
            except AssertionError:
                missing = sorted(set(accepted) - {r["id"] for r in runs(where)})
                rows = sql(url, UNFINISHED)
                opened = sql(url, "SELECT * FROM debounce_open")
                text = (tmp_path / "worker.log").read_text()
                lines = [ln for ln in text.splitlines() if any(r[0] in ln for r in rows)]
                lines += [ln for ln in text.splitlines() if "WARN" in ln or "ERROR" in ln][:40]
                got = {i: c for i, c in accepted.items() if any(r[0] == i for r in rows)}
                raise AssertionError(
                    f"{missing=}\n{rows=}\n{opened=}\n{got=}\n" + "\n".join(lines)
                ) from None
        ran = [r["id"] for r in runs(where)]
        # an error within the store's timeout (5 s: the pool's wait for a connection)
        assert slowest < 5.0 + 3.0, slowest
        assert len(ran) == len(set(ran)), "a window ran twice"
        assert set(accepted) <= set(ran)  # no accepted call lost
        assert len(set(ran) - set(accepted)) <= unknown  # only a lost reply may have written
        assert sql(url, "SELECT count(*) FROM debounce_open") == [(0,)]
        assert during > 0  # calls were made while the server was down (waited, or failed)
        print(f"{mode}: {n} calls ({during} during), {failed} failed, {unknown} unknown")
    finally:
        server.cleanup()


def test_a_worker_killed_mid_run_on_postgres_is_delivered_again_and_its_window_finishes(
    migrated: str, store_url: str, runs_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """The whole worker SIGKILLed mid-run (``acks_late``, a 2 s claim lease): its claim
    goes stale on PostgreSQL, the broker delivers the message again, the new worker's
    run takes the claim over and finishes the window; the key is not stuck: the next
    call opens a new window, which runs once."""
    broker = f"{redis_server}/8"
    redis.Redis.from_url(broker).flushdb()
    env = {**env_for(store_url, broker, runs_dir), "PG_ACKS_LATE": "1", "PG_CLAIM_LEASE": "2"}
    app = build(store_url, broker, str(runs_dir))
    record = app.tasks["pg.record"]
    (runs_dir / "block-killed").touch()
    call = record.delay("killed", 1)
    with celery_worker("pg_app", tmp_path / "w1.log", env, pool="solo") as worker:
        wait_until(lambda: runs(runs_dir, "killed"), 30)
        (state,) = sql(migrated, f"SELECT state FROM debounce_taken WHERE task_id = '{call.id}'")[0]
        assert state == "claimed"
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    (runs_dir / "block-killed").unlink()
    with celery_worker("pg_app", tmp_path / "w2.log", env, pool="solo"):
        wait_until(lambda: len(runs(runs_dir, "killed")) == 2, 40)
        wait_until(lambda: settled(migrated), 30)
        nxt = record.delay("killed", 2)
        assert nxt.id != call.id
        wait_until(lambda: len(runs(runs_dir, "killed")) == 3, 30)
        wait_until(lambda: settled(migrated), 30)
    assert [(r["id"], r["n"]) for r in runs(runs_dir, "killed")] == [
        (call.id, 1),
        (call.id, 1),
        (nxt.id, 2),
    ]
    finished = sql(migrated, "SELECT task_id, result_state FROM debounce_taken ORDER BY taken_at")
    assert finished == [(call.id, "SUCCESS"), (nxt.id, "SUCCESS")]
    assert "runs again: its previous claim went stale" in (tmp_path / "w2.log").read_text()


# -- (e) the testing helpers ---------------------------------------------------------------


def test_the_testing_helpers_list_run_and_clear_windows_on_postgres(
    migrated: str, runs_dir: Path
) -> None:
    """``debounce_windows`` lists the open windows with their arguments, the asserts
    find them by arguments, ``run_windows`` runs them inline (claimed and finished as a
    worker would), ``flush_windows`` publishes them, ``clear_windows`` empties the
    store."""
    app = build(migrated, "memory://", str(runs_dir))
    record = app.tasks["pg.record"]
    first = record.delay("h1", 1)
    assert record.delay("h1", 2).id == first.id
    other = record.delay("h2", 3)
    listed = sorted(debounce_windows(app, record), key=lambda w: w.key)
    assert [(w.key, w.calls, w.args, w.task_id) for w in listed] == [
        ("k:h1", 2, ("h1", 1), first.id),
        ("k:h2", 1, ("h2", 3), other.id),
    ]
    assert assert_pending(record, "h1", 9, calls=2).task_id == first.id
    assert_not_pending(record, "nothing", 0)
    # a collect window: its args are the list of its calls, as its run gets them
    collect = app.tasks["pg.collect"]
    gathered = [collect.delay("hc", n).id for n in (7, 8)]
    (window,) = debounce_windows(app, collect)
    assert window.task_id == gathered[0] == gathered[1] and window.calls == 2
    ((calls,), kwargs) = window.args, window.kwargs
    assert [c.args for c in calls] == [("hc", 7), ("hc", 8)] and kwargs == {}
    assert [r.id for r in run_windows(app, collect)] == [gathered[0]]
    assert [r["ns"] for r in runs(runs_dir, "hc")] == [[7, 8]]
    ran = run_windows(app, record)
    assert sorted(r.id for r in ran) == sorted([first.id, other.id])
    assert sorted((r["id"], r["n"]) for r in runs(runs_dir) if "n" in r) == sorted(
        [(first.id, 1), (other.id, 3)]
    )
    assert debounce_windows(app) == []
    assert settled(migrated)  # finished, as a worker finishes them
    flushed = record.delay("h4", 5)
    assert flush_windows(app, record) == [flushed.id]  # published to the broker
    assert debounce_windows(app) == []
    record.delay("h3", 4)
    assert clear_windows(app) >= 4  # the open one, the flushed one and the two finished
    assert debounce_windows(app) == []
    assert sql(migrated, "SELECT count(*) FROM debounce_taken") == [(0,)]


def test_cancel_inspect_and_flush_all_on_postgres(
    migrated: str, store_url: str, runs_dir: Path
) -> None:
    app = build(store_url, "memory://", str(runs_dir))
    app.conf.result_backend = "cache+memory://"
    record = app.tasks["pg.record"]
    first = record.delay("c1", 1)
    record.delay("c1", 2)
    info = record.debounce_cancel("c1")
    assert (info.task_id, info.calls, info.key) == (first.id, 2, "k:c1")
    assert app.AsyncResult(first.id).state == "REVOKED"
    assert sql(migrated, "SELECT count(*) FROM debounce_open") == [(0,)]
    with pytest.raises(WindowNotFound):
        record.debounce_cancel("c1")
    assert record.delay("c1", 3).id != first.id  # a new window

    env = env_for(store_url, "memory://", runs_dir)
    other = record.delay("c2", 1)
    done = debounce_command("pg_app", env, "cancel", "--task", "pg.record", "--key", "k:c2", "-j")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["task_id"] == other.id
    assert sql(migrated, "SELECT ident FROM debounce_open") == [
        (window_ident("pg.record", "k:c1"),)
    ]
    c1 = sql(migrated, "SELECT task_id FROM debounce_open")[0][0]

    # inspect lists open windows (and taken ones) and finds one by id; cancel --id,
    # cancel --all and flush --all find theirs the same way
    for key in ("c3", "c4", "c5"):
        record.delay(key, 1)
    listed = debounce_command("pg_app", env, "inspect", "-j")
    assert listed.returncode == 0, listed.stderr
    windows = json.loads(listed.stdout)
    assert [(w["key"], w["state"]) for w in windows] == [
        ("k:c1", "pending"),
        ("k:c3", "pending"),
        ("k:c4", "pending"),
        ("k:c5", "pending"),
    ]
    found = debounce_command("pg_app", env, "inspect", "--id", c1, "-j")
    assert [w["key"] for w in json.loads(found.stdout)] == ["k:c1"], found.stderr
    by_id = debounce_command("pg_app", env, "cancel", "--id", c1)
    assert by_id.returncode == 0 and "Cancelled pg.record" in by_id.stdout, by_id.stderr
    flushed = debounce_command("pg_app", env, "flush", "--all", "--task", "pg.record", "-j")
    assert flushed.returncode == 0, flushed.stderr
    assert sql(migrated, "SELECT count(*) FROM debounce_open") == [(0,)]
    assert sql(migrated, "SELECT count(*) FROM debounce_taken WHERE state = 'dispatching'") == [
        (3,)
    ]
    taken = debounce_command("pg_app", env, "inspect", "--state", "dispatching", "-j")
    assert sorted(w["key"] for w in json.loads(taken.stdout)) == ["k:c3", "k:c4", "k:c5"]
    record.delay("c6", 1)
    record.delay("c7", 1)
    every = debounce_command("pg_app", env, "cancel", "--all", "--force", "-j")
    assert every.returncode == 0, every.stderr
    assert json.loads(every.stdout)["cancelled"] == 2
    assert sql(migrated, "SELECT count(*) FROM debounce_open") == [(0,)]


def test_two_deployments_with_their_own_prefixes_share_a_database_apart(
    migrated: str, store_url: str, runs_dir: Path
) -> None:
    """Finding 9: ``prod`` and ``staging`` on one database, each with its prefix (its
    schema, named on each transaction: through PgBouncer too): staging's inspect lists
    only its own window, its ``cancel --all`` cancels only its own, its dispatcher takes
    only its own, its ``clear_windows`` clears only its own."""
    database = migrated
    envs = {
        prefix: {**env_for(store_url, "memory://", runs_dir), "PG_PREFIX": prefix}
        for prefix in ("prod", "staging")
    }
    for env in envs.values():
        done = migrate({**env, "PG_STORE": database})
        assert done.returncode == 0, done.stderr
    apps = {prefix: build(store_url, "memory://", str(runs_dir)) for prefix in envs}
    for prefix, app in apps.items():
        app.conf.debounce_key_prefix = prefix
    prod = apps["prod"].tasks["pg.record"].delay("same", 1)
    staging = apps["staging"].tasks["pg.record"].delay("same", 1)
    assert prod.id != staging.id  # one key, two deployments: two windows
    listed = debounce_command("pg_app", envs["staging"], "inspect", "-j")
    assert listed.returncode == 0, listed.stderr
    assert [w["task_id"] for w in json.loads(listed.stdout)] == [staging.id]
    every = debounce_command("pg_app", envs["staging"], "cancel", "--all", "--force", "-j")
    assert every.returncode == 0, every.stderr
    assert json.loads(every.stdout)["cancelled"] == 1
    assert sql(database, "SELECT task_id FROM prod.debounce_open") == [(prod.id,)]
    assert sql(database, "SELECT count(*) FROM staging.debounce_open") == [(0,)]
    from celery_debounce.store import store_for

    apps["staging"].tasks["pg.record"].delay("other", 1)
    staging_store = store_for(apps["staging"])
    staging_store.flush(0, [(window_ident("pg.record", "k:other"), "")])
    prod_store = store_for(apps["prod"])
    prod_store.flush(0, [(window_ident("pg.record", "k:same"), "")])
    taken = staging_store.take(0, 100).windows
    assert [w.record.ident for w in taken] == [window_ident("pg.record", "k:other")]
    assert [w.task_id for w in prod_store.take(0, 100).windows] == [prod.id]
    # a third deployment's schema, new beside one holding windows: migrate names it
    apps["prod"].tasks["pg.record"].delay("open", 1)
    third = migrate({**envs["prod"], "PG_PREFIX": "qa", "PG_STORE": database})
    assert third.returncode == 0, third.stderr
    assert "(schema 'qa'): none -> version" in third.stdout
    assert "schema 'prod' of this database also holds celery_debounce windows (1 open)" in (
        third.stderr
    )
    assert "'staging'" not in third.stderr  # no window open there
    # staging's clear_windows empties its own schema only, its counters and its cancel's
    # kept answer with it: prod's windows and counters stay
    theirs = "SELECT (SELECT count(*) FROM prod.debounce_stats), (SELECT count(*) FROM "
    theirs += "prod.debounce_open), (SELECT count(*) FROM prod.debounce_taken)"
    kept = sql(database, theirs)
    assert min(kept[0]) > 0
    assert sql(database, "SELECT count(*) FROM staging.debounce_cancelled")[0][0] > 0
    assert clear_windows(apps["staging"]) > 0
    for table in ("debounce_open", "debounce_taken", "debounce_stats", "debounce_cancelled"):
        assert sql(database, f"SELECT count(*) FROM staging.{table}") == [(0,)], table
    assert sql(database, theirs) == kept


ODD_KEYS = [
    "a\x00b",  # NUL: PostgreSQL's text cannot hold it
    "\x00",
    "emoji \U0001f600 and combining e\u0301",
    "back\\slash 'quote\" 50% of_",  # LIKE's wildcards, quotes
    "\x01\x1f\x7f control",
    "\udcff",  # a lone surrogate
    "k" * 1024,  # at debounce_max_key_length
]


@pytest.mark.parametrize("key", ODD_KEYS, ids=[f"key{i}" for i in range(len(ODD_KEYS))])
def test_a_key_is_accepted_or_refused_alike_on_redis_and_on_postgres(
    migrated: str, runs_dir: Path, redis_server: str, key: str
) -> None:
    """Finding 6: what the Redis store accepts, the PostgreSQL store accepts; what one
    refuses (with DebounceKeyError), the other refuses, nothing written."""
    from helpers import make_app

    from celery_debounce import DebounceKeyError

    answers = []
    for app in (build(migrated, "memory://", str(runs_dir)), make_app(redis_server)):

        @debounced(
            app,
            name="odd.t",
            shared=False,
            debounce=60,
            debounce_key="{0}",
            debounce_max_wait=120,
        )
        def odd(value: str) -> None: ...

        try:
            first = odd.delay(key).id
            answers.append(("accepted", odd.delay(key).id == first))
        except DebounceKeyError as exc:
            answers.append(("refused", str(exc)))
    assert answers[0] == answers[1], answers
    if answers[0][0] == "refused":
        assert sql(migrated, "SELECT count(*) FROM debounce_open") == [(0,)]
    else:
        assert answers[0] == ("accepted", True)  # the second call joined the first's window
        assert len(sql(migrated, "SELECT ident FROM debounce_open")) == 1


def test_a_misconfigured_store_is_raised_by_name_even_when_outages_publish(
    postgres_server: LocalPostgres, runs_dir: Path
) -> None:
    """Finding 8: with ``debounce_on_outage="publish"`` an unknown role is not an outage:
    the call raises StoreMisconfigured at once and nothing is published plainly."""
    from kombu import Connection

    from celery_debounce import StoreMisconfigured

    url = f"postgresql://nosuchrole@127.0.0.1:{postgres_server.port}/postgres"
    broker, queue_name = "memory://", f"misconfigured-{uuid.uuid4().hex[:8]}"
    app = build(url, broker, str(runs_dir), queue=queue_name)
    app.conf.debounce_on_outage = "publish"
    started = time.monotonic()
    with pytest.raises(StoreMisconfigured, match='role "nosuchrole" does not exist'):
        app.tasks["pg.record"].delay("k1", 1)
    assert time.monotonic() - started < 2.0
    with Connection(broker) as conn:
        queue = conn.SimpleQueue(queue_name)
        assert queue.qsize() == 0  # nothing published plainly
        queue.close()


# -- (f) what the store does not have yet, and bad settings: refused, nothing written ----


def test_stats_top_and_the_exporter_read_postgres_and_doctor_is_refused_by_name(
    migrated: str, runs_dir: Path, tmp_path: Path
) -> None:
    app = build(migrated, "memory://", str(runs_dir))
    record = app.tasks["pg.record"]
    # enqueue_many works (call by call): two calls of one key, one window
    bulk = enqueue_many(record, [(("bulk", 1), {}), (("bulk", 2), {})])
    assert len({r.id for r in bulk}) == 1
    assert sql(migrated, "SELECT calls FROM debounce_open") == [(2,)]
    assert [r.id for r in run_windows(app, record)] == [bulk[0].id]  # taken: counted
    record.delay("waiting", 3)

    env = env_for(migrated, "memory://", runs_dir)
    stats = debounce_command("pg_app", env, "stats", "-j")
    assert stats.returncode == 0, stats.stderr
    figures = json.loads(stats.stdout)
    assert figures["open"] == 1  # due or not: its 0.3 s window may have passed
    (task,) = figures["tasks"]
    assert (task["task"], task["open"], task["runs"], task["calls"]) == ("pg.record", 1, 1, 2)
    assert sum(task["lateness_buckets"].values()) == 1
    assert (figures["maxmemory_policy"], figures["evicts_windows"]) == (None, False)
    plain = debounce_command("pg_app", env, "stats")
    assert plain.returncode == 0 and "maxmemory-policy" not in plain.stdout, plain.stdout
    assert "windows in PostgreSQL: rows are never evicted" in plain.stdout
    reset = debounce_command("pg_app", env, "stats", "--reset", "-j")
    assert reset.returncode == 0 and json.loads(reset.stdout)["tasks"][0]["runs"] == 1
    assert sql(migrated, "SELECT count(*) FROM debounce_stats") == [(0,)]

    top = debounce_command("pg_app", env, "top", "--plain", "--iterations", "1")
    assert top.returncode == 0, top.stderr
    assert "pg.record" in top.stdout and "Traceback" not in top.stderr

    port = free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "pg_app", "debounce", "exporter", "--port",
         str(port), "--addr", "127.0.0.1", "--min-interval", "0"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        got = wait_until(lambda: _scraped(port), 30)
        assert got["celery_debounce_store_up"] == 1
        assert got["celery_debounce_open_windows"] == 1
    finally:
        exporter.send_signal(signal.SIGTERM)
        exporter.wait(10)

    doctor = debounce_command("pg_app", env, "doctor")
    assert doctor.returncode == 1 and "doctor is not available on the PostgreSQL" in doctor.stderr

    # ping and flush work
    record.delay("flushme", 1)
    flushed = debounce_command("pg_app", env, "flush", "--task", "pg.record", "--key", "k:flushme")
    assert flushed.returncode == 0, flushed.stderr
    assert "Flushed pg.record" in flushed.stdout
    assert sql(migrated, "SELECT count(*) FROM debounce_open WHERE ident LIKE '%flushme'") == [(0,)]
    pinged = debounce_command("pg_app", env, "ping", "-j")
    assert pinged.returncode == 1, pinged.stderr  # no dispatcher runs: not alive
    assert json.loads(pinged.stdout)["dispatchers"] == []


def _scraped(port: int) -> dict[str, float] | None:
    """The exporter's samples by name, once it answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


def test_bad_store_settings_are_refused_clearly_and_nothing_written(
    migrated: str, runs_dir: Path
) -> None:
    def settings(**conf: object) -> Settings:
        app = Celery("bad", set_as_current=False)
        app.conf.update(broker_url="memory://", **conf)
        return Settings.from_app(app)

    with pytest.raises(DebounceConfigError, match=r"debounce_store_url='mysql://h/db'"):
        settings(debounce_store_url="mysql://h/db")
    with pytest.raises(DebounceConfigError, match="debounce_store_url=5"):
        settings(debounce_store_url=5)
    with pytest.raises(DebounceConfigError, match="name different stores"):
        settings(debounce_store_url=migrated, debounce_redis_url="redis://localhost/0")
    with pytest.raises(DebounceConfigError, match="debounce_shards is a setting of the Redis"):
        settings(debounce_store_url=migrated, debounce_shards=2)
    with pytest.raises(DebounceConfigError, match="debounce_postgres_timeout='soon'"):
        settings(debounce_store_url=migrated, debounce_postgres_timeout="soon")
    with pytest.raises(DebounceConfigError, match="debounce_postgres_timeout=0"):
        settings(debounce_store_url=migrated, debounce_postgres_timeout=0)
    with pytest.raises(DebounceConfigError, match="debounce_postgres_timeout is a setting of"):
        settings(debounce_redis_url="redis://h:6379/3", debounce_postgres_timeout=2)
    assert (
        settings(debounce_store_url=migrated, debounce_postgres_timeout="2s").postgres_timeout_s
        == 2
    )
    # a redis:// store URL is the Redis store; postgres:// the PostgreSQL one
    assert settings(debounce_store_url="redis://h:6379/3").redis_url == "redis://h:6379/3"
    assert settings(debounce_store_url="redis://h:6379/3").postgres_url is None
    short = "postgres://u@h/db"
    assert settings(debounce_store_url=short).postgres_url == short

    app = build(migrated, "memory://", str(runs_dir))
    app.conf.debounce_redis_url = "redis://localhost:6379/0"
    with pytest.raises(DebounceConfigError, match="name different stores"):
        app.tasks["pg.record"].delay("refused", 1)
    assert sql(migrated, "SELECT count(*) FROM debounce_open") == [(0,)]


def test_a_call_blocked_on_the_server_fails_within_debounce_postgres_timeout(
    migrated: str, runs_dir: Path
) -> None:
    """A call waiting on a lock another session holds is cancelled by the server at
    ``debounce_postgres_timeout`` (each connection's ``statement_timeout``), with
    nothing written: an error within that timeout, not the default 5 s."""
    app = build(migrated, "memory://", str(runs_dir))
    app.conf.debounce_postgres_timeout = 1.5
    record = app.tasks["pg.record"]
    first = record.delay("locked", 1)
    with psycopg.connect(migrated) as holder:  # a transaction holds the window's row
        holder.execute("SELECT 1 FROM debounce_open FOR UPDATE").fetchall()
        started = time.monotonic()
        with pytest.raises(DebounceBackendError, match="nothing written") as refused:
            record.delay("locked", 2)
        took = time.monotonic() - started
    assert not isinstance(refused.value, DebounceOutcomeUnknown)
    assert 1.0 <= took < 4.0, took
    assert sql(migrated, "SELECT task_id, calls FROM debounce_open") == [(first.id, 1)]
    assert record.delay("locked", 3).id == first.id  # answered again at once


def test_without_the_postgres_extra_one_line_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery_debounce.store import build_store

    app = Celery("noextra", set_as_current=False)
    app.conf.update(broker_url="memory://", debounce_store_url="postgresql://h/db")
    monkeypatch.setitem(sys.modules, "celery_debounce.store.postgres.app", None)
    with pytest.raises(DebounceConfigError) as refused:
        build_store(Settings.from_app(app))
    message = str(refused.value)
    assert "pip install 'celery-debounced[postgres]'" in message
    assert "\n" not in message


# -- the schema as Django migrations ------------------------------------------------------


def django_project(
    server: LocalPostgres, database: str, tmp_path: Path
) -> tuple[Path, str, dict[str, str]]:
    """tests/django_project on ``database`` (its folder, the database's name, the env of
    ``python -m django`` there)."""
    project = TESTS / "django_project"
    name = database.rsplit("/", 1)[1]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "djproj.settings",
        "DJPROJ_REDIS_URL": "redis://127.0.0.1:9",  # never connected
        "DJPROJ_DB": str(tmp_path / "unused.sqlite3"),
        "DJPROJ_PG": f"127.0.0.1 {server.port} {server.USER} {name}",
        "PYTHONPATH": os.pathsep.join([str(project), str(TESTS.parent)]),
    }
    return project, name, env


def test_django_tests_keep_their_windows_in_the_test_database_and_let_it_drop(
    postgres_server: LocalPostgres, database: str, tmp_path: Path
) -> None:
    """Finding 10: ``python -m django test`` on PostgreSQL with ``use_postgres(app,
    django_database_url())``: the windows go to Django's test database (migrated
    there), and ``close_store`` lets Django drop it at the end, with no "being accessed
    by other users"."""
    pytest.importorskip("django")
    project, name, env = django_project(postgres_server, database, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "django", "test", "djproj.pg_tests", "--noinput", "-v", "2"],
        cwd=project, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "Ran 1 test" in out and "OK" in out, out[-4000:]
    assert "being accessed by other users" not in out, out[-4000:]
    assert sql(database, "SELECT to_regclass('debounce_open')") == [(None,)]  # not here
    test_db = f"test_{name}"
    listed = sql(postgres_server.url(), f"SELECT 1 FROM pg_database WHERE datname = '{test_db}'")
    assert listed == []  # dropped


def test_django_migrations_create_and_upgrade_the_schema_and_agree_with_migrate(
    postgres_server: LocalPostgres, database: str, runs_dir: Path, tmp_path: Path
) -> None:
    """``celery_debounce.contrib.django`` in INSTALLED_APPS: ``manage.py migrate`` brings
    the database Django migrates to the schema this package needs, one migration per
    version, the functions with the last (a database at version 2 is upgraded, its
    windows kept), and agrees with
    ``celery debounce migrate`` run before or after it."""
    pytest.importorskip("django")
    project, _, env = django_project(postgres_server, database, tmp_path)

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "django", *args],
            cwd=project, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    # the project's CELERY_DEBOUNCE_KEY_PREFIX names the deployment's schema: Django's
    # migrations put the tables there, as `celery debounce migrate` of that app does
    from psycopg.conninfo import make_conninfo

    in_schema = make_conninfo(database, options="-c search_path=djdebounce")
    manage("migrate", "celery_debounce", "0002")
    assert sql(in_schema, "SELECT version FROM debounce_schema") == [(2,)]
    assert sql(database, "SELECT to_regclass('public.debounce_schema')") == [(None,)]
    # the tables of version 2 (a migration short of the last brings no function)
    assert sql(in_schema, "SELECT to_regprocedure('debounce_ms(timestamptz)')") == [(None,)]
    with psycopg.connect(in_schema, autocommit=True) as conn:  # a window of version 2
        conn.execute(
            "INSERT INTO debounce_open (ident, task_id, first_seen, deadline, max_wait_ms, "
            "content_type, payload, options_json) VALUES ('1:t:k', 'kept', now(), "
            "now() + interval '1 minute', 60000, 'application/json', '[[], {}, {}]', '{}')"
        )
    manage("migrate", "celery_debounce")
    assert sql(in_schema, "SELECT version FROM debounce_schema") == [(SCHEMA_VERSION,)]
    assert sql(in_schema, "SELECT task_id, calls FROM debounce_open") == [("kept", 1)]
    prefixed = {**env_for(database, "memory://", runs_dir), "PG_PREFIX": "djdebounce"}
    again = migrate(prefixed, "-j")
    assert json.loads(again.stdout) == {
        "store": "postgresql",
        "schema": "djdebounce",
        "before": SCHEMA_VERSION,
        "after": SCHEMA_VERSION,
    }
    # the other order: migrated by the command first, then by Django (nothing to do)
    manage("migrate", "celery_debounce", "zero")  # forgets the migrations, keeps the schema
    manage("migrate", "celery_debounce")
    assert sql(in_schema, "SELECT version FROM debounce_schema") == [(SCHEMA_VERSION,)]
    app = build(database, "memory://", str(runs_dir))
    app.conf.debounce_key_prefix = "djdebounce"
    assert app.tasks["pg.record"].delay("after", 1).id
