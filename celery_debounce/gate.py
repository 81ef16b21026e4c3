"""Run ``gate.lua``: open a window or join the open one."""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .aliases import MAX_ALIASES, FixedId
from .call import PreparedCall, new_task_id
from .collect import PAYLOAD_TOO_LARGE
from .errors import DebounceBackendError, DebounceConfigError, DebouncePayloadError
from .layout import DEFAULT_CONTENT_TYPE, EMPTY_OPTIONS
from .signals import call_absorbed, call_failed, call_suppressed, window_opened

if TYPE_CHECKING:  # pragma: no cover
    from .settings import Settings
    from .store import WindowStore


class GateStore(Protocol):
    """What :func:`gate_keys` and :func:`gate_args` read of a store."""

    settings: Settings
    gate_prefixes: tuple[tuple[str, str], ...]


class GateResult(NamedTuple):
    """What the gate decided for one call (times are Redis server ms)."""

    task_id: str
    opened: bool
    deadline_ms: int
    calls: int
    now_ms: int
    #: ``"lead"``: this call is a leading run (published at once); ``"suppressed"``:
    #: folded into the leading run ``task_id`` (leading only); ``""`` otherwise
    edge: str = ""


def gate_keys(store: GateStore, call: PreparedCall) -> list[str]:
    """KEYS of gate.lua: ``open_key(tag, ident)`` and ``due_key(tag)``, from prefixes the
    store built once per shard with those builders (no call per call)."""
    open_prefix, due = store.gate_prefixes[call.shard]
    return [open_prefix + call.ident, due]


#: Error text gate.lua replies with for a replacing join the window's message cannot take.
REPLACE_REFUSED = "DEBOUNCE_REPLACE_REFUSED"

#: 1-based ARGV positions of the optional groups of gate.lua (see its header): the cap,
#: the edge mode (with the history TTL), the collect byte budget (with the embed).
CAP_ARGV = 12
EDGE_ARGV = 13
COLLECT_ARGV = 15


def _pad_to(args: list[object], position: int) -> None:
    """Send '' (not given) for every ARGV before ``position`` the call has not filled."""
    args += [""] * (position - 1 - len(args))


def gate_args(
    store: GateStore, call: PreparedCall, fixed: FixedId | None = None
) -> list[object]:
    """ARGV of ``gate.lua``; defaults (JSON payload, no options) are sent as ''.

    Seven values for a default call; the fixed-id four (ARGV[8..11]) only with
    ``fixed``; the cap (ARGV[12]) only with ``debounce_max_calls``; the edge mode and
    the history TTL (ARGV[13..14]) only with ``debounce_leading=True``; the window's
    byte budget and the embed (ARGV[15..16]) only with ``debounce_collect`` (each
    ARGV not given before them sent as '').
    """
    window, max_wait, replace = call.spec.gate_argv
    expires = store.settings.result_expires_ms
    if call.spec.edge == b"L" and expires is not None and expires < call.spec.max_wait_ms:
        # leading only: the quiet period (bounded by this max wait) never outlasts the
        # leading run's result, whose id every call it suppresses returns
        max_wait = b"%d" % expires
    args: list[object] = [
        call.task_id,
        window,
        max_wait,
        replace + call.embed_json.encode() if call.embed_json else replace,
        "" if call.content_type == DEFAULT_CONTENT_TYPE else call.content_type,
        call.payload,
        "" if call.options_json == EMPTY_OPTIONS else call.options_json,
    ]
    if fixed is not None:
        args += [fixed.alias_json, new_task_id(), "1" if fixed.canvas else "0", MAX_ALIASES]
    if call.spec.max_calls is not None:
        _pad_to(args, CAP_ARGV)
        args.append(call.spec.max_calls)
    if call.spec.leading:
        _pad_to(args, EDGE_ARGV)
        args += [call.spec.edge, store.settings.history_ttl_ms]
    if call.spec.collect:
        _pad_to(args, COLLECT_ARGV)
        args += [store.settings.max_payload_bytes, call.collect_embed]
    return args


def parse_reply(reply: list[object]) -> GateResult:
    try:
        task_id, opened, deadline, calls, now = reply
    except ValueError:  # an edge call's sixth element, "lead" or "suppressed"
        return _edge_reply(reply)
    return GateResult(
        task_id.decode() if isinstance(task_id, bytes) else str(task_id),
        opened == 1,
        int(deadline),  # type: ignore[call-overload]
        int(calls),  # type: ignore[call-overload]
        int(now),  # type: ignore[call-overload]
    )


def _edge_reply(reply: list[object]) -> GateResult:
    base = parse_reply(reply[:5])
    edge = reply[5]
    return base._replace(edge=edge.decode() if isinstance(edge, bytes) else str(edge))


def enter(store: WindowStore, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
    """Send one call through the gate: one EVALSHA round trip.

    ``fixed``: the call's id was chosen by the caller (``task_id=``, canvas); the
    gate records it as an alias of the window it joins, and opens a window under
    another id if that one is in use (see aliases.py). Sends ``window_opened``,
    ``call_absorbed`` or (a call a leading-only quiet period suppressed)
    ``call_suppressed``, only if someone listens, with the round trip's ``latency``;
    ``call_failed`` for a Redis error (the clock is read only when someone listens).
    """
    start = perf_counter() if (window_opened.receivers or call_absorbed.receivers
                               or call_suppressed.receivers or call_failed.receivers) else None
    try:
        result = store.gate(call, fixed)
    except DebounceBackendError as exc:
        if PAYLOAD_TOO_LARGE in str(exc):  # collect: the call cannot fit an empty window
            raise DebouncePayloadError(str(exc)) from None
        if REPLACE_REFUSED in str(exc):  # a replacing join the window's message cannot take
            raise DebounceConfigError(
                f"{call.task_name}: debounce_replace_payload=True: "
                f"{str(exc).split(REPLACE_REFUSED, 1)[1].lstrip(': ')}"
            ) from None
        if call_failed.receivers:
            call_failed.send(sender=call.task_name, key=call.key, error=type(exc).__name__,
                             latency=None if start is None else perf_counter() - start)
        raise
    announce(call, result, None if start is None else perf_counter() - start)
    return result


def listening() -> bool:
    """Whether any of the signals :func:`announce` sends has a receiver."""
    return bool(window_opened.receivers or call_absorbed.receivers
                or call_suppressed.receivers)


def announce(call: PreparedCall, result: GateResult, latency: float | None = None) -> None:
    """The producer's signal for one gated call, the same for a single call and for
    ``enqueue_many``: ``call_suppressed`` (a leading-only quiet period folded it into
    the leading run), else ``window_opened`` or ``call_absorbed``; sent only if someone
    listens. ``stats`` counts the same (``s|`` per suppressed call). ``latency``: the
    gate's round trip in seconds (single calls; None for ``enqueue_many``)."""
    if result.edge == "suppressed":
        signal = call_suppressed
    else:
        signal = window_opened if result.opened else call_absorbed
    if signal.receivers:
        signal.send(
            sender=call.task_name,
            task_id=result.task_id,
            key=call.key,
            deadline=result.deadline_ms / 1000,
            calls=result.calls,
            latency=latency,
        )
