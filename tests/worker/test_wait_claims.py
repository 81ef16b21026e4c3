"""``debounce_redis_wait_replicas`` and a worker's marks: a claim too few replicas
acknowledged does not run now (its delivery goes through the broker again, the run is
delayed, never lost or doubled); a finish too few acknowledged is sent again.

Real servers (a primary and a replica, SIGSTOPped so that ``WAIT`` gets no
acknowledgement), a real in-process worker with its dispatcher. The Sentinel failover
this protects against is measured in tests/store/redis/test_sentinel.py.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from helpers import debounced, make_app, running_worker, wait_until
from reads import open_window, state_of, taken_record

from celery_debounce.testing.servers import LocalRedis
from celery_debounce.worker import retry_queue as marks

pytestmark = [
    pytest.mark.usefixtures("store"),
    pytest.mark.redis_only(
        "Redis replicas and WAIT, claim.lua's ident after a failover, unclaim.lua and the "
        "claims set (the PostgreSQL store has no replicas to wait for: claim_late is claim)"
    ),
]


@pytest.fixture
def replica(redis_server: str) -> Iterator[LocalRedis]:
    port = int(redis_server.rsplit(":", 1)[1])
    with LocalRedis("--replicaof", "127.0.0.1", str(port)) as server:
        client = redis.Redis(port=server.port)
        wait_until(lambda: client.info("replication")["master_link_status"] == "up", timeout=15)
        # and the master counts its acknowledgements (WAIT answers 1), before any call
        master = redis.Redis(port=port)
        wait_until(lambda: master.wait(1, 1000) >= 1, timeout=15)
        try:
            yield server
        finally:
            if server.process is not None:
                server.process.send_signal(signal.SIGCONT)


def _pause(server: LocalRedis) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)


def _resume(server: LocalRedis) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGCONT)


class _Deferrals(logging.Handler):
    """Counts the worker's "delivered again" lines (a claim WAIT refused)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.logger = logging.getLogger("celery_debounce.worker")

    def emit(self, record: logging.LogRecord) -> None:
        if "delivered again" in record.getMessage():
            self.count += 1

    def __enter__(self) -> _Deferrals:
        self.logger.addHandler(self)
        self.level_before = self.logger.level
        self.logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *_: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)


def _open_id(app: Any, task: str) -> str | None:
    """The id of the open window of ``task`` under key ``k``, read through the store."""
    record = open_window(app, task, "k")
    return None if record is None else record.task_id


@pytest.mark.parametrize("acks_late", [False, True])
def test_a_claim_too_few_replicas_acknowledged_is_delayed_not_lost_or_doubled(
    redis_client: redis.Redis,
    redis_server: str,
    replica: LocalRedis,
    acks_late: bool,
) -> None:
    app = make_app(
        redis_server,
        debounce_redis_wait_replicas=1,
        debounce_redis_timeout=2.0,
        task_acks_late=acks_late,
    )
    runs: list[int] = []

    @debounced(
        app,
        name="wc.delayed",
        debounce="1s",
        debounce_key="k",
        debounce_max_wait="2s",
    )
    def work(n: int) -> int:
        runs.append(n)
        return n

    deferred = _Deferrals()
    with running_worker(app), deferred:
        result = work.delay(7)  # accepted: the replica acknowledged it
        record = f"debounce:{{0}}:win:{result.id}"
        _pause(replica)
        # stopped before the window was taken (else its claim was acknowledged)
        assert _open_id(app, "wc.delayed") == result.id
        try:
            # taken and published (not waited for), delivered, claimed, refused by WAIT,
            # undone and sent through the broker again, each time while it lasts
            wait_until(lambda: deferred.count >= 3, timeout=20)
            assert runs == []
            assert state_of(app, result.id) in ("queued", "dispatching")
            # Redis only: no store read lists the claims set
            assert redis_client.zscore("debounce:{0}:claims", result.id) is None
        finally:
            _resume(replica)
        assert result.get(timeout=15) == 7
        wait_until(lambda: state_of(app, result.id) == "finished", timeout=10)
        # no second run: no delivery is left (the one that ran finished the window)
        stop = threading.Event()
        stop.wait(1.5)
    assert runs == [7]
    assert redis.Redis(port=replica.port).hget(record, "st") == b"finished"


def test_a_finish_too_few_replicas_acknowledged_is_sent_again(
    redis_client: redis.Redis,
    redis_server: str,
    replica: LocalRedis,
) -> None:
    """The body ran once: its outcome is stored at once (every caller gets it) and the
    finish, refused by WAIT, is kept and sent again until the replica acknowledges it,
    so a failover to that replica cannot forget the run and run it again."""
    app = make_app(redis_server, debounce_redis_wait_replicas=1, debounce_redis_timeout=2.0)
    runs: list[int] = []

    @debounced(app, debounce="100ms", debounce_key="k", debounce_max_wait="1s")
    def work(n: int) -> int:
        runs.append(n)
        _pause(replica)  # claimed and acknowledged; its finish is not
        return n

    replica_client = redis.Redis(port=replica.port)
    # the marks this process kept for a store another test stopped for good are not
    # this test's (the queue is per process, and test files share one under xdist)
    marks._pending.clear()
    with running_worker(app):
        try:
            result = work.delay(3)
            assert result.get(timeout=15) == 3
            record = f"debounce:{{0}}:win:{result.id}"
            # on the master: the outcome is stored before the finish is sent (a race)
            wait_until(lambda: state_of(app, result.id) == "finished", timeout=15)
            wait_until(lambda: marks.pending() == 1, timeout=15)
        finally:
            _resume(replica)
        wait_until(lambda: marks.pending() == 0, timeout=15)
        assert replica_client.hget(record, "st") == b"finished"
    assert runs == [3]


def test_without_wait_replicas_a_claim_sends_no_wait(
    redis_client: redis.Redis,
    redis_server: str,
    replica: LocalRedis,
) -> None:
    """Nothing changes for users who did not opt in: no WAIT, no ident header."""
    app = make_app(redis_server)
    seen: dict[str, Any] = {}

    @debounced(
        app,
        debounce="100ms",
        debounce_key="k",
        debounce_max_wait="1s",
        bind=True,
    )
    def work(self: Any, n: int) -> int:
        seen.update(self.request.headers or {})
        return n

    with running_worker(app):
        redis_client.config_resetstat()  # Redis only: the commands it was sent
        assert work.delay(1).get(timeout=10) == 1
    assert "cmdstat_wait" not in redis_client.info("commandstats")
    assert "debounce_ident" not in seen and "debounce_tag" in seen


def test_a_delivery_whose_window_is_still_open_here_is_skipped(
    redis_client: redis.Redis,
    redis_server: str,
    replica: LocalRedis,
) -> None:
    """A failover lost the take of a window (the old master took, published and claimed
    it): on the promoted master the window is still open under its id and has no
    record. The delivery names the window's ident (``debounce_ident``): it is skipped
    (``pending``), as this master's dispatcher publishes the window; without the
    window open under that id it runs as before."""
    from celery_debounce.store import store_for

    app = make_app(redis_server, debounce_redis_wait_replicas=1)

    @debounced(
        app,
        name="wc.work",
        debounce="1h",
        debounce_key="k",
        debounce_max_wait="1h",
    )
    def work() -> None:
        pass

    result = work.delay()  # open, not taken (no dispatcher runs)
    store = store_for(app)
    ident = "7:wc.work:k"
    assert _open_id(app, "wc.work") == result.id
    assert store.claim(0, result.id, "wc.work", False, ident) == ("pending", False)
    assert taken_record(app, result.id) is None
    assert store.claim(0, "other-id", "wc.work", False, ident) == ("", True)
    assert store.claim(0, result.id, "wc.work", False, "") == ("", True)


def test_unclaim_undoes_only_the_claim_it_names(
    redis_client: redis.Redis,
    redis_server: str,
) -> None:
    """``unclaim.lua``: the record back to its state before, out of the claims set, but
    only while the record's claim is the one of that time (``ca``): a later claim (another
    delivery) is left alone."""
    from celery_debounce import DebounceAdmin
    from celery_debounce.store import store_for

    app = make_app(redis_server)

    @debounced(
        app,
        name="wc.un",
        debounce="1h",
        debounce_key="k",
        debounce_max_wait="1h",
    )
    def work() -> None:
        pass

    task_id = work.delay().id
    DebounceAdmin(app).flush("wc.un", "k")
    store = store_for(app)
    keys = store._record_keys(0, task_id)
    before, at, run = store.run_once("claim", keys, store._claim_args(task_id, "wc.un", False))
    assert (before, int(run)) == (b"dispatching", 1)
    assert store.run_once("unclaim", keys, [task_id, int(at) - 1, "dispatching"]) == 0
    assert state_of(app, task_id) == "claimed"
    # Redis only: no store read lists the claims set
    assert redis_client.zscore("debounce:{0}:claims", task_id) is not None
    assert store.run_once("unclaim", keys, [task_id, int(at), "dispatching"]) == 1
    assert state_of(app, task_id) == "dispatching"
    # Redis only: no store read lists the claims set
    assert redis_client.zscore("debounce:{0}:claims", task_id) is None
    # the next delivery claims it and runs
    assert store.claim(0, task_id, "wc.un") == ("dispatching", True)


@pytest.mark.parametrize("acks_late", ["0", "1"])
def test_a_refused_claim_in_a_prefork_child_is_delayed_not_lost_or_doubled(
    redis_client: redis.Redis,
    redis_server: str,
    replica: LocalRedis,
    tmp_path: Any,
    acks_late: str,
) -> None:
    """As above, in a prefork worker process (the copy is sent from the pool child, as a
    retry is), with the fault tests' 2 s broker visibility (a held copy may also come
    back from the broker: at most one delivery runs)."""
    from fault_app import build
    from test_faults import runs, worker_process

    app = build(redis_server, debounce_redis_wait_replicas=1)
    log = tmp_path / "w.log"
    env = {"FAULT_WAIT_REPLICAS": "1", "FAULT_ACKS_LATE": acks_late}
    with worker_process(redis_server, log, extra_env=env, pool="prefork"):
        # the window waits 200 ms: the replica must be stopped before it is taken (else
        # its claim is acknowledged and it runs at once); a loaded machine may be slower,
        # then the next key tries again
        for attempt in range(5):
            key = f"wp{attempt}"
            call = app.tasks["faults.record"].delay(key)
            _pause(replica)
            if open_window(app, "faults.record", f"k:{key}") is not None:
                break
            _resume(replica)
        else:
            pytest.fail("the window was taken before the replica stopped, five times")
        try:
            wait_until(lambda: log.read_text().count("delivered again") >= 3, 30)
            assert runs(redis_client, key) == []
        finally:
            _resume(replica)
        wait_until(lambda: state_of(app, call.id) == "finished", 20)
        # every copy still in flight is delivered and skipped (or was): none runs
        settled = threading.Event()
        settled.wait(6.0)
    assert runs(redis_client, key) == [call.id]


def test_a_kept_claim_is_sent_without_wait_and_only_the_waited_store_waits(
    redis_client: redis.Redis,
    redis_server: str,
) -> None:
    """With ``debounce_redis_wait_replicas`` the store is a ``WaitedStore``: a claim no
    replica acknowledged (here there is none) is undone and raised, but a claim kept
    during an outage (its run went ahead) is sent by ``claim_late`` without ``WAIT``,
    and stays: sent again it would find its own first copy live. Without the setting
    the store is the plain one (nothing waited for on its path)."""
    from celery_debounce import DebounceAdmin
    from celery_debounce.settings import settings_for
    from celery_debounce.store import NotReplicated, WaitedStore, WindowStore, store_for

    app = make_app(redis_server)  # the call itself is not waited for

    @debounced(
        app,
        name="wc.late",
        debounce="1h",
        debounce_key="k",
        debounce_max_wait="1h",
    )
    def work() -> None:
        pass

    task_id = work.delay().id
    DebounceAdmin(app).flush("wc.late", "k")
    assert type(store_for(app)) is WindowStore
    store = WindowStore(
        settings_for(
            make_app(redis_server, debounce_redis_wait_replicas=1, debounce_redis_timeout=1.0)
        )
    )
    assert type(store) is WaitedStore
    with pytest.raises(NotReplicated):
        store.claim(0, task_id, "wc.late")
    assert state_of(app, task_id) == "dispatching"  # undone
    assert store.claim_late(0, task_id, "wc.late") == ("dispatching", True)
    assert state_of(app, task_id) == "claimed"  # kept, not undone
    # Redis only: no store read lists the claims set
    assert redis_client.zscore("debounce:{0}:claims", task_id) is not None
