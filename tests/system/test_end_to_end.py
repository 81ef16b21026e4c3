"""End-to-end guarantees against a real redis-server and a real Celery worker.

The tests that take the ``broker`` fixture (conftest.py) run once with the broker on
Redis and once on a real RabbitMQ node (``[redis]``, ``[rabbitmq]``); the windows stay
in Redis either way. What only RabbitMQ does is in tests/dispatch/test_rabbitmq.py.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import (
    Broker,
    StoreCase,
    debounced,
    make_app,
    package_keys,
    running_worker,
    wait_until,
)
from kombu.exceptions import EncodeError
from reads import state_of

from celery_debounce import (
    DebounceBackendError,
    DebounceConfigError,
    DebounceKeyError,
    install,
    send_task,
)
from celery_debounce.ops.read_view import list_windows

pytestmark = pytest.mark.usefixtures("store")


def broker_is_empty(app: Celery) -> bool:
    client = redis.Redis.from_url(app.conf.broker_url)
    return not any(client.type(k) == b"list" for k in client.keys("*"))


def test_burst_coalesces_into_one_run_with_the_openers_arguments(
    app_factory: Any, broker: Broker, redis_client: redis.Redis, store: StoreCase
) -> None:
    app = app_factory(**broker.conf)
    runs: list[tuple[str, int]] = []

    @debounced(
        app,
        debounce="300ms",
        debounce_key="report:{user_id}",
        debounce_max_wait="10s",
    )
    def build_report(user_id: str, revision: int = 0) -> str:
        runs.append((user_id, revision))
        return f"built {user_id}@{revision}"

    with running_worker(app):
        results = [build_report.delay("u1", revision=i) for i in range(25)]
        other = build_report.delay("u2", revision=7)
        assert len({r.id for r in results}) == 1
        assert other.id != results[0].id
        assert results[0].get(timeout=15) == "built u1@0"
        assert app.AsyncResult(results[-1].id).get(timeout=15) == "built u1@0"
        assert other.get(timeout=15) == "built u2@7"
        wait_until(lambda: not list_windows(app))
    assert sorted(runs) == [("u1", 0), ("u2", 7)]
    assert state_of(app, other.id) == "finished"
    if store.name == "redis":  # Redis only: a record's tries, which no store read returns
        (key,) = redis_client.scan_iter(match=f"debounce:*:win:{other.id}")  # its shard's
        # published once (a worker may claim and finish it before the dispatcher's ack
        # that follows the broker's confirm: then the record has no `pa`)
        assert redis_client.hget(key, "tries") == b"1"


def test_every_coalesced_result_gets_the_one_runs_value(app: Celery) -> None:
    @debounced(app, debounce="200ms", debounce_key="k", debounce_max_wait="5s")
    def add(a: int, b: int) -> int:
        return a + b

    with running_worker(app):
        results = [add.delay(1, i) for i in range(5)]
        assert [r.get(timeout=10) for r in results] == [1] * 5


def test_calls_slide_the_deadline(app: Celery) -> None:
    started: list[float] = []

    # a 1 s window and calls 200 ms apart: 800 ms of slack before a late call would
    # let the window close while calls still arrive
    @debounced(app, debounce="1s", debounce_key="k", debounce_max_wait="20s")
    def work() -> None:
        started.append(time.time())

    with running_worker(app):
        first = work.delay()
        for _ in range(8):  # 8 calls 200 ms apart: each pushes the deadline out again
            time.sleep(0.2)
            last_call = time.time()  # before the call: the gate sees it later
            assert work.delay().id == first.id
            assert not started, "ran while calls were still arriving"
        first.get(timeout=10)
    assert len(started) == 1
    # the run starts a full window after the last call, not after the first
    assert started[0] >= last_call + 1.0 - 0.005  # (ms rounding of the deadline)


def test_max_wait_forces_a_run_under_a_never_ending_stream(
    app_factory: Any, broker: Broker
) -> None:
    app = app_factory(**broker.conf)
    started: list[float] = []

    # calls every 100 ms against a 1 s window: 900 ms of slack before a late call lets
    # the window close on its own; the 2.5 s ceiling forces the runs instead
    @debounced(
        app,
        debounce="1s",
        debounce_key="k",
        debounce_max_wait="2500ms",
    )
    def work() -> None:
        started.append(time.time())

    with running_worker(app):
        stream_start = time.time()
        ids = []
        while time.time() < stream_start + 6.5:  # a call every 100 ms, never a 1 s pause
            ids.append(work.delay().id)
            time.sleep(0.1)
        stream_end = time.time()
        wait_until(lambda: not list_windows(app), timeout=10)
    assert len(started) >= 2, "the ceiling must force runs while calls keep coming"
    # the first window opened after stream_start: its run is forced at +2.5 s (never
    # earlier), plus dispatch latency (up to 2 s allowed on a loaded machine)
    assert stream_start + 2.5 - 0.005 <= started[0] <= stream_start + 2.5 + 2.0
    assert started[1] < stream_end
    assert len(set(ids)) >= 2
    assert len(set(ids)) == len(started)  # each window ran once


def test_replace_payload_runs_with_the_newest_arguments(app: Celery) -> None:
    @debounced(
        app,
        debounce="300ms",
        debounce_key="doc:{0}",
        debounce_max_wait="10s",
        debounce_replace_payload=True,
    )
    def index(doc: str, revision: int) -> int:
        return revision

    with running_worker(app):
        results = [index.delay("d1", i) for i in range(6)]
        assert results[0].get(timeout=10) == 5


def test_per_call_options_override_the_task_defaults(app: Celery) -> None:
    @debounced(
        app,
        debounce="1h",
        debounce_key="slow:{0}",
        debounce_max_wait="2h",
    )
    def work(user: str, revision: int) -> tuple[str, int]:
        return user, revision

    with running_worker(app):
        opts = dict(
            debounce="300ms",
            debounce_key="fast:{user}",
            debounce_max_wait="5s",
            debounce_replace_payload=True,
        )
        a = work.apply_async(args=("u1", 1), **opts)
        b = work.apply_async(args=("u1", 2), **opts)
        assert a.id == b.id
        assert tuple(a.get(timeout=10)) == ("u1", 2)
        # the task's own (1 h) window is a different key: still pending
        slow = work.delay("u1", 3)
        assert slow.id != a.id
        (pending,) = list_windows(app)
        assert pending.key == "slow:u1" and pending.task_id == slow.id


def test_task_without_debounce_behaves_like_a_plain_task(app: Celery) -> None:
    @debounced(app)
    def plain(x: int) -> int:
        return x * 2

    with running_worker(app):
        a, b = plain.delay(1), plain.delay(1)
        assert a.id != b.id
        assert (a.get(timeout=10), b.get(timeout=10)) == (2, 2)
        c = plain.apply_async((5,), debounce="200ms", debounce_max_wait="2s")
        d = plain.apply_async((5,), debounce="200ms", debounce_max_wait="2s")
        assert c.id == d.id and c.get(timeout=10) == 10


def test_debounce_false_on_a_call_publishes_plainly(app: Celery) -> None:
    @debounced(app, debounce="1h", debounce_max_wait="2h")
    def work(x: int) -> int:
        return x

    with running_worker(app):
        assert work.apply_async((3,), debounce=False).get(timeout=10) == 3
    assert not list_windows(app)


def test_by_name_producer_that_never_imported_the_task(app_factory: Any) -> None:
    worker_app = app_factory()

    @worker_app.task(name="reports.build", shared=False)  # a plain task on the worker side
    def build(user_id: str, revision: int = 0) -> str:
        return f"{user_id}@{revision}"

    install(worker_app)
    producer_app = app_factory()  # knows nothing about reports.build
    with running_worker(worker_app):
        ids = {
            send_task(
                producer_app,
                "reports.build",
                args=("u1",),
                kwargs={"revision": i},
                debounce="300ms",
                debounce_key="report:{0}",
                debounce_max_wait="5s",
            ).id
            for i in range(5)
        }
        assert len(ids) == 1
        assert producer_app.AsyncResult(ids.pop()).get(timeout=10) == "u1@0"
        # by-name keys: {name} reads kwargs
        r = send_task(
            producer_app,
            "reports.build",
            args=("u2",),
            kwargs={"revision": 9},
            debounce="200ms",
            debounce_key="rev:{revision}",
            debounce_max_wait="1s",
        )
        assert r.get(timeout=10) == "u2@9"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"debounce": "5m"}, "needs debounce_max_wait"),
        ({"debounce": "5m", "debounce_max_wait": "1m"}, "shorter than"),
        ({"debounce": "0s", "debounce_max_wait": "1m"}, "debounce='0s'"),
        ({"debounce": -3, "debounce_max_wait": "1m"}, "debounce=-3"),
        ({"debounce": "soon", "debounce_max_wait": "1m"}, "debounce='soon'"),
        ({"debounce": "5m", "debounce_max_wait": "forever"}, "debounce_max_wait='forever'"),
        (
            {"debounce": "1s", "debounce_max_wait": "1m", "debounce_key": "{0.__class__!r}"},
            "bad placeholder",
        ),
        (
            {"debounce": "1s", "debounce_max_wait": "1m", "debounce_key": "{a[0]}"},
            "bad placeholder",
        ),
        (
            {"debounce": "1s", "debounce_max_wait": "1m", "debounce_key": "{a:>10}"},
            "bad placeholder",
        ),
        (
            {"debounce": "1s", "debounce_max_wait": "1m", "debounce_replace_payload": "yes"},
            "debounce_replace_payload='yes'",
        ),
    ],
)
def test_registration_refuses_bad_options(
    app: Celery, redis_client: redis.Redis, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(DebounceConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):

        @debounced(app, lazy=False, **options)
        def task(a: Any = None) -> None:
            pass

    # lazy decoration: refused when the app finalizes, recorded on the task (its calls
    # raise it, check and the worker name it), before any producer can enqueue
    lazy_app = make_app("redis://unused")

    @debounced(lazy_app, **options)
    def lazy(a: Any = None) -> None:
        pass

    lazy_app.finalize()
    with pytest.raises(DebounceConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        lazy.delay()
    assert package_keys(redis_client) == []


def test_fixed_window_when_max_wait_equals_window(app: Celery) -> None:
    started: list[float] = []

    @debounced(
        app,
        debounce="800ms",
        debounce_key="k",
        debounce_max_wait="800ms",
    )
    def work() -> None:
        started.append(time.time())

    with running_worker(app):
        t0 = time.time()
        first = work.delay()
        deadline = list_windows(app)[0].deadline
        time.sleep(0.4)
        assert work.delay().id == first.id
        assert list_windows(app)[0].deadline == deadline  # later calls only join
        first.get(timeout=10)
    assert t0 + 0.75 <= started[0] <= t0 + 0.8 + 1.0


@pytest.mark.parametrize(
    ("template", "args", "kwargs"),
    [
        ("{user}", (None,), {}),
        ("{user}", ({"a": 1},), {}),
        ("{user}", (["a"],), {}),
        ("{user.id}", ({"name": "x"},), {}),
        ("{user.id}", ("not-a-mapping",), {}),
        ("{0.__class__}", ("text",), {}),
        ("{0.__class__}", ({"x": 1},), {}),
        ("{opts.a}", ("u1",), {"opts": {"a": None}}),
    ],
)
def test_unresolvable_keys_raise_and_write_nothing(
    app: Celery,
    redis_client: redis.Redis,
    template: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    @debounced(
        app,
        debounce="1s",
        debounce_key=template,
        debounce_max_wait="1m",
    )
    def task(user: Any, opts: Any = None) -> None:
        pass

    with pytest.raises(DebounceKeyError):
        task.apply_async(args, kwargs)
    assert package_keys(redis_client) == []
    assert broker_is_empty(app)


@pytest.mark.parametrize("template", ["{missing}", "{3}"])
def test_a_placeholder_the_signature_cannot_fill_is_refused_at_registration_and_per_call(
    app: Celery, redis_client: redis.Redis, template: str
) -> None:
    """On the task, the signature is known when it is registered: refused there. As a
    per-call ``debounce_key=`` it is refused when the call resolves it, writing nothing."""
    with pytest.raises(DebounceConfigError, match="debounce_key"):

        @debounced(
            app,
            debounce="1s",
            debounce_key=template,
            debounce_max_wait="1m",
        )
        def bad(user: Any, opts: Any = None) -> None:
            pass

        assert bad.name  # builds the task class

    @debounced(
        app,
        debounce="1s",
        debounce_key="{user}",
        debounce_max_wait="1m",
    )
    def good(user: Any, opts: Any = None) -> None:
        pass

    with pytest.raises(DebounceKeyError):
        good.apply_async(("u1",), debounce_key=template)
    assert package_keys(redis_client) == []
    assert broker_is_empty(app)


def test_key_placeholders_bind_to_the_signature(app: Celery) -> None:
    @debounced(
        app,
        debounce="1m",
        debounce_key="{0}/{kind}/{meta.org}",
        debounce_max_wait="1m",
    )
    def task(user: str, kind: str = "full", meta: Any = None) -> None:
        pass

    a = task.delay("u1", meta={"org": "acme"})
    b = task.delay(user="u1", kind="full", meta={"org": "acme"})
    assert a.id == b.id
    assert [w.key for w in list_windows(app)] == ["u1/full/acme"]


def test_no_key_means_a_digest_of_the_arguments(app: Celery) -> None:
    @debounced(app, debounce="1m", debounce_max_wait="1m")
    def task(a: int, b: int = 2) -> None:
        pass

    assert task.delay(1).id == task.delay(1, 2).id == task.delay(a=1, b=2).id
    assert task.delay(1, 3).id != task.delay(1).id

    @debounced(app, debounce="1m", debounce_max_wait="1m")
    def keyword_only(a: int, *, mode: str = "x", **extra: Any) -> None:
        pass

    # keyword-only arguments and **kwargs are part of the digest too
    assert keyword_only.delay(1).id == keyword_only.delay(1, mode="x").id
    assert keyword_only.delay(1, mode="y").id != keyword_only.delay(1, mode="z").id
    assert keyword_only.delay(1, mode="y").id != keyword_only.delay(1).id
    assert keyword_only.delay(1, extra=1).id != keyword_only.delay(1, extra=2).id
    # a by-name producer: its kwargs, as given, are part of the digest
    by_name = [
        send_task(
            app, "by.name", args=(1,), kwargs={"m": m}, debounce="1m", debounce_max_wait="1m"
        ).id
        for m in (1, 2, 1)
    ]
    assert by_name[0] != by_name[1] and by_name[0] == by_name[2]


def test_same_key_under_two_tasks_is_two_windows(app: Celery) -> None:
    @debounced(
        app,
        name="a",
        debounce="1m",
        debounce_key="k:{0}",
        debounce_max_wait="1m",
    )
    def a(x: str) -> None:
        pass

    @debounced(
        app,
        name="a:k",
        debounce="1m",
        debounce_key="{0}",
        debounce_max_wait="1m",
    )
    def b(x: str) -> None:
        pass

    # without the length prefix both would be "a:k:x"
    assert a.delay("x").id != b.delay("k:x").id
    assert len(list_windows(app)) == 2


def test_claimed_window_is_never_changed_and_the_next_call_opens_a_new_one(
    app_factory: Any, broker: Broker
) -> None:
    """A call while a window's run is in flight opens a new window, which later calls
    join, and each window runs once."""
    app = app_factory(**broker.conf)
    running, release = threading.Event(), threading.Event()
    seen: list[int] = []

    @debounced(
        app,
        debounce="200ms",
        debounce_key="k",
        debounce_max_wait="5s",
        debounce_replace_payload=True,
    )
    def slow(revision: int) -> int:
        seen.append(revision)
        if revision == 1:
            running.set()
            release.wait(10)
        return revision

    with running_worker(app):
        first = slow.delay(1)
        assert running.wait(15)
        (claimed,) = list_windows(app)
        assert claimed.state == "claimed" and claimed.task_id == first.id
        second = slow.delay(2)  # arrives while the first run is in flight
        assert second.id != first.id
        assert slow.delay(3).id == second.id
        release.set()
        assert first.get(timeout=15) == 1
        assert second.get(timeout=15) == 3
    assert seen == [1, 3]


def test_openers_routing_priority_headers_and_expires_win(app: Celery) -> None:
    seen: dict[str, Any] = {}

    @debounced(
        app,
        bind=True,
        debounce="300ms",
        debounce_key="k",
        debounce_max_wait="5s",
    )
    def work(self: Any) -> None:
        seen["queue"] = self.request.delivery_info.get("routing_key")
        seen["tag"] = getattr(self.request, "tag", None)
        seen["expires"] = self.request.expires

    with running_worker(app, queues=["q1"]):
        first = work.apply_async(queue="q1", headers={"tag": "opener"}, expires=60)
        # later calls cannot move the run to a queue nobody consumes, nor change headers
        assert work.apply_async(queue="q-nobody", headers={"tag": "late"}).id == first.id
        first.get(timeout=10)
    assert seen["queue"] == "q1"
    assert seen["tag"] == "opener"
    assert seen["expires"] is not None  # relative expires: measured from the dispatch


def test_racing_producers_in_several_processes_open_one_window(
    redis_server: str, redis_client: redis.Redis
) -> None:
    from race_producer import produce

    ctx = multiprocessing.get_context("spawn")
    producers = 4
    barrier, started, out = ctx.Barrier(producers), ctx.Value("i", 0), ctx.Queue()
    procs = [
        ctx.Process(
            target=produce, args=(redis_server, "race", barrier, started, producers, 100, out)
        )
        for _ in range(producers)
    ]
    for proc in procs:
        proc.start()
    try:
        results = [out.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
    assert [proc.exitcode for proc in procs] == [0] * producers
    # they raced: every process was still calling after every other one had started
    assert max(first for _, first, _ in results) <= min(last for _, _, last in results)
    ids = {tid for batch, _, _ in results for tid in batch}
    assert len(ids) == 1
    windows = list_windows(make_app(redis_server, name="race"), key_glob="k:same")
    assert len(windows) == 1
    calls = sum(len(batch) for batch, _, _ in results)
    assert windows[0].calls == calls >= producers * 101
    assert windows[0].task_id == ids.pop()


@pytest.mark.redis_only("Redis keys expire; PostgreSQL's sweep: tests/store/postgres")
def test_no_keys_left_behind_after_the_history_ttl(
    app_factory: Any, redis_client: redis.Redis
) -> None:
    app = app_factory(debounce_history_ttl="2s")

    @debounced(
        app,
        debounce="1s",  # the 50 calls fit in it on a loaded machine: five windows
        debounce_key="k:{0}",
        debounce_max_wait="2s",
    )
    def work(x: int) -> int:
        return x

    with running_worker(app):
        results = {work.delay(i % 5).id: i % 5 for i in range(50)}
        assert len(results) == 5
        for task_id, value in results.items():
            assert app.AsyncResult(task_id).get(timeout=10) == value
        assert package_keys(redis_client)  # the finished windows' history
        wait_until(lambda: package_keys(redis_client) == [], timeout=10)


def test_retries_never_pass_through_the_gate_again(app: Celery) -> None:
    attempts: list[int] = []

    @debounced(
        app,
        bind=True,
        debounce="200ms",
        debounce_key="k",
        debounce_max_wait="2s",
        max_retries=3,
        default_retry_delay=0.05,
    )
    def flaky(self: Any) -> str:
        attempts.append(self.request.retries)
        if self.request.retries < 2:
            raise self.retry()
        return "ok"

    with running_worker(app):
        result = flaky.delay()
        assert result.get(timeout=15) == "ok"
    assert attempts == [0, 1, 2]
    assert list_windows(app) == []


def test_countdown_or_eta_with_debounce_is_refused(app: Celery, redis_client: redis.Redis) -> None:
    @debounced(app, debounce="1s", debounce_max_wait="1m")
    def task() -> None:
        pass

    with pytest.raises(DebounceConfigError, match="countdown=5"):
        task.apply_async(countdown=5)
    with pytest.raises(DebounceConfigError, match="eta="):
        task.apply_async(eta=time.time() + 5)
    assert package_keys(redis_client) == []


def test_bad_call_signature_raises_celerys_type_error(
    app: Celery, redis_client: redis.Redis
) -> None:
    @debounced(app, debounce="1s", debounce_max_wait="1m")
    def task(a: int) -> None:
        pass

    with pytest.raises(TypeError):
        task.delay(1, 2, 3)
    with pytest.raises(TypeError):
        task.delay(b=1)
    assert package_keys(redis_client) == []


def test_unserializable_argument_raises_and_writes_nothing(
    app: Celery, redis_client: redis.Redis
) -> None:
    @debounced(app, debounce="1s", debounce_key="k", debounce_max_wait="1m")
    def task(a: Any) -> None:
        pass

    with pytest.raises(EncodeError):
        task.delay(object())
    assert package_keys(redis_client) == []


def test_payload_the_worker_does_not_accept_is_refused_by_the_worker_not_the_dispatcher(
    app_factory: Any, redis_client: Any, store: StoreCase
) -> None:
    """The dispatcher publishes stored bodies as they are (it never deserializes one);
    the worker refuses content it does not accept, as Celery always did, and the
    window is finished as REJECTED instead of lingering."""
    producer = app_factory(task_serializer="pickle", accept_content=["json", "pickle"])
    consumer = app_factory(accept_content=["json"])
    for app in (producer, consumer):

        @debounced(
            app,
            name="pickled",
            debounce="100ms",
            debounce_key="k",
            debounce_max_wait="1s",
        )
        def pickled(x: Any) -> None:
            raise AssertionError("must never run")

        @debounced(
            app,
            name="fine",
            debounce="100ms",
            debounce_key="k",
            debounce_max_wait="1s",
        )
        def fine(x: int) -> int:
            return x

    bad = producer.tasks["pickled"].delay({1, 2})  # a set: pickle only
    with running_worker(consumer):
        ok = consumer.tasks["fine"].delay(5)
        assert ok.get(timeout=10) == 5  # the bad record does not block other windows
        wait_until(lambda: state_of(consumer, bad.id) == "finished")
        if store.name == "redis":  # Redis only: the result state, which no store read returns
            assert redis_client.hget(f"debounce:{{0}}:win:{bad.id}", "rs") == b"REJECTED"
    assert list_windows(consumer, states=["quarantined"]) == []


@pytest.mark.redis_only("a Redis URL; PostgreSQL's outages: tests/store/postgres")
def test_redis_outage_is_an_error_within_seconds(app_factory: Any) -> None:
    from celery_debounce.testing.servers import free_port

    app = app_factory(
        debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0", debounce_redis_timeout=1
    )

    @debounced(app, debounce="1s", debounce_max_wait="1m")
    def task() -> None:
        pass

    start = time.monotonic()
    with pytest.raises(DebounceBackendError, match="unreachable"):
        task.delay()
    assert time.monotonic() - start < 5


def test_non_redis_broker_without_debounce_redis_url_is_a_clear_error() -> None:
    app = Celery("memory", broker="memory://", set_as_current=False)

    @debounced(app, debounce="1s", debounce_max_wait="1m")
    def task() -> None:
        pass

    with pytest.raises(DebounceConfigError, match="debounce_redis_url"):
        task.delay()


def test_eager_mode_runs_inline_without_redis() -> None:
    app = Celery("eager", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @debounced(app, debounce="1h", debounce_max_wait="2h")
    def double(x: int) -> int:
        return x * 2

    assert double.delay(21).get() == 42
    with pytest.raises(DebounceConfigError):
        double.apply_async((1,), countdown=3)


def test_dispatcher_can_be_switched_off_and_run_elsewhere(app_factory: Any) -> None:
    from celery_debounce import Dispatcher, DispatcherStep

    app = app_factory(debounce_dispatcher=False)

    @debounced(app, debounce="100ms", debounce_key="k", debounce_max_wait="1s")
    def work() -> str:
        return "ran"

    with running_worker(app) as worker:
        assert not any(isinstance(step, DispatcherStep) for step in worker.steps)
        result = work.delay()
        wait_until(lambda: list_windows(app)[0].deadline < time.time() - 0.3)
        assert [w.state for w in list_windows(app)] == ["pending"]  # nobody dispatches it
        dispatcher = Dispatcher(app, name="standalone")
        dispatcher.start()
        try:
            assert result.get(timeout=10) == "ran"
        finally:
            dispatcher.stop()


def test_task_level_queue_is_stored_with_the_window(app: Celery) -> None:
    seen: dict[str, Any] = {}

    @debounced(
        app,
        bind=True,
        queue="reports",
        priority=3,
        debounce="200ms",
        debounce_key="k",
        debounce_max_wait="2s",
    )
    def work(self: Any) -> str:
        seen["queue"] = self.request.delivery_info.get("routing_key")
        return "ran"

    result = work.delay()
    from celery_debounce.testing import debounce_windows

    (window,) = debounce_windows(app)
    assert window.options == {"priority": 3, "queue": "reports"}  # any dispatcher applies them
    with running_worker(app, queues=["reports"]):
        assert result.get(timeout=10) == "ran"
    assert seen["queue"] == "reports"
