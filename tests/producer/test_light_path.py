"""The per-call shortcuts of ``.delay()`` keep Celery's behaviour: the lighter result
object (``result.py``), the direct ``task_always_eager`` lookup (``confcache.py``),
the per-thread connection of the gate (``store._Lease``) and the auto-pipelining of
concurrent gate calls (``store._Combiner``)."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import pytest
import redis
from celery import Celery, group
from celery.result import AsyncResult
from helpers import debounced, make_app, running_worker, wait_until
from reads import open_count, open_records

from celery_debounce import DebouncedTask
from celery_debounce.producer.confcache import always_eager
from celery_debounce.store import store_for


def _task(app: Celery, **options: Any) -> Any:
    @debounced(
        app,
        name="light.t",
        debounce="300ms",
        debounce_max_wait="2s",
        debounce_key="{0}",
        **options,
    )
    def t(x: int) -> int:
        return x * 10

    return app.tasks["light.t"]


def test_the_result_is_the_apps_async_result_and_behaves_as_one(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server)
    t = _task(app)
    result = t.delay(4)
    assert isinstance(result, app.AsyncResult) and isinstance(result, AsyncResult)
    assert "_on_ready" not in vars(result)  # no promise until asked for
    assert result.state == "PENDING" and result.backend is t.backend
    assert result == AsyncResult(result.id) and hash(result) == hash(result.id)
    again = pickle.loads(pickle.dumps(result))
    assert type(again) is app.AsyncResult or isinstance(again, AsyncResult)
    assert again.id == result.id
    copied = result.__copy__()
    assert copied.id == result.id
    seen: list[Any] = []
    with running_worker(app):
        result.then(seen.append)  # the promise is built on first use
        assert "_on_ready" in vars(result)
        assert result.get(timeout=10) == 40
        assert result.state == "SUCCESS" and result.successful()
        wait_until(lambda: seen == [result], timeout=10)
        result.forget()
        assert AsyncResult(result.id, app=app).state == "PENDING"
        g = group(t.s(1), t.s(2)).apply_async()
        assert g.get(timeout=15) == [10, 20]


def test_a_task_that_overrides_async_result_keeps_its_own(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server)

    class Mine(AsyncResult):
        pass

    class Custom(DebouncedTask):
        def AsyncResult(self, task_id: str, **kwargs: Any) -> Any:
            return Mine(task_id, app=self.app)

    @app.task(
        base=Custom,
        shared=False,
        name="light.c",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k",
    )
    def c() -> None: ...

    assert type(app.tasks["light.c"].delay()) is Mine


def test_task_always_eager_is_read_again_whenever_the_configuration_changes(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server)
    t = _task(app)
    assert always_eager(app) is False
    app.conf.task_always_eager = True
    assert t.delay(3).get() == 30  # inline: no window
    assert open_count(app) == 0
    app.conf.update(task_always_eager=False)
    assert t.delay(3).state == "PENDING"
    assert open_count(app) == 1
    app.conf["task_always_eager"] = True
    assert always_eager(app) is True
    app.conf.pop("task_always_eager")
    assert always_eager(app) is False
    app.conf.setdefault("task_always_eager", True)
    assert always_eager(app) is app.conf.task_always_eager
    app.config_from_object({"task_always_eager": True}, force=True)
    assert always_eager(app) is True is app.conf.task_always_eager


def test_task_always_eager_from_a_live_configuration_source_is_read_live(
    redis_server: str,
) -> None:
    class Config:  # as a module or Django settings: Celery reads it live
        task_always_eager = False

    app = make_app(redis_server)
    app.config_from_object(Config)
    assert always_eager(app) is False
    Config.task_always_eager = True  # e.g. Django's override_settings
    assert always_eager(app) is True is app.conf.task_always_eager
    source = {"CELERY_ALWAYS_EAGER": True}  # the old name, in a plain dict
    other = make_app(redis_server)
    other.config_from_object(source)
    assert always_eager(other) is True is other.conf.task_always_eager
    source["CELERY_ALWAYS_EAGER"] = False  # changed in place: seen too
    assert always_eager(other) is False is other.conf.task_always_eager


def test_each_thread_keeps_one_connection_and_a_killed_one_is_replaced(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server)
    t = _task(app, debounce_replace_payload=False)
    store = store_for(app)
    assert store.transport._lease is not None
    first = t.delay(1)
    conn = store.transport._lease.conn
    for _ in range(5):
        assert t.delay(1).id == first.id
    assert store.transport._lease.conn is conn  # kept, not checked out per call
    # Redis only: killed connections
    redis_client.client_kill_filter(_type="normal", skipme=True)
    assert t.delay(1).id == first.id  # reconnected before sending: not an unknown outcome
    ids: list[str] = []
    conns: list[Any] = []

    def other() -> None:
        ids.append(t.delay(1).id)
        conns.append(store.transport._lease.conn)  # type: ignore[union-attr]

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert ids == [first.id] and conns[0] is not conn
    conns.clear()
    pool = store.client.connection_pool
    wait_until(lambda: len(pool._in_use_connections) == 1, timeout=5)  # released at exit
    assert open_records(app)[0].calls == 8


# -- concurrent gate calls share round trips (store._Combiner) ----------------------


class _FakeConn:
    """A connection whose replies are scripted: values, or exceptions to raise."""

    def __init__(self, replies: list[Any], fail_write: bool = False) -> None:
        self.replies = list(replies)
        self.fail_write = fail_write
        self.sent: list[bytes] = []
        self.disconnected = 0

    def send_packed_command(self, data: list[bytes]) -> None:
        if self.fail_write:
            raise redis.ConnectionError("write failed")
        self.sent.extend(data)

    def read_response(self) -> Any:
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def disconnect(self) -> None:
        self.disconnected += 1


class _FakeLease:
    def __init__(self, conn: _FakeConn) -> None:
        self.conn = conn

    def checkout(self) -> _FakeConn:
        return self.conn


def _batch(*commands: bytes) -> list[Any]:
    from celery_debounce.store.redis.node import _Slot

    return [_Slot(c, False) for c in commands]


def test_a_batch_gives_each_call_its_own_reply_or_error() -> None:
    from celery_debounce.errors import DebounceOutcomeUnknown
    from celery_debounce.store.redis.node import _Combiner

    conn = _FakeConn(
        [b"a", redis.ResponseError("NOSCRIPT no"), None, redis.ConnectionError("lost"), b"never"]
    )
    combiner = _Combiner(_FakeLease(conn))  # type: ignore[arg-type]
    batch = _batch(b"1", b"2", b"3", b"4", b"5")
    combiner._send("gate", batch)
    assert conn.sent == [b"12345"]  # one write
    assert batch[0].result() == b"a"
    with pytest.raises(redis.ResponseError, match="NOSCRIPT"):  # it alone did not run
        batch[1].result()
    assert batch[2].error is None and batch[2].reply is not None  # a nil reply is a reply
    for lost in batch[3:]:  # unanswered once the connection was lost: maybe run
        with pytest.raises(DebounceOutcomeUnknown, match="outcome is unknown"):
            lost.result()
    assert conn.disconnected == 1


def test_a_failed_write_resends_a_lone_call_but_not_a_batch() -> None:
    from celery_debounce.errors import DebounceOutcomeUnknown
    from celery_debounce.store.redis.node import _Combiner, _NotSent

    combiner = _Combiner(_FakeLease(_FakeConn([], fail_write=True)))  # type: ignore[arg-type]
    lone = _batch(b"1")
    combiner._send("gate", lone)
    assert isinstance(lone[0].error, _NotSent)  # the store sends it once more, alone
    batch = _batch(b"1", b"2")
    combiner._send("gate", batch)
    assert all(isinstance(s.error, DebounceOutcomeUnknown) for s in batch)


def test_concurrent_calls_are_batched_and_each_gets_its_window(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server)
    t = _task(app)
    store = store_for(app)
    combiner = store.transport._combiner
    assert combiner is not None
    sizes: list[int] = []
    send = combiner._send

    def counting(name: str, batch: list[Any]) -> None:
        sizes.append(len(batch))
        send(name, batch)

    alone = combiner._send_alone

    def counting_alone(name: str, command: bytes) -> Any:
        sizes.append(1)
        return alone(name, command)

    combiner._send = counting  # type: ignore[method-assign]
    combiner._send_alone = counting_alone  # type: ignore[method-assign]
    # a script that holds the server 50 ms: calls made meanwhile queue up
    # Redis only: a script that holds the server
    slow = redis_client.register_script(
        "local s = redis.call('TIME') repeat local n = redis.call('TIME') "
        "until (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > 50000 return 1"
    )
    threads_n, calls = 8, 30
    start = threading.Barrier(threads_n + 1)
    got: dict[int, list[str]] = {}

    def work(i: int) -> None:
        start.wait()
        got[i] = [t.delay(i).id for _ in range(calls)]

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads_n)]
    for thread in pool:
        thread.start()
    start.wait()
    slow()
    for thread in pool:
        thread.join()
    assert max(sizes) > 1  # some calls shared a round trip
    # a thread's first call may go the direct way (before two threads hold connections)
    assert threads_n * calls - threads_n <= sum(sizes) <= threads_n * calls
    for i, ids in got.items():
        assert len(set(ids)) == 1  # every call of a key joined its one window
        window = t.debounce_pending(i)
        assert window is not None and window.task_id == ids[0] and window.calls == calls
    assert len({ids[0] for ids in got.values()}) == threads_n
    assert not combiner.busy and not combiner.waiting


def test_a_queued_call_that_leaves_hands_its_turn_on() -> None:
    from celery_debounce.store.redis.node import _Combiner, _Slot

    combiner = _Combiner(_FakeLease(_FakeConn([])))  # type: ignore[arg-type]
    combiner.busy = True
    first, second = _Slot(b"1", True), _Slot(b"2", True)
    combiner.waiting = [first, second]
    first.lead = True  # handed the next batch, then interrupted before taking it
    combiner._abandon(first)
    assert combiner.waiting == [second] and second.lead
    assert second.done.acquire(blocking=False)  # woken to send
    combiner.waiting = [second]
    combiner._abandon(second)
    assert combiner.waiting == [] and not combiner.busy


def test_a_lone_call_whose_write_fails_is_not_sent_and_frees_the_turn() -> None:
    from celery_debounce.store.redis.node import _Combiner, _NotSent

    combiner = _Combiner(_FakeLease(_FakeConn([], fail_write=True)))  # type: ignore[arg-type]
    with pytest.raises(_NotSent):  # WindowStore._evalsha_once sends it once more
        combiner.call("gate", b"1")
    assert not combiner.busy
    combiner.lease = _FakeLease(_FakeConn([None]))  # type: ignore[assignment]
    assert combiner.call("gate", b"1") is not None  # a nil reply, marked as answered


def test_a_dropped_store_gives_its_kept_connections_back(
    redis_server: str, redis_client: redis.Redis
) -> None:
    import gc

    from celery_debounce.settings import settings_for
    from celery_debounce.store import WindowStore

    app = make_app(redis_server)
    store = WindowStore(settings_for(app))
    assert store.transport._lease is not None
    store.transport._lease.checkout()  # this thread keeps one
    pool = store.client.connection_pool
    assert len(pool._in_use_connections) == 1
    del store
    gc.collect()
    assert len(pool._in_use_connections) == 0  # released, not held for the thread's life


def test_a_batch_without_a_connection_is_refused_not_unknown() -> None:
    from celery_debounce.store.redis.node import _Combiner

    class _Refused:
        def checkout(self) -> Any:
            raise redis.ConnectionError("refused")

    combiner = _Combiner(_Refused())  # type: ignore[arg-type]
    batch = _batch(b"1", b"2")
    combiner._send("gate", batch)
    assert all(isinstance(s.error, redis.ConnectionError) for s in batch)
