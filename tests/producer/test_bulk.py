"""enqueue_many: pipelined gate calls with the same per-call semantics, on a real Redis."""

from __future__ import annotations

import pytest
import redis
from celery import Celery
from helpers import debounced, running_worker, wait_until
from reads import nothing_stored, open_count, open_records, taken_count

from celery_debounce import DebounceConfigError, DebouncedTask, DebounceKeyError, enqueue_many
from celery_debounce.ops.read_view import list_windows

pytestmark = pytest.mark.usefixtures("store")


def _task(app: Celery, runs: list[tuple[str, int]]) -> DebouncedTask:
    @debounced(
        app,
        debounce="300ms",
        debounce_key="acct:{account}",
        debounce_max_wait="10s",
    )
    def sync(account: str, n: int = 0) -> int:
        runs.append((account, n))
        return n

    return sync  # type: ignore[return-value]


def test_bulk_coalesces_like_single_calls_and_keeps_order(app: Celery) -> None:
    runs: list[tuple[str, int]] = []
    sync = _task(app, runs)
    calls = [((f"a{i % 3}",), {"n": i}) for i in range(30)]
    with running_worker(app):
        results = enqueue_many(sync, calls, chunk_size=7)
        assert len(results) == 30
        ids = {f"a{k}": {r.id for r in results[k::3]} for k in range(3)}
        assert all(len(v) == 1 for v in ids.values())
        assert len(set.union(*ids.values())) == 3
        windows = {w.key: w for w in list_windows(app)}
        assert {k: windows[f"acct:{k}"].calls for k in ids} == {"a0": 10, "a1": 10, "a2": 10}
        assert [results[k].get(timeout=10) for k in range(3)] == [0, 1, 2]
        wait_until(lambda: not list_windows(app))
    assert sorted(runs) == [("a0", 0), ("a1", 1), ("a2", 2)]


@pytest.mark.redis_only("the chunk marker is a Redis key")
def test_bulk_leaves_no_marker_key_once_every_chunk_answered(
    app: Celery, redis_client: redis.Redis
) -> None:
    sync = _task(app, [])
    enqueue_many(sync, [((f"m{i}",), {}) for i in range(25)], chunk_size=10)
    assert open_count(app) == 25
    # Redis only: its bulk marker keys
    assert not list(redis_client.scan_iter("debounce:*:bulk:*"))  # 3 chunks, no marker left


def test_bulk_joins_a_window_opened_by_a_single_call(app: Celery) -> None:
    sync = _task(app, [])
    first = sync.delay("x", n=1)
    results = enqueue_many(sync, [(("x",), {"n": 2}), (("y",), {})])
    assert results[0].id == first.id
    assert results[1].id != first.id


def test_one_bad_call_writes_nothing(app: Celery, redis_client: redis.Redis) -> None:
    sync = _task(app, [])
    with pytest.raises(DebounceKeyError, match="account"):
        enqueue_many(sync, [(("ok",), {}), (({"not": "a scalar"},), {})])
    with pytest.raises(TypeError):  # the task's own argument check, as for .delay()
        enqueue_many(sync, [(("ok",), {}), ((), {"n": 1})])
    with pytest.raises(DebounceConfigError, match=r"\(args, kwargs\) pair"):
        enqueue_many(sync, [("just-args",)])  # type: ignore[list-item]
    with pytest.raises(DebounceConfigError, match="chunk_size=0"):
        enqueue_many(sync, [(("ok",), {})], chunk_size=0)
    with pytest.raises(DebounceConfigError, match="countdown"):
        enqueue_many(sync, [(("ok",), {})], countdown=5)
    assert nothing_stored(app)


@pytest.mark.redis_only("SCRIPT FLUSH")
def test_bulk_reloads_flushed_scripts(app: Celery, redis_client: redis.Redis) -> None:
    sync = _task(app, [])
    enqueue_many(sync, [(("a",), {})])
    # Redis only: a script flush
    redis_client.script_flush()
    results = enqueue_many(sync, [(("a",), {}), (("b",), {})])
    assert len({r.id for r in results}) == 2
    assert {w.key: w.calls for w in list_windows(app)} == {"acct:a": 2, "acct:b": 1}


def test_bulk_per_call_options_and_bypass(app: Celery) -> None:
    runs: list[tuple[str, int]] = []
    sync = _task(app, runs)
    results = enqueue_many(sync, [(("a",), {}), (("a",), {})], debounce_key="fixed")
    assert results[0].id == results[1].id
    assert [w.key for w in list_windows(app)] == ["fixed"]
    with running_worker(app):
        plain = enqueue_many(sync, [(("p",), {"n": 5}), (("p",), {"n": 6})], debounce=False)
        assert plain[0].id != plain[1].id
        assert [r.get(timeout=10) for r in plain] == [5, 6]


def test_batched_publish_to_a_dead_broker_hands_windows_back(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """The dispatcher's pipelined publish fails as a whole: nothing acked, nothing lost."""
    import time

    from helpers import make_app

    from celery_debounce import Dispatcher
    from celery_debounce.testing.servers import LocalRedis

    broker = LocalRedis().start()
    try:
        app = make_app(
            redis_server,
            broker_url=f"{broker.url}/1",
            broker_connection_timeout=1,
            broker_connection_max_retries=0,
        )
        sync = _task(app, [])
        enqueue_many(
            sync, [((f"k{i}",), {}) for i in range(5)], debounce="1ms", debounce_max_wait="1ms"
        )
        time.sleep(0.01)
        dispatcher = Dispatcher(app)
        assert dispatcher.dispatch_once()[0] == 5  # warm: the broker is up
        assert redis.Redis.from_url(f"{broker.url}/1").llen("celery") == 5

        enqueue_many(
            sync, [((f"j{i}",), {}) for i in range(3)], debounce="1ms", debounce_max_wait="1ms"
        )
        time.sleep(0.01)
        port = broker.port
        broker.cleanup()
        started = time.monotonic()
        assert dispatcher.dispatch_once()[0] == 0
        assert time.monotonic() - started < 10
        assert taken_count(app, "leased") == 3  # handed back, not acked
        assert open_count(app) == 0

        broker = LocalRedis(port=port).start()
        published = wait_until(lambda: dispatcher.dispatch_once()[0], timeout=10, interval=0.2)
        assert published == 3
        assert redis.Redis.from_url(f"{broker.url}/1").llen("celery") == 3
    finally:
        broker.cleanup()


def _windows_by_key(app: Celery) -> dict[str, tuple[str, int]]:
    """key -> (window id, calls) of every pending window, read through the store."""
    from celery_debounce.store.idents import split_ident

    return {split_ident(r.ident or "")[1]: (r.task_id, r.calls) for r in open_records(app)}


def test_bulk_sends_the_same_signals_as_single_calls(app: Celery) -> None:
    from celery_debounce.signals import call_absorbed, window_opened

    sync = _task(app, [])
    seen: list[tuple[str, str, str, int]] = []

    def opened(sender: str, **kw: object) -> None:
        seen.append(("opened", sender, str(kw["key"]), int(kw["calls"])))  # type: ignore[call-overload]

    def absorbed(sender: str, **kw: object) -> None:
        seen.append(("absorbed", sender, str(kw["key"]), int(kw["calls"])))  # type: ignore[call-overload]

    window_opened.connect(opened, weak=False)
    call_absorbed.connect(absorbed, weak=False)
    try:
        for account in ("a", "b", "a"):
            sync.delay(account)
        single = list(seen)
        seen.clear()
        enqueue_many(sync, [(("c",), {}), (("d",), {}), (("c",), {})])
    finally:
        window_opened.disconnect(opened)
        call_absorbed.disconnect(absorbed)
    assert single == [
        ("opened", sync.name, "acct:a", 1),
        ("opened", sync.name, "acct:b", 1),
        ("absorbed", sync.name, "acct:a", 2),
    ]
    assert seen == [
        ("opened", sync.name, "acct:c", 1),
        ("opened", sync.name, "acct:d", 1),
        ("absorbed", sync.name, "acct:c", 2),
    ]


@pytest.mark.redis_only("a foreign key planted in Redis")
def test_a_call_redis_refuses_mid_batch_is_reported_and_only_it_is_retried(
    app: Celery, redis_client: redis.Redis
) -> None:
    """One gate call fails inside Redis (its open: key is of the wrong type): the others are
    written, the error names exactly the unwritten one, and retrying it counts nothing twice."""
    from celery_debounce.producer.many import DebounceBulkError
    from celery_debounce.store.idents import window_ident

    sync = _task(app, [])
    calls = [((f"k{i % 40}",), {"n": i}) for i in range(100)]
    bad = window_ident(sync.name, "acct:k7")
    redis_client.set(f"debounce:{{0}}:open:{bad}", "foreign")  # Redis only: a foreign key
    with pytest.raises(DebounceBulkError) as info:
        enqueue_many(sync, calls, chunk_size=16)
    error = info.value
    assert error.unwritten == [i for i in range(100) if i % 40 == 7]
    assert error.written == 100 - len(error.unwritten)
    assert all((r is None) == (i in error.unwritten) for i, r in enumerate(error.results))
    windows = _windows_by_key(app)
    for i, result in enumerate(error.results):
        if result is not None:
            assert windows[f"acct:k{i % 40}"][0] == result.id
    redis_client.delete(f"debounce:{{0}}:open:{bad}")  # Redis only: the foreign key gone
    retried = enqueue_many(sync, [calls[i] for i in error.unwritten])
    windows = _windows_by_key(app)
    assert sum(n for _, n in windows.values()) == 100  # every call counted exactly once
    assert windows["acct:k7"] == (retried[0].id, 3)


@pytest.mark.redis_only("a Redis connection killed mid-batch")
def test_a_connection_killed_mid_batch_reports_exactly_what_was_written(
    app: Celery, redis_client: redis.Redis, redis_server: str
) -> None:
    """CLIENT KILL while a large batch is in flight: every call is either written (with its
    window's result) or listed in .unwritten; retrying those gives each call exactly once."""
    import threading
    import time

    from celery_debounce.producer.many import DebounceBulkError

    sync = _task(app, [])
    total = 60_000
    calls = [((f"u{i % 30_000}",), {}) for i in range(total)]
    killed = threading.Event()

    def killer() -> None:
        watcher = redis.Redis.from_url(f"{redis_server}/0")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if watcher.zcard("debounce:{0}:due") >= 3000:
                watcher.client_kill_filter(_type="normal", skipme=True)
                killed.set()
                return
            time.sleep(0.002)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    with pytest.raises(DebounceBulkError) as info:
        enqueue_many(sync, calls, chunk_size=500)
    thread.join(10)
    assert killed.is_set()
    error = info.value
    assert 0 < error.written < total and error.unknown == []
    assert error.written + len(error.unwritten) == total
    windows = _windows_by_key(app)
    assert sum(n for _, n in windows.values()) == error.written
    for i, result in enumerate(error.results):
        if result is not None:
            assert windows[f"acct:u{i % 30_000}"][0] == result.id
    enqueue_many(sync, [calls[i] for i in error.unwritten], chunk_size=500)
    windows = _windows_by_key(app)
    assert len(windows) == 30_000
    assert {n for _, n in windows.values()} == {2}  # each call counted exactly once
