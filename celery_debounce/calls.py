"""A ``debounce_collect`` run's calls as the run receives them: :class:`DebouncedCall`,
read from its element in the run's body (``[ms, args, kwargs(, id)]``: the format
:mod:`celery_debounce.producer.collect` writes and ``gate.lua`` stamps), and the one
call a task that is not ``debounce_collect`` runs for such a body. Shared by the
producer (the task's wrapped ``run``) and the worker (the reshaping of a rolling
deploy): it imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


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
