"""A claim lease's budget: a claim is lost only when its worker cannot reach the store
for the whole lease (docs/configuration.md, "Claim lease").

Over both stores: a refused link, the claim's life seen through the store (a second
delivery's claim). Redis only, and read raw: a claim's lease end (its score in the
claims set), which no store read returns; the claims the renewal tests plant; the
exclusive app's run log; a silent link and a lost reply (the Redis fault proxy).

The worker's link to the windows' Redis goes through a proxy that goes silent
(tests/fault_proxy.py ``silence``: bytes swallowed both ways, nothing refused); the
dispatcher and the test reach Redis directly.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pytest
import redis
from celery import Celery
from fault_proxy import FaultProxy, evalsha_of
from helpers import StoreCase, debounced, make_app, running_worker, wait_until
from reads import counters, held_count, state_of

from celery_debounce import DebounceAdmin, DebouncedTask, DebounceOutcomeUnknown
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.errors import DebounceBackendError
from celery_debounce.store import store_for
from celery_debounce.store.domain import Released
from celery_debounce.store.redis.keys import claims_key
from celery_debounce.worker.leases import RETRY_MAX_S

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("store")]

#: A timeout at which redis-py's own retry (a second timeout, connecting again) made
#: a renewal that failed end past the first third of the lease, so that the next
#: attempt, a period later, came after the lease.
LEASE, TIMEOUT = 6.0, 1.2
#: The silent link a claim survives wherever it falls (docs/configuration.md): the
#: last renewal may be a period (a third of the lease) old when it starts, and once
#: it ends an attempt starts within one timeout and one back-off.
BUDGET = LEASE * 2 / 3 - TIMEOUT - RETRY_MAX_S
CLAIMS = "debounce:{0}:claims"


def now_ms(client: redis.Redis) -> int:
    secs, micros = client.time()
    return int(secs) * 1000 + int(micros) // 1000


def exclusive_app(redis_server: str, windows_url: str, **conf: Any) -> Celery:
    """An app whose windows are at ``windows_url`` (broker and results direct), with an
    exclusive task that records its start and end (Redis time) in ``runs:<key>`` and
    runs until ``go:<key>`` exists."""
    app = make_app(
        redis_server,
        name="lease_budget",
        debounce_redis_url=windows_url,
        debounce_claim_lease=LEASE,
        debounce_redis_timeout=TIMEOUT,
        debounce_dispatcher=False,
        task_ignore_result=True,
        **conf,
    )

    @debounced(
        app,
        name="lease.exclusive",
        bind=True,
        shared=False,
        debounce="100ms",
        debounce_key="x:{0}",
        debounce_max_wait="1s",
        debounce_exclusive=True,
    )
    def exclusive(self: DebouncedTask, key: str, n: int = 0) -> int:
        client = redis.Redis.from_url(f"{redis_server}/0", socket_timeout=5)
        client.rpush(f"runs:{key}", f"start {self.request.id} {now_ms(client)}")
        deadline = time.monotonic() + 30
        while n == 0 and not client.exists(f"go:{key}") and time.monotonic() < deadline:
            time.sleep(0.02)
        client.rpush(f"runs:{key}", f"end {self.request.id} {now_ms(client)}")
        client.close()
        return n

    return app


@pytest.fixture
def dispatcher(redis_server: str, redis_client: redis.Redis) -> Iterator[Celery]:
    """The calling and dispatching side, on a direct link: its app, dispatching."""
    app = exclusive_app(redis_server, f"{redis_server}/0")
    running = Dispatcher(app, name="direct")
    running.start()
    try:
        yield app
    finally:
        running.stop()


def runs(client: redis.Redis, key: str) -> list[list[str]]:
    return [r.decode().split() for r in client.lrange(f"runs:{key}", 0, -1)]


@pytest.mark.redis_only("a silent link (the Redis fault proxy) and the claims set read raw")
def test_a_claim_survives_a_silent_link_as_long_as_its_budget(
    redis_server: str,
    redis_client: redis.Redis,
    fault_proxy: FaultProxy,
    dispatcher: Celery,
) -> None:
    """An exclusive run whose worker's link goes silent for the budget (2.3 s of a 6 s
    lease, 1.2 s timeout) at the worst moment, just before a renewal is due: its claim never
    expires (watched throughout), the run goes on past the lease, and the burst during
    it gives one follow-up, which starts after the run ended; each body runs once."""
    worker_app = exclusive_app(redis_server, f"{fault_proxy.url}/0")
    task = dispatcher.tasks["lease.exclusive"]
    with running_worker(worker_app, pool="threads", concurrency=2):
        first = task.delay("e")
        wait_until(lambda: runs(redis_client, "e"), 15)
        score = wait_until(lambda: redis_client.zscore(CLAIMS, first.id), 5)
        follow = task.delay("e", 1)
        wait_until(lambda: held_count(dispatcher), 5)  # held behind it
        # a renewal went through (the score moved): the next is due a period later
        wait_until(lambda: (redis_client.zscore(CLAIMS, first.id) or 0) > score, LEASE)
        renewed = time.monotonic()
        time.sleep(max(0.0, renewed + LEASE / 3 - 0.2 - time.monotonic()))
        fault_proxy.silence(BUDGET)
        silent_until = time.monotonic() + BUDGET
        lowest = float("inf")  # the claim's least time left (ms), watched from here
        # past the end of the lease the last renewal before the silence gave
        while time.monotonic() < renewed + LEASE + 1.0:
            expiry = redis_client.zscore(CLAIMS, first.id)
            assert expiry is not None, "the claim was released as stale"
            lowest = min(lowest, expiry - now_ms(redis_client))
            time.sleep(0.02)
        assert time.monotonic() > silent_until
        assert lowest > 0, f"the claim expired ({lowest:.0f} ms)"
        assert [e[:2] for e in runs(redis_client, "e")] == [["start", first.id]]
        redis_client.set("go:e", 1)  # Redis only: the exclusive app's flag: the run ends
        wait_until(lambda: len(runs(redis_client, "e")) == 4, 15)
        time.sleep(0.5)  # nothing more runs
    events = runs(redis_client, "e")
    assert [e[:2] for e in events] == [
        ["start", first.id],
        ["end", first.id],
        ["start", follow.id],
        ["end", follow.id],
    ]
    assert int(events[2][2]) >= int(events[1][2])  # the follow-up started after the run
    assert not counters(dispatcher).get("d|lease.exclusive")  # no duplicate


@pytest.mark.redis_only("redis-py's retry and connection; a claim planted in the claims set")
def test_a_failed_renewal_costs_one_timeout_not_two(
    redis_server: str,
    redis_client: redis.Redis,
    fault_proxy: FaultProxy,
) -> None:
    """A renewal on a silent link fails after one ``debounce_redis_timeout``, on its kept
    connection, on a new one, and connecting where nothing answers: it is sent without
    redis-py's retry (which waited for a second timeout, sending or connecting again)."""
    app = make_app(
        redis_server, debounce_redis_url=f"{fault_proxy.url}/0", debounce_redis_timeout=1.0
    )
    store = store_for(app)
    claims = claims_key(store.tag(0))
    redis_client.zadd(claims, {"t1": now_ms(redis_client) + 60_000})
    store.renew_claims({0: ["t1"]})  # connected, and the script loaded
    fault_proxy.silence(10)
    for attempt in ("on its connection", "connecting again"):
        started = time.monotonic()
        with pytest.raises(DebounceBackendError):
            store.renew_claims({0: ["t1"]})
        assert 1.0 <= time.monotonic() - started < 1.8, attempt
    with blackhole() as port:  # a connection that never completes (SYN dropped)
        app = make_app(
            redis_server,
            debounce_redis_url=f"redis://127.0.0.1:{port}/0",
            debounce_redis_timeout=1.0,
        )
        unreachable = store_for(app)
        started = time.monotonic()
        with pytest.raises(DebounceBackendError):
            unreachable.renew_claims({0: ["t1"]})
        assert 1.0 <= time.monotonic() - started < 1.8, "connecting"


@contextmanager
def blackhole() -> Iterator[int]:
    """A port whose listener never accepts and whose accept queue is full: the kernel
    drops a new connection's SYN, so connecting waits for its timeout."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    queued = []
    for _ in range(3):
        sock = socket.socket()
        sock.setblocking(False)
        with suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        queued.append(sock)
    try:
        yield port
    finally:
        for sock in queued:
            sock.close()
        listener.close()


@contextmanager
def _renewed_claim(
    redis_server: str,
    redis_client: redis.Redis,
    fault_proxy: FaultProxy,
    timeout: float,
    lease: float,
    first: float,
) -> Iterator[tuple[str, float]]:
    """A claim (``t1``) a fresh renewer holds through ``fault_proxy``: ``(its claims
    key, the monotonic time its first renewal was seen, within ``first`` seconds)``."""
    from celery_debounce.worker.leases import _Renewer

    app = make_app(
        redis_server,
        debounce_redis_url=f"{fault_proxy.url}/0",
        debounce_redis_timeout=timeout,
        debounce_claim_lease=lease,
    )
    store = store_for(app)
    claims = claims_key(store.tag(0))
    redis_client.zadd(claims, {"t1": now_ms(redis_client) + int(lease * 1000)})
    renewer = _Renewer()
    renewer.hold(store, 0, "t1")
    try:
        score = redis_client.zscore(claims, "t1")
        wait_until(lambda: redis_client.zscore(claims, "t1") != score, first)  # renewed
        yield claims, time.monotonic()
    finally:
        fault_proxy.disarm()
        renewer.drop(store, 0, "t1")


def _least_time_left(
    redis_client: redis.Redis, claims: str, until: float, tick: Any = None
) -> float:
    """The claim's least time left (ms), watched every 20 ms until monotonic ``until``
    (``tick()`` called each time); it must exist throughout."""
    lowest = float("inf")
    while time.monotonic() < until:
        if tick is not None:
            tick()
        expiry = redis_client.zscore(claims, "t1")
        assert expiry is not None
        lowest = min(lowest, expiry - now_ms(redis_client))
        time.sleep(0.02)
    return lowest


@pytest.mark.redis_only(
    "the lease end read in the claims set every 20 ms (over both stores, seen through the "
    "store: test_a_claim_outlives_a_link_refused_for_half_its_lease)"
)
def test_a_refused_renewal_is_tried_again_within_the_lease(
    redis_server: str,
    redis_client: redis.Redis,
    fault_proxy: FaultProxy,
) -> None:
    """A renewal that failed is tried again within a back-off, not a period later: with
    a 3 s lease (renewal every 1 s), a link refused for 1.6 s from just before a renewal
    was due (the next one falls in it too) loses nothing."""
    with _renewed_claim(redis_server, redis_client, fault_proxy, 1.0, 3, 3) as (claims, renewed):
        time.sleep(max(0.0, renewed + 1.0 - 0.1 - time.monotonic()))
        fault_proxy.refuse()

        def back_after_2_5_s() -> None:
            if time.monotonic() > renewed + 2.5:
                fault_proxy.disarm()

        lowest = _least_time_left(redis_client, claims, renewed + 3.5, back_after_2_5_s)
        assert lowest > 0, f"the claim expired ({lowest:.0f} ms)"


@pytest.mark.redis_only("a silent link (the Redis fault proxy) and the claims set read raw")
def test_a_failed_renewal_is_tried_again_at_once_not_a_period_later(
    redis_server: str,
    redis_client: redis.Redis,
    fault_proxy: FaultProxy,
) -> None:
    """A 6 s lease (renewal every 2 s), a 0.5 s timeout, and a link silent for 2.8 s from
    just before a renewal was due, past the next one's timeout: tried again a period
    after the failure, the renewal would come a second after the lease ended; tried
    again at once (each attempt a timeout, then a short back-off), it lands within it."""
    with _renewed_claim(redis_server, redis_client, fault_proxy, 0.5, 6, 4) as (claims, renewed):
        time.sleep(max(0.0, renewed + 2.0 - 0.2 - time.monotonic()))
        fault_proxy.silence(2.8)
        lowest = _least_time_left(redis_client, claims, renewed + 6.5)
        assert lowest > 0, f"the claim expired ({lowest:.0f} ms)"


@pytest.mark.redis_only("the Redis transport's renewal link and its lock")
def test_a_forked_child_renews_on_a_connection_of_its_own(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    """A process forked while its renewal thread was sending (the renewal link's lock
    held) renews in the child on a new connection, instead of waiting for that lock
    forever."""
    import os

    app = make_app(redis_server)
    store = store_for(app)
    claims = claims_key(store.tag(0))
    redis_client.zadd(claims, {"t1": 1})
    store.renew_claims({0: ["t1"]})
    link = store.transport.__dict__["_renewal"]
    with link.lock:  # the parent's renewal thread mid-send
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            redis_client.zadd(claims, {"t1": 1})
            store.renew_claims({0: ["t1"]})
            os._exit(0)
    deadline = time.monotonic() + 10
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the child's renewal waited for the parent's lock")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert (redis_client.zscore(claims, "t1") or 0) > now_ms(redis_client)


@contextmanager
def _link_to(
    store: StoreCase, request: pytest.FixtureRequest
) -> Iterator[tuple[dict[str, Any], Callable[[], None], Callable[[], None]]]:
    """The settings that put an app's windows in ``store`` behind a proxy (a 1 s call
    timeout), and the proxy's ``refuse`` (every connection closed, new ones too) and
    ``disarm``."""
    if store.name == "redis":
        proxy: Any = request.getfixturevalue("fault_proxy")
        conf = {"debounce_redis_url": f"{proxy.url}/0", "debounce_redis_timeout": 1.0}
        yield conf, proxy.refuse, proxy.disarm
        return
    from pg_proxy import PgProxy

    server = request.getfixturevalue("postgres_server")
    proxy = PgProxy(server.port)
    url = store.conf["debounce_store_url"].replace(f":{server.port}/", f":{proxy.port}/")
    try:
        conf = {**store.conf, "debounce_store_url": url, "debounce_postgres_timeout": 1.0}
        yield conf, proxy.refuse, proxy.disarm
    finally:
        proxy.close()


def test_a_claim_outlives_a_link_refused_for_half_its_lease(
    redis_server: str,
    store: StoreCase,
    app_factory: Callable[..., Celery],
    request: pytest.FixtureRequest,
) -> None:
    """A run's claim (3 s lease, renewed every second) held by a renewer whose link to
    the store is refused for 1.6 s from just before its first renewal: the renewal is
    tried again within the lease and lands once the link is back, so past the end of
    the lease the claim gave, a second delivery of the run is a duplicate."""
    from celery_debounce.worker.leases import _Renewer

    direct = app_factory(debounce_claim_lease=3)

    @debounced(direct, name="lease.held", debounce="1h", debounce_key="k", debounce_max_wait="2h")
    def held() -> None: ...

    task_id = held.delay().id
    DebounceAdmin(direct).flush("lease.held", "k")
    with _link_to(store, request) as (conf, refuse, disarm):
        linked = store_for(make_app(redis_server, debounce_claim_lease=3, **conf))
        assert linked.claim(0, task_id, "lease.held") == ("dispatching", True)
        claimed = time.monotonic()
        renewer = _Renewer()
        renewer.hold(linked, 0, task_id)
        try:
            time.sleep(max(0.0, claimed + 0.9 - time.monotonic()))
            refuse()
            time.sleep(max(0.0, claimed + 2.5 - time.monotonic()))
            disarm()
            time.sleep(max(0.0, claimed + 3.5 - time.monotonic()))
            assert state_of(direct, task_id) == "claimed"
            # past the end of the lease the claim gave: only a renewal kept it live
            assert store_for(direct).claim(0, task_id, "lease.held") == ("claimed", False)
        finally:
            renewer.drop(linked, 0, task_id)


# -- a lost reply of release.lua ---------------------------------------------------------


@pytest.mark.redis_only(
    "a lost release.lua reply; the record's publish failures (fl), which no store read returns"
)
def test_a_release_whose_reply_is_lost_counts_its_failure_once(
    redis_server: str,
    redis_client: redis.Redis,
    fault_proxy: FaultProxy,
) -> None:
    """``release.lua`` with ``<tries>!`` counts a publish failure against the window (its
    ``fl``, which ``MAX_TRIES`` quarantines at). Its reply lost after it ran: it is not
    sent again (redis-py's retry ran it twice, counting one failure as two); the caller
    learns the outcome is unknown, the window is released or stays leased, taken again
    either way."""
    app = make_app(redis_server, debounce_redis_url=f"{fault_proxy.url}/0")

    @debounced(
        app,
        name="lease.released",
        debounce="1ms",
        debounce_key="r",
        debounce_max_wait="1s",
    )
    def released() -> None: ...

    store = store_for(app)
    released.delay()
    window = wait_until(lambda: store.take(0, 10).windows, 5)[0]
    assert store.release(0, 5000, [Released("not-leased", 1, True)]) == 0  # script loaded
    fault_proxy.arm("drop", evalsha_of(store.scripts["release"].sha))
    lost: Exception | None = None
    try:
        store.release(0, 5000, [Released(window.task_id, window.tries, True)])
    except DebounceBackendError as exc:
        lost = exc
    assert fault_proxy.fired == 1
    # Redis only: no store read returns a window's publish failures
    record = redis_client.hgetall(f"debounce:{{0}}:win:{window.task_id}")
    assert record.get(b"fl") == b"1"  # ran once, counted once
    assert isinstance(lost, DebounceOutcomeUnknown), lost


@pytest.mark.sentinel
@pytest.mark.redis_only("Sentinel")
def test_a_renewal_reaches_sentinels_master_on_its_own_connection(
    redis_server: str,
) -> None:
    """The renewer's own connection is built from the store's pool: through Sentinel it
    finds the master as the pool's connections do."""
    from celery_debounce.testing.servers import LocalSentinels

    with LocalSentinels(replicas=1) as group:
        app = make_app(
            redis_server,
            debounce_redis_url=group.url,
            debounce_redis_timeout=1.0,
            debounce_redis_sentinel_master=group.master_name,
        )
        store = store_for(app)
        master = redis.Redis(port=group.master_port())
        claims = claims_key(store.tag(0))
        master.zadd(claims, {"t1": 1})
        store.renew_claims({0: ["t1"]})
        assert (master.zscore(claims, "t1") or 0) > now_ms(master)
