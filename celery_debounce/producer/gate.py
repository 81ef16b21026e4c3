"""Send one call through the store's gate (open a window or join the open one), and tell
the signals. How a store encodes the call is its own (Redis: ``store/redis/codec.py``)."""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

from ..errors import DebounceBackendError, DebounceConfigError, DebouncePayloadError, error_name
from ..signals import call_absorbed, call_failed, call_suppressed, window_opened
from ..store.domain import PayloadTooLarge, ReplaceRefused
from ..store.results import GateResult

if TYPE_CHECKING:  # pragma: no cover
    from ..aliases import FixedId
    from ..store.api import ProducerStore
    from .call import PreparedCall

__all__ = ["GateResult", "announce", "enter", "listening"]


def enter(store: ProducerStore, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
    """Send one call through the gate: one round trip to the store.

    ``fixed``: the call's id was chosen by the caller (``task_id=``, canvas); the
    gate records it as an alias of the window it joins, and opens a window under
    another id if that one is in use (see aliases.py). Sends ``window_opened``,
    ``call_absorbed`` or (a call a leading-only quiet period suppressed)
    ``call_suppressed``, only if someone listens, with the round trip's ``latency``;
    ``call_failed`` for a Redis error (the clock is read only when someone listens).
    """
    start = (
        perf_counter()
        if (
            window_opened.receivers
            or call_absorbed.receivers
            or call_suppressed.receivers
            or call_failed.receivers
        )
        else None
    )
    try:
        result = store.gate(call, fixed)
    except PayloadTooLarge as exc:  # collect: the call cannot fit an empty window
        raise DebouncePayloadError(str(exc)) from None
    except ReplaceRefused as exc:  # a replacing join the window's message cannot take
        raise DebounceConfigError(
            f"{call.task_name}: debounce_replace_payload=True: {exc.reason}"
        ) from None
    except DebounceBackendError as exc:
        if call_failed.receivers:
            call_failed.send(
                sender=call.task_name,
                key=call.key,
                error=error_name(exc),
                latency=None if start is None else perf_counter() - start,
            )
        raise
    announce(call, result, None if start is None else perf_counter() - start)
    return result


def listening() -> bool:
    """Whether any of the signals :func:`announce` sends has a receiver."""
    return bool(window_opened.receivers or call_absorbed.receivers or call_suppressed.receivers)


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
