"""Parity everywhere (issue 19, items 10 and 11): what a debounced call refuses, it
refuses at call time, whatever the way in, and nothing is written.

* canvas positions Celery applies later (a chain's later steps, a chord's body)
  are checked when the canvas is applied, not inside the worker after the head ran;
* eager mode (``task_always_eager``) runs the checks of a real call, then runs inline;
* ``debounce_collect`` wraps ``run`` for every task shape (also an inherited ``run``);
* ``map``/``starmap``/``chunks`` of a task with a window are refused (they would run
  it inline, never gated);
* unknown ``debounce_*`` names are refused at registration, per call and at settings
  load, the closest name suggested;
* ``enqueue_many`` sends the signals a single call sends (``call_suppressed``).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group, shared_task
from celery.canvas import xmap
from helpers import make_app, package_keys

from celery_debounce import (
    DebounceConfigError,
    DebouncedCall,
    DebouncedTask,
    DebounceKeyError,
    DebouncePayloadError,
    enqueue_many,
    send_task,
)
from celery_debounce import signals as sig
from celery_debounce.admin import DebounceAdmin

LEAD = {"debounce": "1h", "debounce_max_wait": "2h", "debounce_key": "{0}",
        "debounce_leading": True, "debounce_trailing": False}
TRAIL = {"debounce": "1h", "debounce_max_wait": "2h", "debounce_key": "{0}"}


def _nothing_written(app: Celery) -> None:
    """No window in the windows' Redis, no message in the broker."""
    windows = redis.Redis.from_url(app.conf.debounce_redis_url)
    broker = redis.Redis.from_url(app.conf.broker_url)
    assert package_keys(windows) == []
    assert broker.dbsize() == 0, broker.keys()


def _tasks(app: Celery) -> tuple[Any, Any, Any]:
    @app.task(shared=False, name="parity.plain")
    def plain(x: Any = None) -> Any:  # pragma: no cover - never run
        return x

    @app.task(base=DebouncedTask, shared=False, name="parity.lead", **LEAD)
    def lead(x: Any = "k") -> Any:  # pragma: no cover - never run
        return x

    @app.task(base=DebouncedTask, shared=False, name="parity.trail", **TRAIL)
    def trail(x: Any = "k") -> Any:  # pragma: no cover - never run
        return x

    return plain, lead, trail


# -- 1. canvas positions applied later are checked when the canvas is applied ------------
CANVAS = {
    "chain tail after a plain head": lambda p, lead, t: chain(p.s(1), lead.s()),
    "chain middle": lambda p, lead, t: chain(p.s(1), lead.s(), p.s()),
    "chain tail after a debounced head": lambda p, lead, t: chain(t.s("h"), lead.s()),
    "chord body": lambda p, lead, t: chord([p.s(1), p.s(2)], lead.s()),
    "chord body after debounced members": lambda p, lead, t: chord([t.s("a")], lead.s()),
    "group in a chain's tail": lambda p, lead, t: chain(p.s(1), group(lead.s(), lead.s())),
    "chain in a chord body": lambda p, lead, t: chord([p.s(1)], chain(p.s(), lead.s())),
    "countdown on a chain tail": lambda p, lead, t: chain(p.s(1), t.s().set(countdown=5)),
    "misspelt option on a chord body": lambda p, lead, t: chord(
        [p.s(1)], t.s().set(debounce_replace_paylod=True)),
}


@pytest.mark.parametrize("build", CANVAS.values(), ids=list(CANVAS))
def test_a_deferred_canvas_position_is_refused_when_the_canvas_is_applied(
        app: Celery, build: Any) -> None:
    plain, lead, trail = _tasks(app)
    with pytest.raises(DebounceConfigError) as refused:
        build(plain, lead, trail).apply_async()
    text = str(refused.value)
    assert "refused when the canvas is applied" in text
    assert any(name in text for name in (
        "debounce_leading=True, debounce_trailing=False", "countdown=5",
        "debounce_replace_paylod=True"))
    _nothing_written(app)


def test_a_trailing_task_later_in_a_canvas_is_accepted(app: Celery) -> None:
    plain, lead, trail = _tasks(app)
    results = [chain(plain.s(1), trail.s()).apply_async(),
               chord([plain.s(1)], trail.s()).apply_async()]
    broker = redis.Redis.from_url(app.conf.broker_url)
    assert broker.llen("celery") == 2  # the two plain heads, published
    for result in results:  # unsubscribe while the result backend is up
        app.backend.remove_pending_result(result)


# -- 2. eager mode runs the checks of a real call -------------------------------------------
def _eager_app(**conf: Any) -> Celery:
    app = Celery("eager-parity", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, **conf)
    return app


def test_eager_mode_refuses_what_a_real_call_refuses_and_needs_no_redis() -> None:
    app = _eager_app(debounce_max_payload_bytes=200)

    @app.task(base=DebouncedTask, shared=False, debounce="1h", debounce_max_wait="2h",
              debounce_key="user:{user_id}")
    def keyed(user: str) -> str:
        return user

    @app.task(base=DebouncedTask, shared=False, **LEAD)
    def lead(x: str) -> str:
        return x

    @app.task(base=DebouncedTask, shared=False, debounce="1h", debounce_max_wait="2h")
    def blob(data: str) -> int:
        return len(data)

    with pytest.raises(DebounceKeyError, match="user_id"):
        keyed.delay("u1")
    with pytest.raises(DebounceConfigError, match="cannot be combined with task_id="):
        lead.apply_async(("k",), task_id="fixed")
    with pytest.raises(DebouncePayloadError, match="debounce_max_payload_bytes=200"):
        blob.delay("x" * 500)
    with pytest.raises(DebounceConfigError, match="debounce_replace_paylod"):
        blob.apply_async(("x",), debounce_replace_paylod=True)
    with pytest.raises(DebouncePayloadError):
        send_task(app, blob.name, ("x" * 500,))
    with pytest.raises(DebouncePayloadError):  # one refused: none runs
        enqueue_many(blob, [(("ok",), {}), (("x" * 500,), {})])
    assert blob.delay("abc").get() == 3  # a valid call still runs inline
    assert lead.delay("k").get() == "k"
    assert enqueue_many(blob, [(("ab",), {})])[0].get() == 2
    assert blob.apply_async(("x" * 500,), debounce=False).get() == 500  # plainly, unchecked


# -- 3. debounce_collect wraps run for every task shape ----------------------------------------
class _PlainBase(DebouncedTask):
    """A class-based task whose run a collect subclass inherits."""

    def run(self, calls: Any) -> Any:
        return [[type(c).__name__, list(c.args) if isinstance(c, DebouncedCall) else c]
                for c in calls]


class _Registered(DebouncedTask):
    name = "parity.collect.registered"
    debounce = "1h"
    debounce_max_wait = "2h"
    debounce_collect = True

    def run(self, calls: Any) -> Any:
        return [[type(c).__name__, list(c.args)] for c in calls]


@shared_task(base=DebouncedTask, name="parity.collect.shared", debounce="1h",
             debounce_max_wait="2h", debounce_collect=True, shared=False)
def _shared(calls: Any) -> Any:
    return [[type(c).__name__, list(c.args)] for c in calls]


def _collect_task(app: Celery, shape: str) -> Any:
    opts: dict[str, Any] = {"debounce": "1h", "debounce_max_wait": "2h",
                            "debounce_collect": True, "shared": False}
    if shape == "function":
        @app.task(base=DebouncedTask, name="parity.collect.fn", **opts)
        def fn(calls: Any) -> Any:
            return [[type(c).__name__, list(c.args)] for c in calls]
        return fn
    if shape == "bind":
        @app.task(base=DebouncedTask, bind=True, name="parity.collect.bound", **opts)
        def bound(self: Any, calls: Any) -> Any:
            return [[type(c).__name__, list(c.args)] for c in calls]
        return bound
    if shape == "register_task":
        return app.register_task(_Registered())
    if shape == "subclass inheriting run":
        class Inherits(_PlainBase):
            name = "parity.collect.inherits"
            debounce = "1h"
            debounce_max_wait = "2h"
            debounce_collect = True
        return app.register_task(Inherits())
    if shape == "shared_task":
        app.finalize()
        return _shared if isinstance(_shared, DebouncedTask) else app.tasks[_shared.name]
    assert shape == "custom app Task class"
    custom = Celery("custom-collect", task_cls=_PlainBase, broker="memory://",
                    set_as_current=False)
    custom.conf.task_always_eager = True

    @custom.task(name="parity.collect.custom", **opts)
    def custom_fn(calls: Any) -> Any:
        return [[type(c).__name__, list(c.args)] for c in calls]
    return custom_fn


SHAPES = ["function", "bind", "register_task", "subclass inheriting run", "shared_task",
          "custom app Task class"]


@pytest.mark.parametrize("shape", SHAPES)
def test_debounce_collect_wraps_run_for_every_task_shape(shape: str) -> None:
    app = _eager_app()
    task = _collect_task(app, shape)
    if not task.app.conf.task_always_eager:
        task.app.conf.task_always_eager = True
    assert task.delay(1, 2).get() == [["DebouncedCall", [1, 2]]]
    # as the worker gets the spliced body: elements [ms, args, kwargs]
    assert task.run([[1700000000000, [3], {}]]) == [["DebouncedCall", [3]]]


def test_a_plain_subclass_of_a_collect_class_gets_its_own_arguments() -> None:
    app = _eager_app()

    class Collecting(DebouncedTask):
        debounce = "1h"
        debounce_max_wait = "2h"
        debounce_collect = True

        def run(self, *args: Any) -> Any:
            return list(args)

    class Plain(Collecting):
        name = "parity.plain_sub"
        debounce_collect = False

    task = app.register_task(Plain())
    assert task.delay(1, 2).get() == [1, 2]


# -- 4. map / starmap / chunks ---------------------------------------------------------------
def test_map_starmap_chunks_of_a_debounced_task_are_refused_at_call_time(app: Celery) -> None:
    plain, lead, trail = _tasks(app)
    for make in (lambda: trail.map([1, 2]), lambda: trail.starmap([(1,), (2,)]),
                 lambda: trail.chunks([(1,), (2,)], 1)):
        with pytest.raises(DebounceConfigError, match=r"runs the task inline"):
            make()
    with pytest.raises(DebounceConfigError, match=r"parity.trail: map\(\) runs the task inline"):
        xmap(trail.s(), [1, 2], app=app).apply_async()  # built by hand: refused at publish
    _nothing_written(app)

    @app.task(base=DebouncedTask, shared=False, name="parity.no_window")
    def no_window(x: int) -> int:  # pragma: no cover - never run
        return x

    no_window.map([1, 2]).apply_async()  # no window: nothing to debounce, Celery's map


# -- 5. unknown debounce_* names ---------------------------------------------------------------
def test_an_unknown_task_option_is_refused_at_registration(app: Celery) -> None:
    with pytest.raises(DebounceConfigError,
                       match=r"debounce_colect=True: unknown task option.*did you mean "
                             r"'debounce_collect'"):
        @app.task(base=DebouncedTask, shared=False, lazy=False, debounce="1h",
                  debounce_max_wait="2h", debounce_colect=True)
        def typo(calls: Any) -> None:  # pragma: no cover - never registered
            pass

    class Helpers(DebouncedTask):  # a method named debounce_* is not an option
        def debounce_helper(self) -> int:
            return 1

    assert Helpers().debounce_helper() == 1


def test_an_unknown_call_option_is_refused_and_nothing_is_written(app: Celery) -> None:
    plain, lead, trail = _tasks(app)
    ways = [
        lambda: trail.apply_async(("k",), debounce_replace_paylod=True),
        lambda: trail.apply_async(("k",), debounce=False, debounce_replace_paylod=True),
        lambda: trail.s("k").set(debounce_replace_paylod=True).delay(),
        lambda: send_task(app, trail.name, ("k",), debounce_replace_paylod=True),
        lambda: enqueue_many(trail, [(("k",), {})], debounce_replace_paylod=True),
    ]
    for call in ways:
        with pytest.raises(DebounceConfigError,
                           match=r"debounce_replace_paylod=True: unknown option.*did you "
                                 r"mean 'debounce_replace_payload'"):
            call()
    _nothing_written(app)


def test_an_unknown_setting_is_refused_at_settings_load(redis_server: str) -> None:
    app = make_app(redis_server, debounce_redis_ulr="redis://x")

    @app.task(base=DebouncedTask, shared=False, **TRAIL)
    def job(x: str) -> None:  # pragma: no cover - never run
        pass

    with pytest.raises(DebounceConfigError,
                       match=r"debounce_redis_ulr='redis://x': unknown setting.*did you mean "
                             r"'debounce_redis_url'"):
        job.delay("k")


def test_only_the_packages_prefix_counts_in_django_style_settings(redis_server: str) -> None:
    class Django:
        CELERY_BROKER_URL = f"{redis_server}/1"
        CELERY_DEBOUNCE_REDIS_URL = f"{redis_server}/0"
        DEBOUNCE_SOMETHING_OF_THE_PROJECT = 1  # not Celery's, not ours

    app = Celery("django-style", set_as_current=False)
    app.config_from_object(Django, namespace="CELERY")
    from celery_debounce.settings import Settings
    assert Settings.from_app(app).redis_url == f"{redis_server}/0"

    Django.CELERY_DEBOUNCE_KEY_PREFX = "x"  # type: ignore[attr-defined]
    app = Celery("django-typo", set_as_current=False)
    app.config_from_object(Django, namespace="CELERY")
    with pytest.raises(DebounceConfigError,
                       match=r"CELERY_DEBOUNCE_KEY_PREFX='x': unknown setting.*did you mean "
                             r"'CELERY_DEBOUNCE_KEY_PREFIX'"):
        Settings.from_app(app)


# -- 6. enqueue_many sends the per-call signals -------------------------------------------------
def test_enqueue_many_sends_the_signals_a_single_call_sends(app: Celery) -> None:
    plain, lead, trail = _tasks(app)
    heard: list[tuple[str, str]] = []

    def listen(name: str) -> Any:
        def receiver(sender: str, key: str, **kwargs: Any) -> None:
            heard.append((name, key))
        return receiver

    receivers = {s: listen(s.name) for s in (sig.window_opened, sig.call_absorbed,
                                              sig.call_suppressed)}
    for s, r in receivers.items():
        s.connect(r, weak=False)
    try:
        for _ in range(4):
            lead.delay("single")
        enqueue_many(lead, [(("bulk",), {})] * 4)
    finally:
        for s, r in receivers.items():
            s.disconnect(r)
    single = [name for name, key in heard if key == "single"]
    bulk = [name for name, key in heard if key == "bulk"]
    assert single == ["window_opened"] + ["call_suppressed"] * 3
    assert bulk == single
    assert DebounceAdmin(app).stats().tasks[lead.name].suppressed == 6
