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
``json`` serializer). This module writes the element format; the run reads it back
as :class:`~celery_debounce.calls.DebouncedCall` (:mod:`celery_debounce.calls`,
shared with the worker; re-exported here).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..calls import DebouncedCall, to_calls

__all__ = [
    "BODY_OVERHEAD",
    "TIME_PREFIX",
    "DebouncedCall",
    "call_element",
    "single_call_args",
    "to_calls",
    "wrap_run",
]

#: Bytes of the run's body around the calls: ``[[[`` + calls + ``]],{},`` + embed + ``]``.
#: ``gate.lua`` counts the same (field ``cb``): the body a run gets is never larger
#: than the window's ``debounce_max_payload_bytes`` (field ``cz``).
BODY_OVERHEAD = 10

#: Bytes ``gate.lua`` adds to a call's encoded ``[args, kwargs]``: the Redis time in
#: ms (13 digits until the year 2286) and a comma, ``[<ms>,args,kwargs]``.
TIME_PREFIX = 14

logger = logging.getLogger("celery_debounce.collect")


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
