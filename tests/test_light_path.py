"""The per-call shortcuts of ``.delay()`` keep Celery's behaviour: the lighter result
object (``result.py``), the cached ``task_always_eager`` (``confcache.py``) and the
per-thread connection of the gate (``store._Lease``)."""

from __future__ import annotations

import pickle
import threading
from typing import Any

import redis
from celery import Celery, group
from celery.result import AsyncResult
from helpers import make_app, running_worker, wait_until

from celery_debounce import DebouncedTask
from celery_debounce.backend import backend_for
from celery_debounce.confcache import always_eager


def _task(app: Celery, **options: Any) -> Any:
    @app.task(base=DebouncedTask, shared=False, name="light.t", debounce="300ms",
              debounce_max_wait="2s", debounce_key="{0}", **options)
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

    @app.task(base=Custom, shared=False, name="light.c", debounce="1h",
              debounce_max_wait="2h", debounce_key="k")
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
    assert not list(redis_client.scan_iter(match="debounce:*:open:*"))
    app.conf.update(task_always_eager=False)
    assert t.delay(3).state == "PENDING"
    assert len(list(redis_client.scan_iter(match="debounce:*:open:*"))) == 1
    app.conf["task_always_eager"] = True
    assert always_eager(app) is True
    app.conf.pop("task_always_eager")
    assert always_eager(app) is False
    app.conf.setdefault("task_always_eager", True)
    assert always_eager(app) is app.conf.task_always_eager
    app.config_from_object({"task_always_eager": True}, force=True)
    assert always_eager(app) is True is app.conf.task_always_eager
    assert "__class__" not in app.conf.changes


def test_each_thread_keeps_one_connection_and_a_killed_one_is_replaced(
    redis_server: str, redis_client: redis.Redis
) -> None:
    app = make_app(redis_server)
    t = _task(app, debounce_replace_payload=False)
    store = backend_for(app)
    assert store._lease is not None
    first = t.delay(1)
    conn = store._lease.conn
    for _ in range(5):
        assert t.delay(1).id == first.id
    assert store._lease.conn is conn  # kept, not checked out per call
    redis_client.client_kill_filter(_type="normal", skipme=True)
    assert t.delay(1).id == first.id  # reconnected before sending: not an unknown outcome
    ids: list[str] = []
    conns: list[Any] = []

    def other() -> None:
        ids.append(t.delay(1).id)
        conns.append(store._lease.conn)  # type: ignore[union-attr]

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert ids == [first.id] and conns[0] is not conn
    conns.clear()
    pool = store.client.connection_pool
    wait_until(lambda: len(pool._in_use_connections) == 1, timeout=5)  # released at exit
    record = redis_client.hgetall(next(redis_client.scan_iter(match="debounce:*:open:*")))
    assert record[b"n"] == b"8"
