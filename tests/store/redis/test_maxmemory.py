"""Maxmemory (``noeviction``) on the windows' Redis and on a Redis broker (issue 19,
items 1 and 2): each on its own real redis-server, the other one healthy.

* The windows' Redis at maxmemory: a new call is refused with a clear
  ``DebounceBackendError`` and writes nothing; the dispatcher keeps taking and
  publishing what is due (due windows, leases, flushed windows, leading runs) and the
  worker's claim and finish go through. Redis refuses a script under OOM only at its
  first write that may grow memory (``denyoom``) and only if it has written nothing
  before; the dispatcher's and worker's scripts start with a write that does not grow
  memory, so they either write nothing or go through (docs/design.md, "Maxmemory").
* A broker that refuses every message (OOM, READONLY): a shared fault, an outage. No
  window counts it, none is quarantined, every one runs once the broker recovers.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, make_app, running_worker, wait_until

from celery_debounce import DebounceBackendError
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.ops.admin import DebounceAdmin
from celery_debounce.store import store_for
from celery_debounce.store.domain import Released
from celery_debounce.testing.servers import LocalRedis

pytestmark = pytest.mark.slow
TAG = "debounce:{0}"


def _tasks(app: Celery) -> tuple[Any, Any, Any]:
    @debounced(
        app,
        name="mm.due",
        debounce="1ms",
        debounce_max_wait="1ms",
        debounce_key="{0}",
    )
    def due(k: str) -> str:
        return k

    @debounced(
        app,
        name="mm.slow",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{0}",
    )
    def slow(k: str) -> str:
        return k

    @debounced(
        app,
        name="mm.lead",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{0}",
        debounce_leading=True,
    )
    def lead(k: str) -> str:
        return k

    return due, slow, lead


def _keyspace(client: redis.Redis) -> dict[bytes, Any]:
    """Every package key with its content (scores, fields), to prove nothing changed."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter("debounce:*"):
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"list":
            out[key] = client.lrange(key, 0, -1)
        else:
            out[key] = kind
    return out


def _oom(client: redis.Redis) -> None:
    """Put the server at maxmemory: the limit below what it uses, nothing evictable."""
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", str(used // 2))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("probe", "x")


def test_the_windows_redis_at_maxmemory_refuses_new_calls_and_keeps_dispatching(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    with LocalRedis("--maxmemory-policy", "noeviction") as windows:
        app = make_app(
            redis_server, debounce_redis_url=f"{windows.url}/0", debounce_dispatch_lease=1.0
        )
        due, slow, lead = _tasks(app)
        client = redis.Redis.from_url(f"{windows.url}/0")
        store = store_for(app)
        # a lease whose dispatcher died (taken, never published), due windows, a flushed
        # window and a leading run: every kind of entry take.lua finds in the lease set
        died = due.apply_async(("died",))
        time.sleep(0.01)
        assert [w.task_id for w in store.take(0, 10).windows] == [died.id]
        ids = [due.apply_async((f"d{i}",)).id for i in range(3)]
        flushed = slow.apply_async(("f",))
        DebounceAdmin(app).flush("mm.slow", "f")
        leading = lead.apply_async(("l",))
        pending = slow.apply_async(("p",))  # stays open: a call may join it
        time.sleep(1.1)  # the dead dispatcher's 1 s lease expires
        _oom(client)

        before = _keyspace(client)
        for call in (
            lambda: due.apply_async(("new",)),  # opens a window
            lambda: slow.apply_async(("p",)),  # joins one
            lambda: lead.apply_async(("l",)),
        ):  # in a quiet period
            with pytest.raises(DebounceBackendError, match="maxmemory") as refused:
                call()
            assert "nothing was written" in str(refused.value)
        assert _keyspace(client) == before  # nothing half-written

        everyone = [died.id, *ids, flushed.id, leading.id]
        dispatcher, published = Dispatcher(app), [0]

        def dispatched() -> bool:  # one pass, or more if a slow publish stopped one
            published[0] += dispatcher.dispatch_once()[0]
            return published[0] >= len(everyone)

        wait_until(dispatched, 20)
        assert published[0] == len(everyone)
        for task_id in everyone:
            assert client.hget(f"{TAG}:win:{task_id}", "st") == b"queued", task_id
        assert client.zcard(f"{TAG}:leased") == 0
        # a publish that fails is handed back (release.lua) under OOM too
        again = store.take(0, 10)  # nothing due
        assert again.windows == []
        with running_worker(app):  # claim.lua and finish.lua go through
            wait_until(
                lambda: all(client.hget(f"{TAG}:win:{t}", "st") == b"finished" for t in everyone),
                20,
            )
        assert client.hget(f"{TAG}:open:{pending_ident(slow, 'p')}", "n") == b"1"
        assert pending.id
        client.config_set("maxmemory", "0")  # room again: calls are accepted
        assert due.apply_async(("new",)).id


def pending_ident(task: Any, key: str) -> str:
    from celery_debounce.store.idents import window_ident

    return window_ident(task.name, key)


def test_release_goes_through_on_a_windows_redis_at_maxmemory(redis_server: str) -> None:
    with LocalRedis("--maxmemory-policy", "noeviction") as windows:
        app = make_app(redis_server, debounce_redis_url=f"{windows.url}/0")
        due, _, _ = _tasks(app)
        client = redis.Redis.from_url(f"{windows.url}/0")
        store = store_for(app)
        due.apply_async(("r",))
        time.sleep(0.01)
        (window,) = store.take(0, 10).windows
        _oom(client)
        assert store.release(0, 5000, [Released(window.task_id, window.tries)]) == 1
        assert client.zscore(f"{TAG}:leased", window.task_id) is not None


# -- a broker that refuses every message: a shared fault ------------------------------


def _read_only(broker: redis.Redis, master_port: int) -> None:
    """Demote the broker to a replica (of an empty server): every write gets READONLY."""
    broker.replicaof("127.0.0.1", str(master_port))
    wait_until(lambda: broker.info("replication").get("master_link_status") == "up", 10)
    with pytest.raises(redis.exceptions.ReadOnlyError):
        broker.set("probe", "x")


@pytest.mark.parametrize("fault", ["oom", "readonly"])
def test_a_broker_refusing_every_message_for_several_leases_quarantines_nothing(
    redis_server: str,
    redis_client: redis.Redis,
    fault: str,
) -> None:
    """A Redis broker at maxmemory (noeviction), or demoted to a read-only replica, answers
    every publish with an error reply (OOM, READONLY). That is the broker's fault, not any
    window's: for 6 leases of 1 s (MAX_TRIES is 5) none is counted or quarantined, and
    once the broker has room (is a master) again every window runs once."""
    with LocalRedis("--maxmemory-policy", "noeviction") as server, LocalRedis() as master:
        app = make_app(
            redis_server,
            broker_url=f"{server.url}/0",
            debounce_dispatch_lease=1.0,
            task_ignore_result=True,
        )
        broker = redis.Redis.from_url(f"{server.url}/0")
        runs = redis.Redis.from_url(f"{redis_server}/3")

        @debounced(
            app,
            name="mm.run",
            debounce="1ms",
            debounce_max_wait="1ms",
            debounce_key="{0}",
            bind=True,
        )
        def run(self: Any, k: str) -> str:
            runs.rpush(f"runs:{k}", self.request.id)
            return k

        dispatcher = Dispatcher(app, name="faulty-broker")
        run.apply_async(("warm",))  # the broker is healthy: kombu declares its queue
        time.sleep(0.01)
        assert dispatcher.dispatch_once()[0] == 1
        if fault == "oom":
            _oom(broker)
        else:
            _read_only(broker, master.port)
        ids = {f"k{i}": run.apply_async((f"k{i}",)).id for i in range(8)}
        dispatcher.start()
        try:
            time.sleep(6.5)  # several leases, more than MAX_TRIES attempts
            assert redis_client.zcard(f"{TAG}:quarantine") == 0
            states = {redis_client.hget(f"{TAG}:win:{tid}", "st") for tid in ids.values()}
            assert states <= {b"dispatching", None}, states  # leased, or not taken yet
            if fault == "oom":
                broker.config_set("maxmemory", "0")
            else:
                broker.replicaof("NO", "ONE")
            with running_worker(app):
                wait_until(lambda: all(runs.llen(f"runs:{k}") for k in ids), 30)
                time.sleep(1.5)  # a lease more: nothing runs twice
        finally:
            dispatcher.stop()
        assert {k: [r.decode() for r in runs.lrange(f"runs:{k}", 0, -1)] for k in ids} == {
            k: [tid] for k, tid in ids.items()
        }
        assert redis_client.zcard(f"{TAG}:quarantine") == 0


#: What a Redis broker answers when it refuses every write (the reply, not the cause).
_BROKER_REFUSALS = {
    "MISCONF": b"MISCONF Redis is configured to save RDB snapshots, but it's currently "
    b"unable to persist to disk. (injected)",
    "LOADING": b"LOADING Redis is loading the dataset in memory (injected)",
    "NOAUTH": b"NOAUTH Authentication required. (injected)",
    "WRONGPASS": b"WRONGPASS invalid username-password pair or user is disabled. (injected)",
    "MASTERDOWN": b"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set "
    b"to 'no'. (injected)",
    "NOREPLICAS": b"NOREPLICAS Not enough good replicas to write. (injected)",
    "BUSY": b"BUSY Redis is busy running a script. (injected)",
}


@pytest.mark.parametrize("code", sorted(_BROKER_REFUSALS))
def test_every_broker_wide_error_reply_counts_against_no_window(
    redis_server: str,
    redis_client: redis.Redis,
    code: str,
) -> None:
    """The class of the rule, over every broker-wide code the real-server test above does
    not reach (OOM and READONLY): a proxy in front of a real broker answers every publish
    (LPUSH) with the code's error reply. Each window is taken again and again and never
    counted (``fl``), none is quarantined; once the broker takes writes again each is
    published exactly once."""
    from fault_proxy import FaultProxy, command

    with LocalRedis() as server:
        proxy = FaultProxy(server.port)
        try:
            app = make_app(
                redis_server,
                broker_url=f"{proxy.url}/0",
                debounce_dispatch_lease=1.0,
                task_ignore_result=True,
            )
            broker = redis.Redis(port=server.port)
            due, _, _ = _tasks(app)
            dispatcher = Dispatcher(app, name=f"refused-{code}")
            due.apply_async(("warm",))
            time.sleep(0.01)
            assert dispatcher.dispatch_once()[0] == 1  # kombu declared its queue
            queued = broker.llen("celery")
            proxy.arm("error", command(b"LPUSH"), error=_BROKER_REFUSALS[code], every=True)
            ids = [due.apply_async((f"k{i}",)).id for i in range(3)]
            records = [f"{TAG}:win:{tid}" for tid in ids]

            def tries() -> int:
                return min(int(redis_client.hget(r, "tries") or 0) for r in records)

            deadline = time.monotonic() + 30
            while tries() < 3:  # each taken three times (MAX_TRIES is 5), each refused
                assert time.monotonic() < deadline, (code, tries(), proxy.fired)
                dispatcher.dispatch_once()
                time.sleep(0.05)
            assert proxy.fired >= 3
            assert [redis_client.hget(r, "fl") for r in records] == [None] * 3
            assert redis_client.zcard(f"{TAG}:quarantine") == 0
            assert broker.llen("celery") == queued  # nothing was written
            proxy.disarm()
            wait_until(
                lambda: (
                    dispatcher.dispatch_once() is not None
                    and all(redis_client.hget(r, "st") != b"dispatching" for r in records)
                ),
                30,
                interval=0.1,
            )
            assert broker.llen("celery") == queued + 3  # each published once
            assert redis_client.zcard(f"{TAG}:quarantine") == 0
        finally:
            proxy.close()


def test_error_replies_are_told_apart_by_their_code() -> None:
    """What the dispatcher classifies: the code of a redis-py error, of a pipeline's
    annotated first error, and of what kombu wraps; the command that failed first."""
    from redis import exceptions as rx

    from celery_debounce.dispatch.dispatcher import BROKER_WIDE_CODES, KEY_DEPENDENT_CODES
    from celery_debounce.store import pipeline_failed_at, reply_code

    parser = (
        redis.connection.DefaultParser
        if hasattr(redis.connection, "DefaultParser")
        else redis._parsers.base.BaseParser
    )  # type: ignore[attr-defined]
    replies = {
        "OOM command not allowed when used memory > 'maxmemory'.": "OOM",
        "READONLY You can't write against a read only replica.": "READONLY",
        "MISCONF Redis is configured to save RDB snapshots, but it's currently unable": "MISCONF",
        "LOADING Redis is loading the dataset in memory": "LOADING",
        "NOAUTH Authentication required.": "NOAUTH",
        "NOPERM this user has no permissions to access one of the keys": "NOPERM",
        "CLUSTERDOWN The cluster is down": "CLUSTERDOWN",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.": (
            "MASTERDOWN"
        ),
        "TRYAGAIN Multiple keys request during rehashing of slot": "TRYAGAIN",
        "NOREPLICAS Not enough good replicas to write.": "NOREPLICAS",
        "BUSY Redis is busy running a script.": "BUSY",
        "WRONGTYPE Operation against a key holding the wrong kind of value": "WRONGTYPE",
    }
    for reply, code in replies.items():
        exc = parser.parse_error(reply)
        assert reply_code(exc) == code, (reply, exc)
        try:  # as kombu's batch raises it: annotated by the pipeline, wrapped
            exc.args = (
                f"Command # 3 (LPUSH celery x) of pipeline caused error: {exc}",
                *exc.args[1:],
            )
            raise RuntimeError("Redis publish batch failed; delivery is uncertain") from exc
        except RuntimeError as wrapped:
            assert reply_code(wrapped) == code, reply
            assert pipeline_failed_at(wrapped) == 3
    assert reply_code(rx.ConnectionError("refused")) is None
    assert reply_code(ValueError("x")) is None
    assert pipeline_failed_at(rx.ResponseError("WRONGTYPE x")) is None
    assert {"OOM", "READONLY", "MISCONF", "LOADING", "NOAUTH"} <= BROKER_WIDE_CODES
    assert "WRONGTYPE" not in BROKER_WIDE_CODES | KEY_DEPENDENT_CODES


def test_takes_an_outage_wasted_never_count_toward_quarantine(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    """``tries`` counts every take, also those a broker outage wasted; quarantine counts
    only the failures that were the window's own (``fl``, release.lua). A window taken 6
    times while the broker was at maxmemory, whose message then fails on its own, is
    published 5 more times before it is quarantined, not set aside at its first failure."""
    from celery_debounce.dispatch.dispatcher import MAX_TRIES

    with LocalRedis("--maxmemory-policy", "noeviction") as server:
        app = make_app(
            redis_server,
            broker_url=f"{server.url}/0",
            debounce_dispatch_lease=1.0,
            task_ignore_result=True,
            task_create_missing_queues=False,
        )
        broker = redis.Redis.from_url(f"{server.url}/0")
        due, _, _ = _tasks(app)
        dispatcher = Dispatcher(app, name="counts")
        due.apply_async(("warm",))
        time.sleep(0.01)
        assert dispatcher.dispatch_once()[0] == 1
        _oom(broker)
        victim = due.apply_async(("v",))
        record = f"{TAG}:win:{victim.id}"

        def tries() -> int:
            return int(redis_client.hget(record, "tries") or 0)

        while tries() <= MAX_TRIES:  # taken again and again, refused by the broker
            seen = tries()
            dispatcher.dispatch_once()
            wait_until(
                lambda: dispatcher.dispatch_once() is not None and tries() > seen, 5, interval=0.1
            )
        assert redis_client.zcard(f"{TAG}:quarantine") == 0
        assert redis_client.hget(record, "fl") is None  # none of that was its fault
        wasted = tries()
        redis_client.hset(record, "o", '{"queue":"nowhere"}')  # now it fails on its own
        broker.config_set("maxmemory", "0")
        wait_until(
            lambda: (
                dispatcher.dispatch_once() is not None
                and redis_client.hget(record, "st") == b"quarantined"
            ),
            30,
            interval=0.1,
        )
        reason = redis_client.hget(record, "qe").decode()
        assert f"publish failed {MAX_TRIES} times" in reason and "nowhere" in reason
        assert tries() == wasted + MAX_TRIES


@pytest.mark.parametrize("refused", ["every queue", "one queue"])
def test_a_refused_key_counts_against_a_window_only_when_another_was_published(
    redis_server: str,
    redis_client: redis.Redis,
    refused: str,
) -> None:
    """NOPERM may be the broker's (the user lost its rights) or one message's (an ACL key
    pattern that misses its queue). It counts against a window only when another window
    of the same pass was published: refused on every queue, nothing is counted over 6
    leases; refused on one queue while other windows go through, that window alone is
    quarantined after MAX_TRIES."""
    from celery_debounce.dispatch.dispatcher import MAX_TRIES

    with LocalRedis() as server:
        admin = redis.Redis.from_url(f"{server.url}/0")
        keys = ["~_kombu.*", "~unacked*"] + (["~celery*"] if refused == "one queue" else [])
        admin.acl_setuser(
            "disp", enabled=True, passwords=["+pw"], keys=keys, channels=["*"], commands=["+@all"]
        )
        app = make_app(
            redis_server,
            broker_url=f"redis://disp:pw@127.0.0.1:{server.port}/0",
            debounce_dispatch_lease=1.0,
            task_ignore_result=True,
        )
        due, _, _ = _tasks(app)
        good = [due.apply_async((f"g{i}",)) for i in range(3)]
        bad = due.apply_async(("b",), queue="secret")  # NOPERM for this user, always
        dispatcher = Dispatcher(app, name="acl")
        deadline = time.monotonic() + 6.5
        while time.monotonic() < deadline:  # traffic: a new window each pass
            good.append(due.apply_async((f"g{len(good)}",)))
            time.sleep(0.01)
            dispatcher.dispatch_once()
            time.sleep(0.2)
        states = {r.id: redis_client.hget(f"{TAG}:win:{r.id}", "st") for r in [*good, bad]}
        if refused == "every queue":
            assert redis_client.zcard(f"{TAG}:quarantine") == 0
            assert set(states.values()) <= {b"dispatching"}, states
            assert all(redis_client.hget(f"{TAG}:win:{r.id}", "fl") is None for r in [*good, bad])
        else:
            assert all(states[r.id] == b"queued" for r in good), states
            assert states[bad.id] == b"quarantined"
            reason = redis_client.hget(f"{TAG}:win:{bad.id}", "qe").decode()
            assert f"publish failed {MAX_TRIES} times" in reason and "NoPermission" in reason


def test_the_back_off_after_a_shared_fault_grows_and_is_jittered(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    """Passes in a row that meet a shared fault wait 0.5 s, 1 s, 2 s ... up to 10 s, each
    times a random factor in [0.5, 1], so dispatchers that met the same outage do not all
    come back at once; windows not sent are released for as long (at most a lease)."""
    from celery_debounce.dispatch.dispatcher import BROKER_BACKOFF_S

    app = make_app(redis_server)
    first, cap = BROKER_BACKOFF_S
    waits: list[list[float]] = []
    for _ in range(20):  # 20 dispatchers through the same 8 failed passes
        dispatcher = Dispatcher(app)
        seen = []
        for _ in range(8):
            dispatcher.broker_fault = None  # a new pass
            dispatcher._shared_fault("OutOfMemoryError: OOM")
            dispatcher._shared_fault("again in the same pass")  # one back-off per pass
            seen.append(dispatcher._fault_delay)
        waits.append(seen)
    for seen in waits:
        for k, wait in enumerate(seen):
            base = min(cap, first * 2**k)
            assert base / 2 <= wait <= base, (k, wait)
    assert len({seen[0] for seen in waits}) > 10  # jittered, not in step
