"""Ids a caller fixed before the call, and how they resolve when the window runs.

Celery lets a caller choose a call's task id (``task_id=``), and canvas (group,
chord, chain) fixes every member's id when it freezes the signature. A debounced
call that joins a window does not run under its own id, so such an id is
recorded as an *alias* of the window (``gate.lua``, record fields ``na`` and
``a1`` .. ``a<na>``). When the window's run ends, the worker stores the run's
outcome under every alias, with the alias's own group, group index, chord and
chain (:func:`resolve_aliases`): group and chord results complete, a chord counts
its member, a chain continues after the window's run.

Only calls with a fixed id pay for this (three more ARGV); a default call sends
none of it and the gate checks nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, MutableMapping
from typing import Any, NamedTuple

from celery import Celery, states
from celery.app.task import Context
from celery.canvas import signature
from kombu.utils import json as kombu_json

from .errors import DebounceConfigError

logger = logging.getLogger("celery_debounce.aliases")

#: Most aliases one window records; a fixed-id call past it is refused by the gate
#: (``DebounceBackendError`` naming the limit) and nothing is written.
MAX_ALIASES = 10_000

#: Canvas options that tie a call to a group, chord or chain. A call carrying any
#: of them is handled through its alias only: they are not stored with the window,
#: so the window's message never counts for a chord or runs a chain by itself.
CANVAS_OPTIONS = ("group_id", "group_index", "chord", "chain")


class FixedId(NamedTuple):
    """A call whose id the caller fixed: what ``gate.lua`` records for it."""

    task_id: str
    alias_json: str  # the record field a<k>: {"id": ..., canvas options ...}
    canvas: bool  # True: also recorded when the call opens the window under its id


def fixed_id(task_id: str | None, options: MutableMapping[str, Any]) -> FixedId | None:
    """The alias of a call made with ``task_id`` (None: a default call, nothing to do).

    Pops the canvas options from ``options``: they travel in the alias only.
    """
    if task_id is None:
        return None
    if isinstance(task_id, str) and "\x00" in task_id:  # PostgreSQL's text cannot hold it
        raise DebounceConfigError(f"task_id={task_id!r}: a task id cannot hold NUL")
    alias: dict[str, Any] = {"id": task_id}
    for name in CANVAS_OPTIONS:
        value = options.pop(name, None)
        if value is not None:
            alias[name] = value
    return FixedId(task_id, kombu_json.dumps(alias), len(alias) > 1)


def result_id(window_id: str, fixed: FixedId | None) -> str:
    """The id a call returns: the window's, or a canvas call's own (canvas froze it)."""
    return fixed.task_id if fixed is not None and fixed.canvas else window_id


def parse_aliases(raw: Iterable[Any]) -> list[dict[str, Any]]:
    """The aliases ``finish.lua`` returned (JSON texts), unreadable ones skipped."""
    out = []
    for item in raw:
        try:
            alias = kombu_json.loads(item.decode() if isinstance(item, bytes) else item)
        except (ValueError, UnicodeDecodeError):
            logger.error("debounce: unreadable alias %r skipped", item)
            continue
        if isinstance(alias, dict) and isinstance(alias.get("id"), str):
            out.append(alias)
    return out


def resolve_aliases(
    app: Celery,
    window_id: str,
    aliases: list[dict[str, Any]],
    state: str,
    retval: Any,
) -> None:
    """Store the run's outcome under every alias, as Celery would have for that id.

    A success stores the result (``mark_as_done``: a chord counts the member) and
    runs the alias's chain; a failure stores the exception (``mark_as_failure``:
    the chord and the chain fail); a revoked or rejected run marks the alias
    revoked. An ``IGNORED`` run stores nothing, as for any task.
    """
    backend = app.backend
    for alias in aliases:
        if alias["id"] == window_id and len(alias) == 1:
            continue  # Celery stored this one itself
        request = Context(
            id=alias["id"],
            group=alias.get("group_id"),
            group_index=alias.get("group_index"),
            chord=alias.get("chord"),
            chain=alias.get("chain"),
            ignore_result=False,
            errbacks=None,
            parent_id=window_id,
            root_id=window_id,
        )
        try:
            if state == states.SUCCESS:
                backend.mark_as_done(alias["id"], retval, request=request)
                _continue_chain(app, alias, retval, window_id)
            elif state in states.EXCEPTION_STATES and state != states.REVOKED:
                exc = retval if isinstance(retval, BaseException) else Exception(repr(retval))
                backend.mark_as_failure(alias["id"], exc, request=request, call_errbacks=False)
            elif state in (states.REVOKED, states.REJECTED):
                backend.mark_as_revoked(alias["id"], "debounce window revoked", request=request)
        except Exception:
            logger.exception(
                "debounce: could not store the result of %s (alias of %s)", alias["id"], window_id
            )


def _continue_chain(app: Celery, alias: dict[str, Any], retval: Any, window_id: str) -> None:
    chain = alias.get("chain")
    if not chain:
        return
    tail = signature(chain[-1], app=app)
    tail.apply_async((retval,), chain=chain[:-1] or None, parent_id=alias["id"], root_id=window_id)
