"""``debounce_collect=True``: the run receives every call of its window, in call order.

Producers call the task as usual (``build_report.delay(user_id="u1", change=3)``);
the task function takes one parameter, the list of :class:`DebouncedCall`::

    @app.task(base=DebouncedTask, debounce="5s", debounce_max_wait="1m",
              debounce_key="{user_id}", debounce_collect=True)
    def build_report(calls: list[DebouncedCall]) -> int:
        return sum(c.kwargs["change"] for c in calls)

How a call travels (see docs/design.md, "Collect windows"): the producer encodes
the call's own ``[args, kwargs]`` (plus its id when the caller fixed one) as JSON;
``gate.lua`` prefixes the Redis time and appends it to the window's call list;
``take.lua`` splices the list into the run's protocol-2 body
``[[[call, call, ...]], {}, embed]``. Neither the dispatcher nor Redis ever
deserializes a call; the worker parses JSON only (``debounce_collect`` requires the
``json`` serializer). This module owns the element format.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

#: Bytes of the run's body around the calls: ``[[[`` + calls + ``]],{},`` + embed + ``]``.
#: ``gate.lua`` counts the same (field ``cb``): the body a run gets is never larger
#: than the window's ``debounce_max_payload_bytes`` (field ``cz``).
BODY_OVERHEAD = 10

#: Bytes ``gate.lua`` adds to a call's encoded ``[args, kwargs]``: the Redis time in
#: ms (13 digits until the year 2286) and a comma, ``[<ms>,args,kwargs]``.
TIME_PREFIX = 14

#: Message header of a run whose body is a list of calls (a collect window, or one
#: call of a collect task published without a window): the worker knows the body's
#: shape even where the task is not ``debounce_collect`` (a rolling deploy).
COLLECT_HEADER = "debounce_collect"

logger = logging.getLogger("celery_debounce.collect")


@dataclass(frozen=True)
class DebouncedCall:
    """One call of a collect window, as the run receives it.

    ``args`` and ``kwargs`` are what the caller passed (as JSON gives them back:
    tuples become lists inside them), ``task_id`` the id the caller fixed
    (``task_id=``, canvas) or None for a default call, ``called_at`` when the gate
    took the call (Redis clock, UTC; the producer's clock for a call that bypassed
    the window: ``debounce=False`` or eager mode).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    task_id: str | None = None
    called_at: datetime | None = None

    @classmethod
    def from_element(cls, element: Any) -> DebouncedCall:
        """A call from its element in the run's body: ``[ms, args, kwargs(, id)]``."""
        if isinstance(element, DebouncedCall):
            return element
        if (
            isinstance(element, (list, tuple))
            and len(element) in (3, 4)
            and isinstance(element[1], (list, tuple))
            and isinstance(element[2], Mapping)
        ):
            ms = element[0]
            at = (
                datetime.fromtimestamp(ms / 1000, timezone.utc)
                if isinstance(ms, (int, float))
                else None
            )
            return cls(
                tuple(element[1]),
                dict(element[2]),
                element[3] if len(element) == 4 else None,
                at,
            )
        raise TypeError(
            f"not a debounced call: {element!r:.80}; a debounce_collect task receives the "
            "list of its window's calls (publish it with delay/apply_async/send_task of "
            "celery_debounce)"
        )


def to_calls(calls: Any) -> list[DebouncedCall]:
    """The run's argument (a list of call elements) as :class:`DebouncedCall` objects."""
    if not isinstance(calls, (list, tuple)):
        raise TypeError(
            f"a debounce_collect task takes one argument, the list of its window's calls; "
            f"got {type(calls).__name__}"
        )
    return [DebouncedCall.from_element(c) for c in calls]


def wrap_run(run: Any) -> Any:
    """The task's ``run`` (as Celery's decorator stores it) taking call elements.

    ``run`` is a ``staticmethod`` (``bind=False``) or a function taking the task
    first (``bind=True``, or a class-based task's method).
    """
    if getattr(
        run.__func__ if isinstance(run, staticmethod) else run, "__debounce_collect__", False
    ):
        return run  # already wrapped (inherited from a collect task class)
    if isinstance(run, staticmethod):
        fun: Callable[..., Any] = run.__func__

        @functools.wraps(fun)
        def unbound(*args: Any, **kwargs: Any) -> Any:
            calls, rest, extra = _calls_of(args, kwargs)
            return fun(calls, *rest, **extra)

        unbound.__debounce_collect__ = True  # type: ignore[attr-defined]
        unbound.__debounce_collect_of__ = run  # type: ignore[attr-defined]
        return staticmethod(unbound)
    method: Callable[..., Any] = run

    @functools.wraps(method)
    def bound(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls, rest, extra = _calls_of(args, kwargs)
        return method(self, calls, *rest, **extra)

    bound.__debounce_collect__ = True  # type: ignore[attr-defined]
    bound.__debounce_collect_of__ = method  # type: ignore[attr-defined]
    return bound


def _calls_of(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[list[DebouncedCall], tuple[Any, ...], dict[str, Any]]:
    """``(calls, other args, other kwargs)`` for the wrapped function.

    A run in a worker whose arguments are not a list of calls is a plain call of
    this task, published where the task is not ``debounce_collect`` (a rolling
    deploy that turned it on): it runs as a list of that one call. Called directly
    (unit tests) such arguments are a TypeError, as before.
    """
    if args:
        try:
            return to_calls(args[0]), args[1:], kwargs
        except TypeError:
            if not _in_worker():
                raise
    elif not _in_worker():
        raise TypeError(
            "a debounce_collect task takes one argument, the list of its window's calls; got none"
        )
    logger.warning(
        "debounce: a debounce_collect task got a plain call's arguments (published where "
        "the task is not debounce_collect, e.g. during a rolling deploy): run as one call"
    )
    return [DebouncedCall(tuple(args), dict(kwargs))], (), {}


def _in_worker() -> bool:
    """True inside a run the worker (or eager mode) traces, not a direct call."""
    from celery import current_task

    task = current_task
    if not task:
        return False
    request = task.request
    return bool(request is not None and not request.called_directly and request.id)


def plain_call_of(args: Any, replace_payload: bool) -> DebouncedCall | None:
    """The call a task that is not ``debounce_collect`` runs for a collect body (a
    rolling deploy that turned the option off): the opener's call, or the newest with
    ``debounce_replace_payload``, as a plain window would run. None: not such a body."""
    if not isinstance(args, (list, tuple)) or len(args) != 1:
        return None
    try:
        calls = to_calls(args[0])
    except TypeError:
        return None
    if not calls:
        return None
    return calls[-1] if replace_payload else calls[0]


def single_call_args(
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    task_id: str | None = None,
) -> list[Any]:
    """The run's args for one call published without a window (``debounce=False``,
    eager mode): a list of one call, stamped with this process's clock."""
    element: list[Any] = [int(time.time() * 1000), list(args or ()), dict(kwargs or {})]
    if task_id is not None:
        element.append(task_id)
    return [[element]]


def call_element(args: Sequence[Any], kwargs: Mapping[str, Any], task_id: str | None) -> list[Any]:
    """What the producer encodes for one call of a collect window (gate.lua adds the time)."""
    if task_id is None:
        return [list(args), dict(kwargs)]
    return [list(args), dict(kwargs), task_id]
