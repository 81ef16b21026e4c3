"""Any task shape works, routed where plain Celery would route it (issue 9, items 4 and 5).

The route is resolved at call time in the producer (``task_routes``, router
functions, the task's own ``queue=``) and stored by name with the window, so a
dispatcher that does not import the task, and has no ``task_routes``, publishes
to the same queue.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from celery import Celery, Task, shared_task
from helpers import debounced, make_app, running_worker

from celery_debounce import DebouncedTask, enqueue_many, send_task
from celery_debounce.dispatch.dispatcher import Dispatcher


def _vip_router(
    name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any
) -> dict[str, str] | None:
    if name == "shapes.routed" and args and str(args[0]).startswith("vip"):
        return {"queue": "q-vip"}
    return None


def _bare_dispatcher(redis_server: str) -> Dispatcher:
    """A dispatcher on an app that imports no task and has no task_routes."""
    return Dispatcher(make_app(redis_server, name="bare"))


def _due() -> None:
    time.sleep(0.01)


def test_delay_send_task_and_enqueue_many_publish_where_plain_celery_routes(
    app_factory: Any,
    redis_server: str,
) -> None:
    routes = [_vip_router, {"shapes.routed": {"queue": "q-routes"}}]
    app = app_factory(task_routes=routes)
    producer = app_factory(task_routes=routes)  # a producer that only knows the name

    @debounced(
        app,
        name="shapes.routed",
        debounce="1ms",
        debounce_max_wait="1ms",
        debounce_key="{0}",
    )
    def routed(x: str) -> str:
        return x

    @app.task(shared=False, name="shapes.plain_twin")
    def twin(x: str) -> str:
        return x

    broker = redis.Redis.from_url(app.conf.broker_url)
    # what plain Celery does with the same routes
    app.send_task("shapes.routed", ("vip-p",))
    app.send_task("shapes.routed", ("other-p",))
    assert broker.llen("q-vip") == 1 and broker.llen("q-routes") == 1
    broker.flushdb()

    results = [
        routed.delay("vip-1"),
        routed.delay("std-1"),
        send_task(producer, "shapes.routed", ("vip-2",), debounce="1ms", debounce_max_wait="1ms"),
        send_task(producer, "shapes.routed", ("std-2",), debounce="1ms", debounce_max_wait="1ms"),
        *enqueue_many(routed, [(("vip-3",), {}), (("std-3",), {})]),
    ]
    _due()
    assert _bare_dispatcher(redis_server).dispatch_once()[0] == 6
    assert broker.llen("q-vip") == 3
    assert broker.llen("q-routes") == 3
    assert broker.llen("celery") == 0
    with running_worker(app, queues=["q-vip", "q-routes"]):
        assert [r.get(timeout=10) for r in results] == [
            "vip-1",
            "std-1",
            "vip-2",
            "std-2",
            "vip-3",
            "std-3",
        ]


def test_the_tasks_own_queue_and_priority_are_stored_with_the_window(
    app_factory: Any,
    redis_server: str,
) -> None:
    app = app_factory()

    @debounced(
        app,
        name="shapes.own",
        debounce="1ms",
        debounce_max_wait="1ms",
        queue="q-own",
        priority=3,
    )
    def own(x: int) -> int:
        return x

    broker = redis.Redis.from_url(app.conf.broker_url)
    result = send_task(app, "shapes.own", (1,))  # by name, the task registered here
    result2 = own.delay(2)
    _due()
    assert _bare_dispatcher(redis_server).dispatch_once()[0] == 2
    assert broker.llen("q-own\x06\x163") == 2  # kombu's list for priority 3
    with running_worker(app, queues=["q-own"]):
        assert (result.get(timeout=10), result2.get(timeout=10)) == (1, 2)


class ReportTask(DebouncedTask):
    """A class-based task: no ``__header__`` (Celery adds it only to function tasks)."""

    name = "shapes.report"
    debounce = "100ms"
    debounce_max_wait = "1s"
    debounce_key = "{0}"

    def run(self, x: int, scale: int = 1) -> int:
        return x * scale


def test_a_class_based_task_registered_with_register_task(app_factory: Any) -> None:
    app = app_factory()
    task = app.register_task(ReportTask())
    with running_worker(app):
        first = task.delay(2)
        again = app.tasks["shapes.report"].apply_async((2,), {"scale": 5})
        assert first.id == again.id
        assert first.get(timeout=10) == 2  # the opener's arguments


@shared_task(
    base=DebouncedTask,
    name="shapes.shared",
    debounce="100ms",
    debounce_max_wait="1s",
    debounce_key="{0}",
)
def shared(x: int) -> int:
    return x + 1


def test_a_shared_task_with_the_debounced_base(app_factory: Any) -> None:
    app = app_factory()
    app.finalize()
    task = app.tasks["shapes.shared"]
    assert isinstance(task, DebouncedTask)
    with running_worker(app):
        assert task.delay(1).get(timeout=10) == 2


class AuditedTask(Task):  # type: ignore[misc]
    """An app-wide custom Task class."""

    audited: list[str] = []

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        AuditedTask.audited.append(task_id)


class DebouncedAuditedTask(DebouncedTask, AuditedTask):
    pass


def _app_with_task_cls(redis_server: str, task_cls: type) -> Celery:
    app = Celery(f"custom-{task_cls.__name__}", task_cls=task_cls, set_as_current=False)
    app.conf.update(make_app(redis_server).conf.table(with_defaults=False))
    return app


def test_an_app_with_a_custom_task_class(redis_server: str, redis_client: redis.Redis) -> None:
    # the app's Task is custom; the debounced task uses it too through its base
    app = _app_with_task_cls(redis_server, AuditedTask)
    assert issubclass(app.Task, AuditedTask)

    @app.task(
        base=DebouncedAuditedTask,
        shared=False,
        name="shapes.audited",
        debounce="100ms",
        debounce_max_wait="1s",
    )
    def audited(x: int) -> int:
        return x

    # and an app whose Task class itself is debounced: every task may debounce
    app2 = _app_with_task_cls(redis_server, DebouncedAuditedTask)

    @app2.task(shared=False, name="shapes.implicit", debounce="100ms", debounce_max_wait="1s")
    def implicit(x: int) -> int:
        return x * 10

    assert isinstance(implicit, DebouncedTask)
    with running_worker(app):
        result = audited.delay(7)
        assert result.get(timeout=10) == 7
    assert result.id in AuditedTask.audited
    with running_worker(app2):
        assert implicit.delay(3).get(timeout=10) == 30


def test_route_resolution_is_cached_only_when_it_cannot_depend_on_arguments(
    app_factory: Any,
) -> None:
    from celery_debounce.producer.call import static_routing

    assert static_routing(app_factory(task_routes={"a.*": {"queue": "x"}})) == {}
    assert static_routing(app_factory(task_routes=[_vip_router])) is None
    assert static_routing(app_factory()) == {}
