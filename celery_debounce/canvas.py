"""Canvas positions Celery applies later, checked when the canvas is applied.

A chain applies its later steps, and a chord its body, inside a worker once the
step before (the header) ran; each of them has its task id fixed when the canvas
is frozen. A debounced signature there that its own call would refuse (options
that do not validate, ``countdown``/``eta``, leading only with a fixed id) used
to be refused only then, after the head had run. :func:`refuse_deferred` checks
every such signature when the canvas is applied, before anything is published or
written: through ``DebouncedTask.apply_async`` (a debounced head) and through the
app's ``send_task`` (a plain head: :func:`install`).

``map``/``starmap``/``chunks`` run the task inline in the worker that runs the
``celery.map``/``celery.starmap``/``celery.chunks`` task: never through the gate.
A task with a debounce window refuses them (decision in docs/faq.md); a
``celery.map``-like message of such a task built by hand is refused at publish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery
from celery.canvas import Signature, maybe_signature

from .errors import DebounceConfigError

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


def check_signature(app: Celery, sig: Signature, where: str, *, fixed: bool) -> None:
    """Run the call-time checks of a debounced task's signature, writing nothing."""
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
        raise DebounceConfigError(f"{exc} (as {where}, refused when the canvas is applied)") \
            from None


def check_publish(
    app: Celery, name: Any, args: Any, kwargs: Any, options: Mapping[str, Any],
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


def install(app: Celery) -> None:
    """Check every publish of ``app.send_task`` (``Task.apply_async`` of any task class
    goes through it) with :func:`check_publish`; once per app."""
    if getattr(app, "_debounce_canvas_checked", False):
        return
    original: Callable[..., Any] = app.send_task

    def send_task(name: Any, args: Any = None, kwargs: Any = None, *rest: Any,
                  **options: Any) -> Any:
        if options.get("chain") or options.get("chord") or name in INLINE_TASKS:
            check_publish(app, name, args, kwargs, options)
        return original(name, args, kwargs, *rest, **options)

    send_task.__wrapped__ = original  # type: ignore[attr-defined]
    app.send_task = send_task  # type: ignore[method-assign, unused-ignore]
    app._debounce_canvas_checked = True  # type: ignore[attr-defined, unused-ignore]
