"""The arguments of ``debounce_gate`` (one call) and ``debounce_gate_many`` (a chunk),
their answer, and the typed errors of the gate's refusals: one owner for both paths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...aliases import MAX_ALIASES
from ...errors import DebounceError
from ...stored_call import new_task_id
from ..domain import AliasesFull, PayloadTooLarge, ReplaceRefused
from ..results import GateResult

if TYPE_CHECKING:  # pragma: no cover
    from ...aliases import FixedId
    from ...producer.call import PreparedCall

#: SQLSTATEs of the schema's refusals (``debounce_refuse``): a fixed id past the window's
#: most aliases; a replacing join the window's message cannot take; a collect call that
#: cannot fit an empty window. The call wrote nothing.
REFUSALS: dict[str, type[DebounceError]] = {
    "DBA01": AliasesFull,
    "DBR01": ReplaceRefused,
    "DBP01": PayloadTooLarge,
}

#: ``debounce_gate_many``'s arrays: each of ``gate_args``'s but the most aliases (one
#: for every call), which goes after the thirteenth.
_SCALAR = 13


def gate_args(call: PreparedCall, fixed: FixedId | None, max_payload_bytes: int) -> tuple[Any, ...]:
    """``debounce_gate``'s 18 arguments for ``call`` (``max_payload_bytes``: a collect
    window's byte budget)."""
    spec = call.spec
    alias = fallback = None
    if fixed is not None:
        alias, fallback = fixed.alias_json, new_task_id()
    return (
        call.ident,
        call.task_id,
        spec.window_ms,
        spec.max_wait_ms,
        call.content_type,
        call.payload,
        call.options_json,
        spec.replace_payload,
        spec.exclusive,
        spec.max_calls,
        alias,
        fallback,
        fixed is not None and fixed.canvas,
        MAX_ALIASES,
        call.embed_json,
        ("B" if spec.trailing else "L") if spec.leading else "",
        max_payload_bytes if spec.collect else None,
        call.collect_embed if spec.collect else None,
    )


def gate_many_args(calls: list[PreparedCall], max_payload_bytes: int) -> tuple[Any, ...]:
    """``debounce_gate_many``'s arguments: a list per argument of ``gate_args``, in
    call order, and the most aliases once."""
    columns = list(zip(*(gate_args(c, None, max_payload_bytes) for c in calls), strict=True))
    return (*map(list, columns[:_SCALAR]), MAX_ALIASES, *map(list, columns[_SCALAR + 1 :]))


def refused(sqlstate: str | None, message: str) -> DebounceError | None:
    """The typed error of a gate refusal (nothing written), or None for another error."""
    kind = REFUSALS.get(sqlstate or "")
    if kind is None:
        return None
    error = kind(f"PostgreSQL store: {message}")
    if isinstance(error, ReplaceRefused):  # "window <id> <why>", as the Redis gate says it
        error.reason = message
    return error


def gate_result(row: Sequence[Any]) -> GateResult:
    """A gate's answer ``(task_id, opened, deadline_ms, calls, now_ms, edge)``."""
    task_id, opened, deadline_ms, calls, now_ms, edge = row
    return GateResult(task_id, bool(opened), int(deadline_ms), int(calls), int(now_ms), edge)
