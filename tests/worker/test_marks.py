"""Every record reaches a final state once the store is back: claims and finishes that
failed during an outage of the windows' store are kept and sent again
(celery_debounce.worker.retry_queue). The aliases test runs over both stores (each on a
private server it stops and starts again); the others are Redis outages."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from helpers import StoreCase, debounced, stop_process, wait_until
from marks_app import build

from celery_debounce import DebounceBackendError
from celery_debounce.testing.servers import LocalRedis

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("store")]
TESTS = Path(__file__).parents[1]


@pytest.mark.redis_only(
    "a windows-Redis restart read raw (the PostgreSQL restart: test_postgres_e2e.py)"
)
def test_marks_failed_during_a_windows_redis_restart_are_sent_when_it_is_back(
    tmp_path: Path,
) -> None:
    windows = LocalRedis(appendonly=True).start()
    broker = LocalRedis().start()
    log = tmp_path / "worker.log"
    env = dict(
        os.environ, MARKS_WINDOWS=windows.url, MARKS_BROKER=broker.url, PYTHONPATH=str(TESTS)
    )
    proc: subprocess.Popen[bytes] | None = None
    try:
        app = build(windows.url, broker.url)
        task = app.tasks["marks.work"]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "marks_app",
                    "worker",
                    "--pool",
                    "solo",
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
        wait_until(lambda: b"ready." in log.read_bytes() or proc.poll() is not None, 30)
        assert proc.poll() is None, log.read_text()
        ok: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            i = 0
            while not stop.is_set():
                try:
                    ok.append(task.delay(f"k{i % 200}", i).id)
                except DebounceBackendError:
                    time.sleep(0.05)
                i += 1
                time.sleep(0.002)

        producer = threading.Thread(target=produce)
        producer.start()
        runs = redis.Redis.from_url(f"{broker.url}/2")
        try:
            # a backlog of published windows, so runs go on while the windows' Redis is down
            wait_until(
                lambda: (
                    runs.llen("runs") > 30
                    and redis.Redis.from_url(f"{broker.url}/1").llen("celery") > 20
                ),
                30,
            )
            windows.stop()  # SIGTERM: AOF flushed, the records survive the restart
            ran_before = runs.llen("runs")
            wait_until(lambda: runs.llen("runs") > ran_before + 10, 30)  # runs while it is down
            windows.start()
            done = len(ok)
            wait_until(lambda: len(ok) > done + 100, 30)
        finally:
            stop.set()
            producer.join(20)
        assert not producer.is_alive(), "a producer call hung"
        client = redis.Redis.from_url(f"{windows.url}/0")

        def unfinished() -> dict[str, str]:
            out = {}
            for key in client.scan_iter("debounce:{0}:win:*"):
                state = client.hget(key, "st")
                if state != b"finished":
                    out[key.decode()] = (state or b"-").decode()
            return out

        # every window produced runs, and every record of a run ends finished
        wait_until(lambda: not client.zcard("debounce:{0}:due"), 30)
        wait_until(lambda: not unfinished(), 40)
        ran = {r.decode() for r in runs.lrange("runs", 0, -1)}
        states = {tid: client.hget(f"debounce:{{0}}:win:{tid}", "st") for tid in ran}
        assert set(states.values()) == {b"finished"}, states
        text = log.read_text()
        assert "could not mark" in text  # marks did fail during the outage ...
        assert "window mark(s) kept during a Redis outage" in text  # ... and were sent later
    finally:
        if proc is not None:
            stop_process(proc)
        windows.cleanup()
        broker.cleanup()


@pytest.mark.redis_only("an unreachable Redis, and a refusal that is Redis's NOPERM")
def test_kept_marks_are_bounded_and_refusals_are_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery_debounce.settings import Settings
    from celery_debounce.store import WindowStore
    from celery_debounce.testing.servers import free_port
    from celery_debounce.worker import retry_queue as marks

    app = build(f"redis://127.0.0.1:{free_port()}", "redis://127.0.0.1:1")  # nobody listens
    backend = WindowStore(Settings.from_app(app))
    monkeypatch.setattr(marks, "MAX_PENDING", 5)
    monkeypatch.setattr(marks, "FIRST_DELAY", 30.0)  # the retry thread stays asleep
    with pytest.raises(DebounceBackendError) as down:
        backend.claim(0, "x")
    marks._pending.clear()
    marks._state["dropped"] = 0
    try:
        for i in range(8):
            marks.keep(backend, marks.ClaimMark(0, f"id{i}", "t", False), down.value)
        assert marks.pending() == 5
        assert [m.mark.task_id for m in marks._pending] == [f"id{i}" for i in range(3, 8)]
        assert marks._state["dropped"] == 3  # and logged (at the 1st, 10th, 100th ...)
        refused = DebounceBackendError("refused")
        refused.__cause__ = redis.ResponseError("NOPERM")
        marks.keep(backend, marks.ClaimMark(0, "no", "t", False), refused)
        assert marks.pending() == 5
        assert marks.flush() is False  # still unreachable: all kept, in order
        assert marks.pending() == 5
    finally:
        marks._pending.clear()
        # its retry thread sleeps the patched 30 s; the next keep() starts a fresh one
        # (the sleeper then finds nothing to send and exits)
        marks._state["thread"] = None


def test_aliases_of_a_finish_sent_after_an_outage_get_the_runs_result(
    redis_server: str, store: StoreCase
) -> None:
    """A caller-chosen id that joined a window is an alias; when the window's finish is
    kept during an outage and sent later, the alias still gets the run's result."""
    from celery import Celery
    from helpers import make_app, running_worker

    from celery_debounce import Dispatcher
    from celery_debounce.testing.postgres import LocalPostgres
    from celery_debounce.worker import retry_queue as marks

    windows: LocalRedis | LocalPostgres
    if store.name == "postgres":  # a server of its own, stopped and started again
        from celery_debounce.store.postgres import PostgresStore

        windows = LocalPostgres(settings={"synchronous_commit": "on"}).start()
        with PostgresStore(windows.url()) as made:
            made.migrate()
        conf = {"debounce_store_url": windows.url(), "debounce_redis_url": None}
    else:
        windows = LocalRedis(appendonly=True).start()
        conf = {"debounce_redis_url": f"{windows.url}/0"}
    marks._pending.clear()  # another test's kept marks (the queue is per process)
    try:
        app: Celery = make_app(redis_server, debounce_dispatcher=False, **conf)

        @debounced(
            app,
            name="marks.alias",
            debounce="50ms",
            debounce_max_wait="5s",
            debounce_key="{0}",
        )
        def work(key: str) -> str:
            return f"ran {key}"

        first = work.delay("a")
        joined = work.apply_async(("a",), task_id="callers-own-id")
        assert joined.id == first.id  # the call returns the window's id ...
        dispatcher = Dispatcher(app, name="before-the-outage")
        wait_until(lambda: dispatcher.dispatch_once()[0] == 1, 5)
        windows.stop()  # Redis: SIGTERM, the AOF keeps the record and its alias
        with running_worker(app):
            assert first.get(timeout=20) == "ran a"  # ran while the windows' Redis is down
            wait_until(lambda: marks.pending() >= 2, 20)  # its claim and finish were kept
            if isinstance(windows, LocalPostgres):
                windows._launch(30.0)  # on the same data and port (restart's second half)
            else:
                windows.start()
            # ... and its own id gets the run's result once the kept finish is sent
            assert app.AsyncResult("callers-own-id").get(timeout=20) == "ran a"
    finally:
        windows.cleanup()
