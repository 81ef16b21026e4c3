"""Issue 19, item 3: every script that changes windows is sent at most once per call.

Each non-idempotent operation (the gate in its plain, collect, leading+trailing and
capped forms and with WAIT, a bulk chunk with and without WAIT, cancel, flush, flush
of many, take, claim, finish, quarantine, release, unclaim) runs through the fault proxy
(tests/fault_proxy.py) under each fault: the reply lost after the command ran
(``drop``), a server that never answers (``stall``), a server that stops reading
mid-command (``stall-write``: a gate call or bulk chunk then carries a few MB, so its
write times out), an error reply (``error``: OOM;
``error-readonly``, ``error-noperm``, ``error-loading``), NOSCRIPT (``noscript``: it did
not run, sent again once loaded),
every connection refused (``refuse``). Every case checks, from Redis: the operation's
effect happened at most once (exactly once after NOSCRIPT, never after an error reply
or a refusal); the caller has its answer in seconds; an error is a
DebounceBackendError, and one whose command may have run says that its outcome is
unknown (DebounceOutcomeUnknown). Cancel and bulk chunks learn their outcome after a
lost reply (cancel's per-call token, the chunk's marker): they may succeed, once.
The gate cases (alone, then WAIT, a bulk chunk with and without WAIT) also run on a
real Redis Cluster, a proxy in front of each node, under the lost reply, the silent
server and the stopped read.

Before the fix, a lost reply made ``_evalsha`` hand the command to redis-py again: a
collect call was stored twice, a leading+trailing call of one ran twice, one call
closed a ``max_calls=2`` window, cancel deleted the window then raised WindowNotFound
(its result never revoked), flush flushed then raised WindowNotFound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import redis
from celery import Celery
from fault_proxy import FAULTS, FaultProxy, command, evalsha_of
from helpers import debounced, make_app, wait_until
from reads import open_count, open_records, taken_count
from redis.crc import key_slot

from celery_debounce import (
    DebounceAdmin,
    DebounceBackendError,
    DebounceOutcomeUnknown,
    enqueue_many,
)
from celery_debounce.producer.many import DebounceBulkError
from celery_debounce.store import chunks as chunking
from celery_debounce.store import store_for
from celery_debounce.store.domain import Released
from celery_debounce.store.redis.cluster import ClusterTransport
from celery_debounce.testing.redis_cluster import LocalCluster
from celery_debounce.testing.servers import LocalRedis

pytestmark = [
    pytest.mark.usefixtures("store"),
    pytest.mark.redis_only(
        "faults injected between the client and Redis (the fault proxy), their effect read "
        "raw in Redis (the PostgreSQL store's lost replies: tests/store/postgres)"
    ),
]

TAG = "debounce:{0}"


@dataclass
class Case:
    """One operation: ``setup`` (through the proxy, no fault armed) returns the act;
    ``effect`` counts, in Redis, how many times the operation took effect."""

    script: str
    setup: Callable[[Celery, redis.Redis], Callable[[], Any]]
    effect: Callable[[redis.Redis], int]
    recovers: bool = False  # learns its outcome after a lost reply (may succeed)
    several: bool = False  # several scripts in one write: the others than the one hit run
    waited: bool = False  # with debounce_redis_wait_replicas=1 (each write then WAIT)
    heavy: bool = False  # carries BIG under stall-write: its write times out


def _outgrows_the_buffers() -> int:
    """More bytes than the client's send buffer (at most ``tcp_wmem``'s last figure) and
    the proxy's receive buffer hold: about 3.5 MB on loopback with the default 4 MB."""
    try:
        most = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        most = 4 << 20
    return max(6_000_000, most + 2_000_000)


#: What a heavy case's call carries under ``stall-write``, so its write times out (each
#: such case checks the timeout was the write's).
BIG = "x" * _outgrows_the_buffers()


def _big(app: Celery) -> tuple[str, ...]:
    return (BIG,) if app.conf.get("test_heavy") else ()


def _task(app: Celery, **options: Any) -> Any:
    options = {"debounce": "1h", "debounce_key": "k", "debounce_max_wait": "2h", **options}

    @debounced(app, name="t.work", **options)
    def work(*args: Any) -> None: ...

    return work


def _records(r: redis.Redis) -> list[dict[bytes, bytes]]:
    keys = [*r.scan_iter(match=f"{TAG}:open:*"), *r.scan_iter(match=f"{TAG}:win:*")]
    return [r.hgetall(k) for k in keys]


def _calls(r: redis.Redis) -> int:
    return sum(int(rec.get(b"n", 0)) for rec in _records(r))


def _evalshas(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def _open(app: Celery, **options: Any) -> Any:
    work = _task(app, **options)
    return work, work.delay(0)


def _taken(app: Celery, r: redis.Redis, claimed: bool = False) -> str:
    """A window taken for dispatch (flushed: st dispatching), claimed if asked."""
    work, first = _open(app)
    DebounceAdmin(app).flush(work.name, "k")
    if claimed:
        store_for(app).claim(0, first.id)
    return str(first.id)


def gate_plain(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work = _task(app)
    return lambda: work.delay(1, *_big(app))


def gate_collect(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work = _task(app, debounce_collect=True)
    return lambda: work.delay(1, *_big(app))


def collected(r: redis.Redis) -> int:
    return sum(int(r.llen(k)) for k in r.scan_iter(match=f"{TAG}:calls:*"))


def gate_leading(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work = _task(app, debounce_leading=True, debounce_trailing=True)
    return lambda: work.delay(1, *_big(app))


def windows(r: redis.Redis) -> int:
    return len(_records(r))


def gate_capped(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work = _task(app, debounce_max_calls=2)
    return lambda: work.delay(1, *_big(app))


def _warmed(work: Any) -> bool:
    """One warm-up call written. With ``debounce_redis_wait_replicas`` its ``WAIT`` may
    time out on a loaded machine before the replica acknowledges: that is no fault of
    the act, so it is tried again."""
    try:
        enqueue_many(work, [(("warm",), {})])
    except DebounceBulkError:
        return False
    return True


def bulk(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work = _task(app, debounce_key="{0}")
    wait_until(lambda: _warmed(work), 15)  # the script loaded: the act is its chunk alone

    def act() -> Any:
        # one chunk of 3 calls, however big (its fault is the one injected)
        with mock.patch.object(chunking, "CHUNK_BYTES", 1 << 30):
            return enqueue_many(work, [((i, *_big(app)), {}) for i in range(3)])

    return act


def most_calls(r: redis.Redis) -> int:
    """The most calls a window of the act's keys (0, 1, 2: not the warm-up's) holds."""
    keys = [k for k in r.scan_iter(match=f"{TAG}:open:*") if k[-2:] in (b":0", b":1", b":2")]
    return max([int(r.hget(k, "n") or 0) for k in keys], default=0)


def cancel(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work, first = _open(app)
    admin = DebounceAdmin(app)
    app.conf.test_window_id = first.id

    def act() -> Any:
        info = admin.cancel(work.name, "k")
        # cancelled, so its result is revoked: nobody waits on it
        assert app.AsyncResult(first.id).state == "REVOKED"
        return info

    return act


def cancelled(r: redis.Redis) -> int:
    counted = int(r.hget(f"{TAG}:stats", "x|t.work") or 0)
    gone = not list(r.scan_iter(match=f"{TAG}:open:*"))
    assert counted == int(gone), "the window is gone iff the cancel counted it"
    return counted


def flush(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work, _ = _open(app)
    admin = DebounceAdmin(app)
    return lambda: admin.flush(work.name, "k")


def flushed(r: redis.Redis) -> int:
    return int(r.zcard(f"{TAG}:leased"))


def flush_all(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work = _task(app, debounce_key="{0}")
    work.delay("a")
    work.delay("b")
    admin = DebounceAdmin(app)

    def act() -> Any:
        assert admin.flush_all() == 2  # both flushed, each once

    return act


def flushed_each(r: redis.Redis) -> int:
    # flushing a window twice is impossible to see in Redis (the second finds none):
    # what it would get wrong is the count flush_all returns (checked in act)
    return min(1, int(r.zcard(f"{TAG}:leased")))


def _mark(script: str) -> Callable[[Celery, redis.Redis], Callable[[], Any]]:
    def setup(app: Celery, r: redis.Redis) -> Callable[[], Any]:
        task_id = _taken(app, r, claimed=script == "finish")
        store = store_for(app)
        act = {
            "claim": lambda: store.claim(0, task_id),
            "finish": lambda: store.finish_run(0, task_id, "SUCCESS"),
            "quarantine": lambda: store.quarantine(0, task_id, "injected"),
        }[script]
        r.config_resetstat()
        return act

    return setup


def release(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    """A taken window handed back with its publish failure counted (``failed``, its
    ``fl``): run twice, one failure would count as two (quarantined at ``MAX_TRIES``
    early). Under ``stall-write`` the batch also hands back a window whose id is BIG
    (none such is leased: the script passes it over), so its write times out."""
    work = _task(app, debounce="1ms", debounce_key="r")
    work.delay(0)
    store = store_for(app)
    window = wait_until(lambda: store.take(0, 10).windows, 5)[0]
    windows = [Released(window.task_id, window.tries, True), *(Released(b, 1) for b in _big(app))]
    return lambda: store.release(0, 5000, windows)


def failures(r: redis.Redis) -> int:
    """Publish failures counted against windows (release.lua's ``fl``)."""
    return sum(int(rec.get(b"fl", 0)) for rec in _records(r))


def unclaim(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    """A claimed run put back (``Reject(requeue=True)``: ``put_back``, unclaim.lua). Its
    arguments are three short fields, so no ``stall-write`` makes its write time out:
    there Redis stops reading before its last bytes and the reply never comes."""
    task_id = _taken(app, r, claimed=True)
    store = store_for(app)
    r.config_resetstat()
    return lambda: store.put_back(0, task_id)


def take(app: Celery, r: redis.Redis) -> Callable[[], Any]:
    work = _task(app, debounce="1ms", debounce_key="{0}")
    for key in ("a", "b"):
        work.delay(key)
    time.sleep(0.01)
    store = store_for(app)
    r.config_resetstat()
    return lambda: store.take(0, 10)


CASES = {
    "take": Case("take", take, _evalshas),
    "gate": Case("gate", gate_plain, _calls, heavy=True),
    "gate-collect": Case("gate", gate_collect, collected, heavy=True),
    "gate-leading-trailing": Case("gate", gate_leading, windows, heavy=True),
    "gate-max-calls-2": Case("gate", gate_capped, _calls, heavy=True),
    "bulk-chunk": Case("gate", bulk, most_calls, recovers=True, several=True, heavy=True),
    "cancel": Case("cancel", cancel, cancelled, recovers=True),
    "flush": Case("flush", flush, flushed),
    "flush-all": Case("flush", flush_all, flushed_each, several=True),
    "gate-wait-replicas": Case("gate", gate_plain, _calls, waited=True, heavy=True),
    "bulk-chunk-wait-replicas": Case(
        "gate", bulk, most_calls, recovers=True, several=True, waited=True, heavy=True
    ),
    "claim": Case("claim", _mark("claim"), _evalshas),
    "finish": Case("finish", _mark("finish"), _evalshas),
    "quarantine": Case("quarantine", _mark("quarantine"), _evalshas),
    "claim-wait-replicas": Case("claim", _mark("claim"), _evalshas, waited=True),
    "finish-wait-replicas": Case("finish", _mark("finish"), _evalshas, waited=True),
    "release": Case("release", release, failures, heavy=True),
    "unclaim": Case("unclaim", unclaim, _evalshas),
}


def _judge(
    name: str,
    fault: str,
    heavy: bool,
    error: BaseException | None,
    effect: int,
    elapsed: float,
    app: Celery,
) -> None:
    """What the caller of case ``name`` got under ``fault`` (``error``, after
    ``elapsed`` s) and how many times it took effect in Redis, against the rules."""
    case = CASES[name]
    assert elapsed < 8, f"the caller waited {elapsed:.1f} s"
    assert effect <= 1, f"{name} took effect {effect} times"
    if error is not None:
        assert isinstance(error, DebounceBackendError), repr(error)
    if name == "cancel" and effect:  # never a window dropped with its result unrevoked
        assert app.AsyncResult(app.conf.test_window_id).state == "REVOKED"
    if fault == "noscript":
        assert error is None and effect == 1
    elif fault == "stall-write":  # Redis never got its end: it did not run
        assert effect == int(error is None), f"{name}: {effect} runs, error {error!r}"
        assert error is not None or case.recovers, f"{name}: no error after a lost write"
        if heavy:
            assert error is not None and "Timeout writing" in str(error.__cause__ or error)
        if heavy and not case.waited and not case.several:
            # one command, cut part-way: unreachable, not unknown; not sent again
            assert not isinstance(error, DebounceOutcomeUnknown), repr(error)
        elif heavy and case.waited and not case.recovers:
            # the script then WAIT: the script may be complete, so unknown, never resent
            assert isinstance(error, DebounceOutcomeUnknown), repr(error)
        elif error is not None and not case.recovers:  # a small write: its reply lost
            assert isinstance(error, DebounceOutcomeUnknown), repr(error)
    elif fault.startswith("error") or fault == "refuse":
        assert error is not None
        if not case.several:
            assert effect == 0
            assert not isinstance(error, DebounceOutcomeUnknown) or fault == "refuse"
        # several: after LOADING redis-py drops the connection, the later replies are lost
    elif error is None:  # drop, stall: only an operation that learns its outcome succeeds
        assert case.recovers and effect == 1, f"{name}: no error after a lost reply"
    elif not case.recovers:
        assert isinstance(error, DebounceOutcomeUnknown), repr(error)
        assert "outcome is unknown" in str(error)


@pytest.fixture(scope="module")
def replica(redis_server: str) -> Iterator[LocalRedis]:
    """A replica of the session's server: WAIT 1 is acknowledged."""
    port = redis_server.rsplit(":", 1)[1]
    with LocalRedis("--replicaof", "127.0.0.1", port) as server:
        client = redis.Redis(port=server.port)
        wait_until(lambda: client.info("replication")["master_link_status"] == "up", 15)
        # the link is up before the master counts the replica's acknowledgements: the
        # first waited case's WAIT (500 ms) could still see none
        master = redis.Redis.from_url(redis_server)
        wait_until(lambda: master.wait(1, 500) == 1, 15)
        master.close()
        yield server


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_script_is_sent_at_most_once_under_every_fault(
    name: str,
    fault: str,
    fault_proxy: FaultProxy,
    redis_client: redis.Redis,
    redis_server: str,
    request: pytest.FixtureRequest,
) -> None:
    case = CASES[name]
    if case.waited:
        request.getfixturevalue("replica")
    heavy = case.heavy and fault == "stall-write"
    app = make_app(
        redis_server,
        debounce_redis_url=f"{fault_proxy.url}/0",
        debounce_redis_timeout=1.0,
        debounce_redis_wait_replicas=int(case.waited),
        debounce_max_payload_bytes=2 * len(BIG),
        test_heavy=heavy,
    )
    store = store_for(app)
    for script in store.scripts.values():  # a lost NOSCRIPT reply would prove nothing
        redis_client.script_load(script.script)  # Redis only
    act = case.setup(app, redis_client)
    before = case.effect(redis_client)
    sha = store.scripts[case.script].sha
    if fault == "refuse":
        fault_proxy.refuse()
    else:
        # a bulk chunk's reply is its EXEC's; its error is one queued call's
        chunk = name == "bulk-chunk" and fault in ("drop", "stall")
        fault_proxy.arm(fault, command(b"EXEC") if chunk else evalsha_of(sha))
    started = time.monotonic()
    error: BaseException | None = None
    try:
        act()
    except Exception as exc:
        error = exc
    elapsed = time.monotonic() - started
    fault_proxy.disarm()
    assert fault_proxy.fired == 1, "the fault was not injected"
    _judge(name, fault, heavy, error, case.effect(redis_client) - before, elapsed, app)


#: The cluster's share of the matrix: the gate alone and its writes of several
#: commands. A cluster has no combiner of threads' calls (``store.node._Combiner`` is a
#: single node's): its combined gate writes are a gate then ``WAIT`` and a bulk chunk's
#: ``MULTI``/``EXEC`` (then ``WAIT``), all through ``ClusterTransport.send_on_node``.
CLUSTER_CASES = ("gate", "gate-wait-replicas", "bulk-chunk", "bulk-chunk-wait-replicas")


@pytest.fixture
def cluster_proxies(
    redis_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[int, FaultProxy]]:
    """A fault proxy in front of every node of the session's cluster, by the node's
    port. Cluster clients built meanwhile reach each node through its proxy: redis-py's
    ``address_remap`` is given to the client ``store.connect`` builds (nothing else of
    it changes), so the topology, MOVED and every connection of the store go through
    the proxies."""
    redis_cluster.wait_ok()
    redis_cluster.flushall()
    proxies = {node.port: FaultProxy(node.port) for node in redis_cluster.running()}
    ports = {port: proxy.port for port, proxy in proxies.items()}
    built = redis.RedisCluster.from_url.__func__

    def through_proxies(cls: type[redis.RedisCluster], url: str, **kwargs: Any) -> Any:
        remap = lambda addr: (addr[0], ports.get(addr[1], addr[1]))  # noqa: E731
        return built(cls, url, address_remap=remap, **kwargs)

    monkeypatch.setattr(redis.RedisCluster, "from_url", classmethod(through_proxies))
    try:
        yield proxies
    finally:
        for proxy in proxies.values():
            proxy.close()


@pytest.mark.cluster
@pytest.mark.parametrize("fault", ["drop", "stall", "stall-write"])
@pytest.mark.parametrize("name", CLUSTER_CASES)
def test_a_cluster_node_that_loses_a_reply_or_stops_reading_gets_each_gate_sent_once(
    name: str,
    fault: str,
    cluster_proxies: dict[int, FaultProxy],
    redis_cluster: LocalCluster,
    redis_server: str,
) -> None:
    """The matrix's gate cases on a real Redis Cluster, the fault injected by a proxy in
    front of each node (the one that serves the windows' slot fires): a lost reply
    (``drop``, ``stall``) is ``DebounceOutcomeUnknown``; under ``stall-write`` the call
    carries several MB and its write times out on the node: a gate then ``WAIT`` is
    ``DebounceOutcomeUnknown`` (the gate may have arrived complete), a gate alone is
    unreachable (its end never left, it did not run), a bulk chunk reads its marker; and
    the script is never sent twice (each call counted at most once on the node)."""
    case = CASES[name]
    heavy = case.heavy and fault == "stall-write"
    master = redis_cluster.node_of_slot(key_slot(b"0"))  # one shard: tag debounce:{0}
    node = redis.Redis(port=master)
    app = make_app(
        redis_server,
        debounce_redis_url=f"{cluster_proxies[master].url}/0",
        debounce_redis_cluster=True,
        debounce_shards=1,
        debounce_redis_timeout=1.0,
        debounce_redis_wait_replicas=int(case.waited),
        debounce_max_payload_bytes=2 * len(BIG),
        test_heavy=heavy,
    )
    store = store_for(app)
    assert isinstance(store.transport, ClusterTransport)
    for script in store.scripts.values():  # a lost NOSCRIPT reply would prove nothing
        node.script_load(script.script)
    act = case.setup(app, node)
    before = case.effect(node)
    chunk = name.startswith("bulk-chunk") and fault in ("drop", "stall")
    matcher = command(b"EXEC") if chunk else evalsha_of(store.scripts[case.script].sha)
    for proxy in cluster_proxies.values():
        proxy.arm(fault, matcher)
    started = time.monotonic()
    error: BaseException | None = None
    try:
        act()
    except Exception as exc:
        error = exc
    elapsed = time.monotonic() - started
    for proxy in cluster_proxies.values():
        proxy.disarm()
    assert cluster_proxies[master].fired == 1, "the fault was not injected on the master"
    assert sum(proxy.fired for proxy in cluster_proxies.values()) == 1
    _judge(name, fault, heavy, error, case.effect(node) - before, elapsed, app)
    if fault == "stall-write" and heavy and not case.recovers:
        # never a plain backend error where the gate may have run (a gate then WAIT)
        assert isinstance(error, DebounceOutcomeUnknown) == case.waited, repr(error)
    node.close()


def test_a_lost_gate_reply_is_reported_as_unknown_and_not_sent_again(
    fault_proxy: FaultProxy,
    redis_client: redis.Redis,
    redis_server: str,
) -> None:
    """The plain case by name: the call was counted once, the caller is told the outcome
    is unknown; the next call joins the same window (n = 2, not 3)."""
    app = make_app(
        redis_server, debounce_redis_url=f"{fault_proxy.url}/0", debounce_redis_timeout=1.0
    )
    work = _task(app)
    first = work.delay(0)
    fault_proxy.arm("drop", evalsha_of(store_for(app).scripts["gate"].sha))
    with pytest.raises(DebounceOutcomeUnknown, match="outcome is unknown"):
        work.delay(1)
    assert work.delay(2).id == first.id
    assert _calls(redis_client) == 3


def test_a_stats_reset_whose_rename_reply_was_lost_still_returns_the_counters(
    fault_proxy: FaultProxy,
    redis_client: redis.Redis,
    redis_server: str,
) -> None:
    """``reset_stats`` RENAMEs the counters away; redis-py sends a RENAME whose reply was
    lost again, which finds no key: the counters it moved must still be returned (they
    were reported as none, and lost)."""
    app = make_app(
        redis_server, debounce_redis_url=f"{fault_proxy.url}/0", debounce_redis_timeout=1.0
    )
    work, _ = _open(app)
    DebounceAdmin(app).cancel(work.name, "k")
    fault_proxy.arm("drop", command(b"RENAME"))
    removed = DebounceAdmin(app).reset_stats()
    assert fault_proxy.fired == 1
    assert removed["t.work"].cancelled == 1


def test_a_cancel_whose_reply_is_lost_while_redis_stays_down_is_revoked_once_it_is_back(
    fault_proxy: FaultProxy,
    redis_client: redis.Redis,
    redis_server: str,
) -> None:
    """The cancel ran, its reply was lost, and Redis refuses every connection longer
    than the store tries to send it again: the caller gets DebounceOutcomeUnknown, and
    once Redis answers the cancel's token key says the window was dropped: its result
    is revoked then (before: deleted, never revoked, `.get()` waited forever)."""
    app = make_app(
        redis_server, debounce_redis_url=f"{fault_proxy.url}/0", debounce_redis_timeout=0.5
    )
    for script in store_for(app).scripts.values():
        redis_client.script_load(script.script)  # Redis only: no NOSCRIPT reply
    work, first = _open(app)
    fault_proxy.arm("drop", evalsha_of(store_for(app).scripts["cancel"].sha), then_refuse=True)
    started = time.monotonic()
    with pytest.raises(DebounceOutcomeUnknown, match="outcome is unknown"):
        DebounceAdmin(app).cancel(work.name, "k")
    assert time.monotonic() - started < 5
    assert open_count(make_app(redis_server)) == 0  # it ran (read past the proxy)
    assert app.AsyncResult(first.id).state == "PENDING"
    fault_proxy.disarm()
    wait_until(lambda: app.AsyncResult(first.id).state == "REVOKED", 10)
    # Redis only: the cancel's token keys
    assert not list(redis_client.scan_iter(match=f"{TAG}:cancelled:*"))  # read, deleted


def test_a_combined_write_of_gate_calls_that_times_out_makes_each_of_them_unknown(
    fault_proxy: FaultProxy,
    redis_client: redis.Redis,
    redis_server: str,
) -> None:
    """Gate calls of three threads; the second and third queue behind the first (held by
    CLIENT PAUSE) and go in one write (the combiner). Redis stops reading once the
    second call arrived complete, in the third's several MB: the write times out. The
    second call ran, so both callers of that write are told the outcome is unknown
    (before, the one that sent it was told "unreachable")."""
    app = make_app(
        redis_server,
        debounce_redis_url=f"{fault_proxy.url}/0",
        debounce_redis_timeout=1.0,
        debounce_max_payload_bytes=2 * len(BIG),
    )
    work = _task(app, debounce_key="{0}")
    store = store_for(app)
    combiner = store.transport._combiner
    assert combiner is not None, "the combiner needs hiredis"
    go = {key: threading.Event() for key in ("first", "second", "big")}
    errors: dict[str, BaseException | None] = {}

    def caller(key: str) -> None:  # keeps its thread (and kept connection) alive
        work.delay(f"warm-{key}")
        go[key].wait(30)
        try:
            work.delay(key, *((BIG,) if key == "big" else ()))
            errors[key] = None
        except BaseException as exc:
            errors[key] = exc

    threads = [threading.Thread(target=caller, args=(key,), daemon=True) for key in go]
    for thread in threads:
        thread.start()
    wait_until(lambda: len(_records(redis_client)) == 3, 10)
    fault_proxy.arm("stall-write", lambda cmd: len(cmd) > 3 and cmd[3].endswith(b":big"))
    # Redis only: the first call's script waits in Redis
    redis_client.client_pause(20_000, all=False)
    try:
        go["first"].set()
        wait_until(lambda: combiner.busy, 10)  # in flight until the pause ends
        go["second"].set()
        wait_until(lambda: len(combiner.waiting) == 1, 10)
        go["big"].set()
        wait_until(lambda: len(combiner.waiting) == 2, 10)
    finally:
        redis_client.client_unpause()
    for thread in threads:
        thread.join(15)
    assert fault_proxy.fired == 1, "the fault was not injected"
    assert errors["first"] is None
    opened = [r.ident or "" for r in open_records(make_app(redis_server))]
    assert [k for k in opened if k.endswith(":second")], opened  # it reached Redis, ran
    assert not [k for k in opened if k.endswith(":big")], opened
    for key in ("second", "big"):
        assert isinstance(errors[key], DebounceOutcomeUnknown), f"{key}: {errors[key]!r}"
        assert "outcome is unknown" in str(errors[key])


@pytest.mark.parametrize("waited", [False, True], ids=["alone", "then-wait"])
def test_a_gate_write_reset_part_way_did_not_run_alone_and_is_unknown_before_wait(
    waited: bool,
    fault_proxy: FaultProxy,
    redis_client: redis.Redis,
    redis_server: str,
    request: pytest.FixtureRequest,
) -> None:
    """Redis stops reading in a call's several MB, then the link is reset (every
    connection closed, new ones refused): the client's write fails part-way with a
    ConnectionError. Alone, the call did not run (its end never left): it is sent once
    more, refused, and reported unreachable. Followed by WAIT, the write may have ended
    after the script: the outcome is unknown (before, it was sent again)."""
    if waited:
        request.getfixturevalue("replica")
    app = make_app(
        redis_server,
        debounce_redis_url=f"{fault_proxy.url}/0",
        debounce_redis_timeout=1.0,
        debounce_redis_wait_replicas=int(waited),
        debounce_max_payload_bytes=2 * len(BIG),
    )
    work = _task(app)
    work.delay(0)
    fault_proxy.arm("stall-write", evalsha_of(store_for(app).scripts["gate"].sha), then_refuse=True)
    with pytest.raises(DebounceBackendError) as raised:
        work.delay(1, BIG)
    fault_proxy.disarm()
    assert fault_proxy.fired == 1
    assert _calls(redis_client) == 1  # its end never reached Redis
    assert isinstance(raised.value, DebounceOutcomeUnknown) == waited, repr(raised.value)


@pytest.mark.parametrize("together", [False, True], ids=["alone", "after-another"])
def test_a_flush_pipeline_whose_write_times_out_is_unknown_unless_one_call_alone(
    together: bool,
    fault_proxy: FaultProxy,
    redis_client: redis.Redis,
    redis_server: str,
) -> None:
    """``flush_all``'s pipeline (``pipeline_once``): Redis stops reading in the last
    flush's several MB (extra arguments the script ignores). After another flush that
    arrived complete, and ran, the outcome is unknown; alone, the flush did not run:
    unreachable."""
    app = make_app(
        redis_server, debounce_redis_url=f"{fault_proxy.url}/0", debounce_redis_timeout=1.0
    )
    work = _task(app, debounce_key="{0}")
    work.delay("a")
    work.delay("b")
    store = store_for(app)
    redis_client.script_load(store.scripts["flush"].script)  # Redis only: no NOSCRIPT for "a"
    direct = make_app(redis_server)  # reads past the proxy
    idents = {(r.ident or "").rsplit(":", 1)[1]: r.ident or "" for r in open_records(direct)}
    keys, args = store._flush_call(0, idents["b"], "")
    calls = [(keys, [*args, BIG])]
    if together:
        calls.insert(0, store._flush_call(0, idents["a"], ""))
    fault_proxy.arm("stall-write", lambda cmd: len(cmd) > 3 and cmd[3].endswith(b":b"))
    with pytest.raises(DebounceBackendError) as raised:
        store.transport.pipeline_once("flush", calls)
    assert fault_proxy.fired == 1
    assert "Timeout writing" in str(raised.value)
    assert isinstance(raised.value, DebounceOutcomeUnknown) == together, repr(raised.value)
    assert taken_count(direct, "leased") == int(together)  # "a" ran, "b" never
