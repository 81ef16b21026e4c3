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

import re
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group, shared_task
from celery.canvas import xmap
from helpers import debounced, make_app, package_keys

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
from celery_debounce.ops.admin import DebounceAdmin

LEAD = {
    "debounce": "1h",
    "debounce_max_wait": "2h",
    "debounce_key": "{0}",
    "debounce_leading": True,
    "debounce_trailing": False,
}
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

    @debounced(app, name="parity.lead", **LEAD)
    def lead(x: Any = "k") -> Any:  # pragma: no cover - never run
        return x

    @debounced(app, name="parity.trail", **TRAIL)
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
        [p.s(1)], t.s().set(debounce_replace_paylod=True)
    ),
}


@pytest.mark.parametrize("build", CANVAS.values(), ids=list(CANVAS))
def test_a_deferred_canvas_position_is_refused_when_the_canvas_is_applied(
    app: Celery, build: Any
) -> None:
    plain, lead, trail = _tasks(app)
    with pytest.raises(DebounceConfigError) as refused:
        build(plain, lead, trail).apply_async()
    text = str(refused.value)
    assert "refused when the canvas is applied" in text
    assert any(
        name in text
        for name in (
            "debounce_leading=True, debounce_trailing=False",
            "countdown=5",
            "debounce_replace_paylod=True",
        )
    )
    _nothing_written(app)


def test_a_trailing_task_later_in_a_canvas_is_accepted(app: Celery) -> None:
    plain, _lead, trail = _tasks(app)
    results = [
        chain(plain.s(1), trail.s()).apply_async(),
        chord([plain.s(1)], trail.s()).apply_async(),
    ]
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

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="user:{user}",
    )
    def keyed(user: str) -> str:
        return user

    @debounced(app, **LEAD)
    def lead(x: str) -> str:
        return x

    @debounced(app, debounce="1h", debounce_max_wait="2h")
    def blob(data: str) -> int:
        return len(data)

    # a task's own template is checked against its signature at registration; a
    # per-call one when the call resolves it
    with pytest.raises(DebounceKeyError, match="user_id"):
        keyed.apply_async(("u1",), debounce_key="user:{user_id}")
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


def test_eager_canvas_members_are_checked_as_calls() -> None:
    """Celery runs an eager canvas's members with ``Task.apply``, never ``apply_async``:
    they get the same checks. Leading only is refused in every position a real run
    fixes the id of: a group member, and (checked when the eager chain or chord is
    applied, before any step runs) a chain's head and later steps and a chord's body."""
    app = _eager_app(debounce_max_payload_bytes=200)

    ran: list[Any] = []

    @app.task(shared=False, name="parity.eager.plain")
    def plain(x: Any = None) -> Any:
        ran.append(x)
        return "k"

    @debounced(app, name="parity.eager.lead", **LEAD)
    def lead(x: Any = "k") -> Any:
        return x

    @debounced(app, name="parity.eager.trail", **TRAIL)
    def trail(x: Any = "k") -> Any:
        return x

    with pytest.raises(DebounceConfigError, match="cannot be combined with task_id="):
        group(lead.s("k"), lead.s("k")).apply_async()
    with pytest.raises(DebounceConfigError, match="countdown=5"):
        chain(plain.s(1), trail.s().set(countdown=5)).apply_async()
    with pytest.raises(DebounceConfigError, match="did you mean 'debounce_replace_payload'"):
        chord([plain.s(1)], trail.s().set(debounce_replace_paylod=True)).apply_async()
    # leading only: the real run's error, before any step runs (a real chain publishes
    # nothing); later steps and a chord's body name their position, as in a real run
    fixed = "debounce_leading=True, debounce_trailing=False cannot be combined"
    with pytest.raises(DebounceConfigError, match=f"{fixed}.*no fixed id$"):
        chain(lead.s("k"), plain.s()).apply_async()
    with pytest.raises(DebounceConfigError, match=f"{fixed}.*as a chain's later step"):
        chain(plain.s(1), plain.s(), lead.s()).apply_async()
    with pytest.raises(DebounceConfigError, match=f"{fixed}.*as a chord's body"):
        chord([plain.s(1)], lead.s()).apply_async()
    with pytest.raises(DebounceConfigError, match=f"{fixed}.*as a chain's later step"):
        chain(plain.s(1), chord([plain.s()], group(trail.s(), lead.s()))).apply_async()
    assert ran == []  # every refusal came before the first step ran
    with pytest.raises(DebouncePayloadError):
        group(trail.s("x" * 500)).apply_async()
    assert chain(plain.s(1), trail.s()).apply_async().get() == "k"
    assert group(trail.s("a"), trail.s("b")).apply_async().get() == ["a", "b"]
    assert trail.apply(("z",)).get() == "z"  # apply() in eager mode: checked, then run


# -- 3. debounce_collect wraps run for every task shape ----------------------------------------
class _PlainBase(DebouncedTask):
    """A class-based task whose run a collect subclass inherits."""

    def run(self, calls: Any) -> Any:
        return [
            [type(c).__name__, list(c.args) if isinstance(c, DebouncedCall) else c] for c in calls
        ]


class _Registered(DebouncedTask):
    name = "parity.collect.registered"
    debounce = "1h"
    debounce_max_wait = "2h"
    debounce_collect = True

    def run(self, calls: Any) -> Any:
        return [[type(c).__name__, list(c.args)] for c in calls]


# shared_task registers in every app this process finalizes later (shared= is not its
# option): its own JSON serializer keeps it valid in the suite's pickle apps
@shared_task(
    base=DebouncedTask,
    name="parity.collect.shared",
    debounce="1h",
    debounce_max_wait="2h",
    debounce_collect=True,
    serializer="json",
)
def _shared(calls: Any) -> Any:
    return [[type(c).__name__, list(c.args)] for c in calls]


def _collect_task(app: Celery, shape: str) -> Any:
    opts: dict[str, Any] = {
        "debounce": "1h",
        "debounce_max_wait": "2h",
        "debounce_collect": True,
        "shared": False,
    }
    if shape == "function":

        @debounced(app, name="parity.collect.fn", **opts)
        def fn(calls: Any) -> Any:
            return [[type(c).__name__, list(c.args)] for c in calls]

        return fn
    if shape == "bind":

        @debounced(app, bind=True, name="parity.collect.bound", **opts)
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
    custom = Celery("custom-collect", task_cls=_PlainBase, broker="memory://", set_as_current=False)
    custom.conf.task_always_eager = True

    @custom.task(name="parity.collect.custom", **opts)
    def custom_fn(calls: Any) -> Any:
        return [[type(c).__name__, list(c.args)] for c in calls]

    return custom_fn


SHAPES = [
    "function",
    "bind",
    "register_task",
    "subclass inheriting run",
    "shared_task",
    "custom app Task class",
]


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
    _plain, _lead, trail = _tasks(app)
    for make in (
        lambda: trail.map([1, 2]),
        lambda: trail.starmap([(1,), (2,)]),
        lambda: trail.chunks([(1,), (2,)], 1),
    ):
        with pytest.raises(DebounceConfigError, match=r"runs the task inline"):
            make()
    with pytest.raises(DebounceConfigError, match=r"parity.trail: map\(\) runs the task inline"):
        xmap(trail.s(), [1, 2], app=app).apply_async()  # built by hand: refused at publish
    _nothing_written(app)

    @debounced(app, name="parity.no_window")
    def no_window(x: int) -> int:  # pragma: no cover - never run
        return x

    no_window.map([1, 2]).apply_async()  # no window: nothing to debounce, Celery's map


# -- 5. unknown debounce_* names ---------------------------------------------------------------
def test_an_unknown_task_option_is_refused_at_registration(app: Celery) -> None:
    with pytest.raises(
        DebounceConfigError,
        match=r"debounce_colect=True: unknown task option.*did you mean "
        r"'debounce_collect'",
    ):

        @debounced(
            app,
            lazy=False,
            debounce="1h",
            debounce_max_wait="2h",
            debounce_colect=True,
        )
        def typo(calls: Any) -> None:  # pragma: no cover - never registered
            pass

    class Helpers(DebouncedTask):  # a method named debounce_* is not an option
        def debounce_helper(self) -> int:
            return 1

    assert Helpers().debounce_helper() == 1


def test_an_unknown_call_option_is_refused_and_nothing_is_written(app: Celery) -> None:
    _plain, _lead, trail = _tasks(app)
    ways = [
        lambda: trail.apply_async(("k",), debounce_replace_paylod=True),
        lambda: trail.apply_async(("k",), debounce=False, debounce_replace_paylod=True),
        lambda: trail.s("k").set(debounce_replace_paylod=True).delay(),
        lambda: send_task(app, trail.name, ("k",), debounce_replace_paylod=True),
        lambda: enqueue_many(trail, [(("k",), {})], debounce_replace_paylod=True),
    ]
    for call in ways:
        with pytest.raises(
            DebounceConfigError,
            match=r"debounce_replace_paylod=True: unknown option.*did you "
            r"mean 'debounce_replace_payload'",
        ):
            call()
    _nothing_written(app)


def test_an_unknown_setting_is_refused_at_settings_load(redis_server: str) -> None:
    app = make_app(redis_server, debounce_redis_ulr="redis://x")

    @debounced(app, **TRAIL)
    def job(x: str) -> None:  # pragma: no cover - never run
        pass

    with pytest.raises(
        DebounceConfigError,
        match=r"debounce_redis_ulr='redis://x': unknown setting.*did you mean "
        r"'debounce_redis_url'",
    ):
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
    with pytest.raises(
        DebounceConfigError,
        match=r"CELERY_DEBOUNCE_KEY_PREFX='x': unknown setting.*did you mean "
        r"'CELERY_DEBOUNCE_KEY_PREFIX'",
    ):
        Settings.from_app(app)


# -- 6. enqueue_many sends the per-call signals -------------------------------------------------
def test_enqueue_many_sends_the_signals_a_single_call_sends(app: Celery) -> None:
    _plain, lead, _trail = _tasks(app)
    heard: list[tuple[str, str]] = []

    def listen(name: str) -> Any:
        def receiver(sender: str, key: str, **kwargs: Any) -> None:
            heard.append((name, key))

        return receiver

    receivers = {
        s: listen(s.name) for s in (sig.window_opened, sig.call_absorbed, sig.call_suppressed)
    }
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


# -- 7. the class: options x ways in x eager, for every task shape ---------------------------
#: The task's own options (every one with a window).
OPTION_SETS: dict[str, dict[str, Any]] = {
    "trailing": {},
    "leading only": {"debounce_leading": True, "debounce_trailing": False},
    "both edges": {"debounce_leading": True},
    "collect": {"debounce_collect": True},
    "max_calls": {"debounce_max_calls": 2},
    "replace_payload": {"debounce_replace_payload": True},
}
#: Per-call options (on the call, or on the signature).
PER_CALL: dict[str, dict[str, Any]] = {
    "no option": {},
    "countdown": {"countdown": 5},
    "misspelt": {"debounce_replace_paylod": True},
    "trailing on the call": {"debounce_trailing": True},  # contradicts leading only
}
#: Ways in whose call has an id fixed before it is made (canvas freezes every member).
FIXED_WAYS = (
    "task_id=",
    "group member",
    "chord header",
    "chord body",
    "chain head",
    "chain middle",
    "chain tail",
)
INLINE_WAYS = ("map", "starmap", "chunks")
CANVAS_WAYS = (
    "group member",
    "chord header",
    "chord body",
    "chain head",
    "chain middle",
    "chain tail",
)


def _apply(way: str, task: Any, plain: Any, app: Celery, opts: dict[str, Any]) -> Any:
    def s(*args: Any) -> Any:
        return task.s(*args).set(**opts) if opts else task.s(*args)

    if way == "delay":
        return task.apply_async(("k",), **opts) if opts else task.delay("k")
    if way == "task_id=":
        return task.apply_async(("k",), task_id="fixed-id", **opts)
    if way == "send_task":
        return send_task(app, task.name, ("k",), **opts)
    if way == "enqueue_many":
        return enqueue_many(task, [(("k",), {}), (("k",), {})], **opts)
    if way == "signature":
        return s("k").delay()
    if way == "group member":
        return group(s("k"), s("k")).apply_async()
    if way == "chord header":
        return chord([s("k"), s("k")], plain.s()).apply_async()
    if way == "chord body":
        return chord([plain.s("k")], s()).apply_async()
    if way == "chain head":
        return chain(s("k"), plain.s()).apply_async()
    if way == "chain middle":
        return chain(plain.s("k"), s(), plain.s()).apply_async()
    if way == "chain tail":
        return chain(plain.s("k"), s()).apply_async()
    if way == "map":
        return task.map(["k"]).apply_async()
    if way == "starmap":
        return task.starmap([("k",)]).apply_async()
    assert way == "chunks"
    return task.chunks([("k",)], 1).apply_async()


def _expected_refusal(options: str, per_call: str, way: str) -> str | None:
    """A pattern of the refused call's error (each alternative names the option and
    its value), or None: the call is accepted."""
    if way in INLINE_WAYS:
        return re.escape("runs the task inline")
    texts = []
    if per_call == "countdown":
        texts.append(re.escape("countdown=5"))
    if per_call == "misspelt":
        texts.append(
            "debounce_replace_paylod=True: unknown option.*did you mean 'debounce_replace_payload'"
        )
    if options == "leading only" and per_call != "trailing on the call" and way in FIXED_WAYS:
        texts.append("debounce_leading=True, debounce_trailing=False cannot be combined")
    return "|".join(texts) or None


def _shaped_task(app: Celery, shape: str, options: dict[str, Any]) -> Any:
    # the default key (a digest of the arguments): a chord body's list of results has one
    opts = {"debounce": "1h", "debounce_max_wait": "2h", **options}
    collect = opts.get("debounce_collect", False)
    name = f"parity.class.{shape.replace(' ', '_')}"

    def body(*args: Any) -> Any:
        first = args[0] if args else None
        return [list(c.args) for c in first] if collect else list(args)

    if shape in ("function", "custom app Task class"):

        @app.task(
            base=DebouncedTask if shape == "function" else None, shared=False, name=name, **opts
        )
        def fn(x: Any = None) -> Any:
            return body(x)

        return fn
    if shape == "bind":

        @debounced(app, bind=True, shared=False, name=name, **opts)
        def bound(self: Any, x: Any = None) -> Any:
            return body(x)

        return bound
    attrs = {"name": name, **opts}
    if shape == "register_task":
        attrs["run"] = lambda self, x=None: body(x)
        return app.register_task(type("Registered", (DebouncedTask,), attrs)())
    assert shape == "subclass inheriting run"
    base = type("Base", (DebouncedTask,), {"run": lambda self, x=None: body(x)})
    return app.register_task(type("Inheriting", (base,), attrs)())


CLASS_SHAPES = [
    "function",
    "bind",
    "register_task",
    "subclass inheriting run",
    "custom app Task class",
]
WAYS = ["delay", "task_id=", "send_task", "enqueue_many", "signature", *CANVAS_WAYS, *INLINE_WAYS]


def _class_cases() -> list[Any]:
    cases = []
    for eager in (False, True):
        for shape in CLASS_SHAPES:
            for options in OPTION_SETS:
                for per_call in PER_CALL:
                    if (
                        shape != "function"
                        and per_call != "no option"
                        and options not in ("trailing", "leading only")
                    ):
                        continue  # shapes x every per-call option only for two option sets
                    for way in WAYS:
                        cases.append(
                            pytest.param(
                                eager,
                                shape,
                                options,
                                per_call,
                                way,
                                id=f"{'eager' if eager else 'real'}-{shape}-{options}-"
                                f"{per_call}-{way}",
                            )
                        )
    return cases


@pytest.mark.parametrize(("eager", "shape", "options", "per_call", "way"), _class_cases())
def test_every_way_in_works_or_is_refused_at_call_time(
    redis_server: str,
    redis_client: redis.Redis,
    eager: bool,
    shape: str,
    options: str,
    per_call: str,
    way: str,
) -> None:
    if eager:
        custom = shape == "custom app Task class"
        app = Celery(
            "class-eager",
            broker="memory://",
            set_as_current=False,
            task_cls=_PlainBase if custom else "celery.app.task:Task",
        )
        app.conf.update(task_always_eager=True)
    else:
        app = make_app(redis_server)
        if shape == "custom app Task class":
            app = Celery("class-custom", task_cls=_PlainBase, set_as_current=False)
            app.conf.update(make_app(redis_server).conf.table(with_defaults=False))
    if options == "collect" and per_call == "trailing on the call":
        pytest.skip("same as 'no option' for a collect task")
    task = _shaped_task(app, shape, OPTION_SETS[options])

    @app.task(shared=False, name="parity.class.plain")
    def plain(*args: Any) -> Any:
        return "k"  # a key for the debounced step after it (a list would be no key)

    expected = _expected_refusal(options, per_call, way)
    if expected is not None:
        with pytest.raises(DebounceConfigError, match=expected):
            _apply(way, task, plain, app, dict(PER_CALL[per_call]))
        if not eager:
            _nothing_written(app)
        return
    result = _apply(way, task, plain, app, dict(PER_CALL[per_call]))
    if eager:
        for r in result if isinstance(result, list) else [result]:
            r.get(timeout=5)  # ran inline, without an error
    else:
        windows = redis.Redis.from_url(app.conf.debounce_redis_url)
        broker = redis.Redis.from_url(app.conf.broker_url)
        assert package_keys(windows) or broker.dbsize()  # a window, or the plain head
        for r in result if isinstance(result, list) else [result]:
            app.backend.remove_pending_result(r)


# -- a rolling deploy that toggles debounce_collect ------------------------------------------
def _deploy_pair(redis_server: str, producer_collect: bool) -> tuple[Any, Celery]:
    """The same task name on two apps (two releases of one project): the producer's
    release with ``debounce_collect=producer_collect``, the worker's with the other."""
    producer, worker = make_app(redis_server), make_app(redis_server)
    opts = {
        "debounce": "200ms",
        "debounce_max_wait": "5s",
        "debounce_key": "{0}",
        "shared": False,
        "name": "parity.deploy.report",
    }

    def define(app: Celery, collect: bool) -> Any:
        if collect:

            @debounced(app, debounce_collect=True, **opts)
            def report(calls: list[DebouncedCall]) -> Any:
                return ["calls", [[list(c.args), c.kwargs] for c in calls]]

            return report

        @debounced(app, **opts)
        def report(user: str, n: int = 0) -> Any:
            return ["plain", user, n]

        return report

    return define(producer, producer_collect), define(worker, not producer_collect) and worker


@pytest.mark.parametrize("producer_collect", [True, False], ids=["collect off", "collect on"])
def test_a_rolling_deploy_that_toggles_debounce_collect_runs_each_window_in_the_workers_shape(
    redis_server: str, redis_client: redis.Redis, producer_collect: bool
) -> None:
    """A window written by a release where the task is (not) ``debounce_collect`` and run
    by a worker of the other release: the run gets what its function takes, never the
    other shape (a raw list of call elements, or a TypeError that failed the run).
    Collect -> plain runs the opener's call, as a plain window would; plain -> collect
    runs a list of the window's one stored call."""
    from helpers import running_worker

    report, worker = _deploy_pair(redis_server, producer_collect)
    first = report.delay("u1", n=1)
    again = report.delay("u1", n=2)
    assert first.id == again.id
    with running_worker(worker):
        outcome = worker.AsyncResult(first.id).get(timeout=20)
    if producer_collect:
        assert outcome == ["plain", "u1", 1]  # the opener's call
    else:
        assert outcome == ["calls", [[["u1"], {"n": 1}]]]  # the window's payload, one call
