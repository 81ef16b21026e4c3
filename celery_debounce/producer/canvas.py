"""Canvas positions Celery applies later, checked when the canvas is applied.

A chain applies its later steps, and a chord its body, inside a worker once the
step before (the header) ran; each of them has its task id fixed when the canvas
is frozen. A debounced signature there that its own call would refuse (options
that do not validate, ``countdown``/``eta``, leading only with a fixed id) used
to be refused only then, after the head had run. :func:`refuse_deferred` checks
every such signature when the canvas is applied, before anything is published or
written: through ``DebouncedTask.apply_async`` (a debounced head) and through the
app's ``send_task`` (a plain head: :func:`install`).

Eager mode (``task_always_eager``) never publishes: ``chain``/``chord`` run their
steps with ``Signature.apply``, without freezing an id, so neither check above is
reached. :func:`install` wraps Celery's ``_chain.apply`` and ``_chord.apply`` (once
per process; only for an app with a debounced task, only in eager mode) to make
the same checks before any step runs: every position a real chain or chord fixes
the id of is checked as fixed (leading only refused, as in a real run).

``map``/``starmap``/``chunks`` run the task inline in the worker that runs the
``celery.map``/``celery.starmap``/``celery.chunks`` task: never through the gate.
A task with a debounce window refuses them (decision in docs/faq.md); a
``celery.map``-like message of such a task built by hand is refused at publish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery
from celery.canvas import Signature, _chain, _chord, maybe_signature

from ..errors import DebounceConfigError
from .confcache import always_eager

#: Celery's built-in tasks that run another task's signature inline (``task(item)``).
INLINE_TASKS = ("celery.map", "celery.starmap", "celery.chunks")


def refuse_shortcut(name: str, shortcut: str) -> DebounceConfigError:
    return DebounceConfigError(
        f"{name}: {shortcut}() runs the task inline in one worker task, never through the "
        "debounce window, so its calls would not be debounced; use "
        "group(task.s(x) for x in items) or celery_debounce.enqueue_many(task, calls) "
        "(each call gated), or debounce=None on the task"
    )


def refuse_deferred(app: Celery, chain: Any, chord: Any) -> None:
    """Refuse a chain's later steps or a chord's body that would be refused when applied.

    ``chain`` is the ``chain=`` option a chain's head is applied with (its other
    steps, in reverse order), ``chord`` the ``chord=`` option of a chord's header
    members (the body). Groups, chains and chords nested in them are walked.
    """
    if chain:
        for step in chain:
            _check(app, step, "a chain's later step")
    if chord:
        _check(app, chord, "a chord's body")


def _check(app: Celery, sig: Any, where: str, depth: int = 0) -> None:
    if depth > 50:  # canvas nested deeper than this is not walked further
        return
    sig = maybe_signature(sig, app=app)
    if not isinstance(sig, Signature):
        return
    kind = sig.get("subtask_type")
    if kind in ("group", "chain", "chord"):
        for member in getattr(sig, "tasks", None) or ():  # a chord's: its header
            _check(app, member, where, depth + 1)
        body = getattr(sig, "body", None) if kind == "chord" else None
        if body is not None:
            _check(app, body, where, depth + 1)
        return
    check_signature(app, sig, where, fixed=True)


def check_signature(app: Celery, sig: Signature, where: str | None, *, fixed: bool) -> None:
    """Run the call-time checks of a debounced task's signature, writing nothing.
    ``where`` names the position in the refusal; None: the call's own refusal (a
    chain's head, applied as a call)."""
    from .task import DebouncedTask, refuse_fixed_leading

    name = sig.get("task")
    task = app.tasks.get(name) if isinstance(name, str) else None
    if not isinstance(task, DebouncedTask):
        return
    options = dict(sig.get("options") or {})
    try:
        spec = task._debounce_defaults.for_call(options)
        if spec is None:
            return
        from .call import refuse_schedule

        refuse_schedule(options)
        if fixed and spec.leading and not spec.trailing:
            refuse_fixed_leading(name)
    except DebounceConfigError as exc:
        if where is None:
            raise
        raise DebounceConfigError(
            f"{exc} (as {where}, refused when the canvas is applied)"
        ) from None


def check_publish(
    app: Celery,
    name: Any,
    args: Any,
    kwargs: Any,
    options: Mapping[str, Any],
) -> None:
    """What ``app.send_task`` is about to publish: its deferred canvas, and the inline
    shortcuts of a debounced task."""
    chain, chord = options.get("chain"), options.get("chord")
    if chain or chord:
        refuse_deferred(app, chain, chord)
    inner_raw = kwargs.get("task") if isinstance(kwargs, Mapping) else None
    if inner_raw is None and args:
        inner_raw = args[0]
    if name in INLINE_TASKS and inner_raw is not None:
        inner = maybe_signature(inner_raw, app=app)
        if isinstance(inner, Signature):
            task = app.tasks.get(inner.get("task"))
            spec = getattr(task, "_debounce_defaults", None)
            if spec is not None and spec.spec is not None:
                raise refuse_shortcut(inner["task"], name.rsplit(".", 1)[1])


def check_eager(canvas: Any, body: Any = None) -> None:
    """An eager ``chain``/``chord`` about to run its steps inline: the checks a real run
    makes when it is applied, before any step runs. A chain's later steps and a chord's
    body as :func:`refuse_deferred` checks them; a chain's head as its own call with the
    id a real chain fixes for it (a group or chord there checks its own members).
    ``body``: the body an eager ``chord.apply_async(body=...)`` runs instead."""
    app = canvas.app
    if not getattr(app, "_debounce_canvas_checked", False) or not always_eager(app):
        return
    if isinstance(canvas, _chord):
        refuse_deferred(app, None, canvas.body if body is None else body)
        return
    steps = [maybe_signature(step, app=app) for step in canvas.tasks or ()]
    if not steps:
        return
    refuse_deferred(app, steps[1:], None)
    head = steps[0]
    if isinstance(head, Signature) and head.get("subtask_type") not in ("group", "chain", "chord"):
        check_signature(app, head, None, fixed=True)


def _checked_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        check_eager(self, options.get("body"))  # an eager chord.apply_async passes its body
        return original(self, args, kwargs, **options)

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    apply._debounce_checked = True  # type: ignore[attr-defined]
    return apply


def _install_eager() -> None:
    """Wrap ``_chain.apply`` and ``_chord.apply`` once per process (Celery's classes:
    every app's eager canvas runs through them; :func:`check_eager` does nothing for
    an app without a debounced task, or outside eager mode)."""
    for cls in (_chain, _chord):
        if not getattr(cls.apply, "_debounce_checked", False):
            cls.apply = _checked_apply(cls.apply)  # type: ignore[method-assign, unused-ignore]


def install(app: Celery) -> None:
    """Check every publish of ``app.send_task`` (``Task.apply_async`` of any task class
    goes through it) with :func:`check_publish`, once per app; and every eager
    ``chain``/``chord`` with :func:`check_eager` (:func:`_install_eager`)."""
    _install_eager()
    if getattr(app, "_debounce_canvas_checked", False):
        return
    original: Callable[..., Any] = app.send_task

    def send_task(
        name: Any, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any
    ) -> Any:
        if options.get("chain") or options.get("chord") or name in INLINE_TASKS:
            check_publish(app, name, args, kwargs, options)
        return original(name, args, kwargs, *rest, **options)

    send_task.__wrapped__ = original  # type: ignore[attr-defined]
    app.send_task = send_task  # type: ignore[method-assign, unused-ignore]
    app._debounce_canvas_checked = True  # type: ignore[attr-defined, unused-ignore]
