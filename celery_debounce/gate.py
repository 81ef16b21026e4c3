"""Run ``gate.lua``: open a window or join the open one."""

from __future__ import annotations

from typing import NamedTuple

from .aliases import MAX_ALIASES, FixedId
from .backend import Backend
from .call import PreparedCall, new_task_id
from .collect import PAYLOAD_TOO_LARGE
from .errors import DebounceBackendError, DebouncePayloadError
from .signals import call_absorbed, window_opened

#: Content type not stored in a window record (``ct`` absent means this).
DEFAULT_CONTENT_TYPE = "application/json"


class GateResult(NamedTuple):
    """What the gate decided for one call (times are Redis server ms)."""

    task_id: str
    opened: bool
    deadline_ms: int
    calls: int
    now_ms: int


def gate_keys(backend: Backend, call: PreparedCall) -> list[str]:
    tag = backend.settings.tags[call.shard]
    return [f"{tag}:open:{call.ident}", f"{tag}:due"]


#: ARGV[8] .. ARGV[11] of a call with a cap and no fixed id ("" for ARGV[8]: not fixed).
_NOT_FIXED = ("", "", "", "")


def gate_args(
    backend: Backend, call: PreparedCall, fixed: FixedId | None = None
) -> list[object]:
    """ARGV of ``gate.lua``; defaults (JSON payload, no options) are sent as ''.

    Seven values for a default call; the fixed-id four (ARGV[8..11]) only with
    ``fixed``; the cap (ARGV[12]) only with ``debounce_max_calls``; the window's
    byte budget and the embed (ARGV[15..16]) only with ``debounce_collect``.
    """
    window, max_wait, replace = call.spec.gate_argv
    args: list[object] = [
        call.task_id,
        window,
        max_wait,
        replace,
        "" if call.content_type == DEFAULT_CONTENT_TYPE else call.content_type,
        call.payload,
        "" if call.options_json == "{}" else call.options_json,
    ]
    if fixed is not None:
        args += [fixed.alias_json, new_task_id(), "1" if fixed.canvas else "0", MAX_ALIASES]
    if call.spec.max_calls is not None:
        if fixed is None:
            args += _NOT_FIXED
        args.append(call.spec.max_calls)
    if call.spec.collect:  # ARGV[15..16], after '' for each ARGV not given up to 14
        args += [""] * (COLLECT_ARGV - 1 - len(args))
        args += [backend.settings.max_payload_bytes, call.collect_embed]
    return args


#: The first ARGV of a debounce_collect call (ARGV[13..14] are the edge options).
COLLECT_ARGV = 15


def parse_reply(reply: list[object]) -> GateResult:
    task_id, opened, deadline, calls, now = reply
    return GateResult(
        task_id.decode() if isinstance(task_id, bytes) else str(task_id),
        opened == 1,
        int(deadline),  # type: ignore[call-overload]
        int(calls),  # type: ignore[call-overload]
        int(now),  # type: ignore[call-overload]
    )


def enter(backend: Backend, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
    """Send one call through the gate: one EVALSHA round trip.

    ``fixed``: the call's id was chosen by the caller (``task_id=``, canvas); the
    gate records it as an alias of the window it joins, and opens a window under
    another id if that one is in use (see aliases.py). Sends ``window_opened`` or
    ``call_absorbed`` (only if someone listens).
    """
    args = gate_args(backend, call, fixed)
    try:
        result = parse_reply(backend.run("gate", gate_keys(backend, call), args))
    except DebounceBackendError as exc:
        if PAYLOAD_TOO_LARGE in str(exc):  # collect: the call cannot fit an empty window
            raise DebouncePayloadError(str(exc)) from None
        raise
    signal = window_opened if result.opened else call_absorbed
    if signal.receivers:
        signal.send(
            sender=call.task_name,
            task_id=result.task_id,
            key=call.key,
            deadline=result.deadline_ms / 1000,
            calls=result.calls,
        )
    return result
