"""The Redis store's script arguments and replies: each script's KEYS/ARGV builder and
reply decoder, into the contract's results (:mod:`celery_debounce.store.results`).

Nothing here imports the call encoding (``call.py``, ``message.py``, ``options.py``):
a :class:`~celery_debounce.producer.call.PreparedCall` is read by attribute only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ...aliases import MAX_ALIASES
from ...stored_call import DEFAULT_CONTENT_TYPE, EMPTY_OPTIONS, new_task_id
from ..idents import split_ident
from ..results import CONTRACT_VERSION, GateResult, Shard, TakenWindow
from ..states import as_edge
from .fields import TAKE_FIELDS, decode_record

if TYPE_CHECKING:  # pragma: no cover
    from ...aliases import FixedId
    from ...producer.call import PreparedCall
    from ...producer.options import DebounceSpec
    from ...settings import Settings


def _taken(shard: Shard, now_ms: int, row: list[Any]) -> TakenWindow:
    record = decode_record(TAKE_FIELDS, row, strict=True)
    if record is None:
        raise ValueError("no task id")
    assert record.ident is not None
    split_ident(record.ident)  # raises on a malformed ident
    if record.payload is None:
        raise ValueError("no payload")
    return TakenWindow(
        shard=shard,
        record=record,
        taken_ms=now_ms,
        failures=int(row[len(TAKE_FIELDS)] or 0) if len(row) > len(TAKE_FIELDS) else 0,
        held_ms=int(row[len(TAKE_FIELDS) + 1]) if len(row) > len(TAKE_FIELDS) + 1 else 0,
    )


# -- gate.lua ------------------------------------------------------------------------------
_CONTRACT_PREFIX = b"%d:" % CONTRACT_VERSION
#: where :func:`spec_argv` keeps a spec's encoding, in the spec's own ``__dict__`` (as a
#: cached property would: read back without a call on the hot path)
_SPEC_ARGV = "_gate_argv"


def spec_argv(spec: DebounceSpec) -> tuple[bytes, bytes, bytes]:
    """Window, max wait and ``<contract version>:<replace flag>`` as ``gate.lua``
    takes them (ARGV[2..4]), encoded once per spec."""
    argv = (
        b"%d" % spec.window_ms,
        b"%d" % spec.max_wait_ms,
        _CONTRACT_PREFIX + (b"1" if spec.replace_payload else b"0"),
    )
    spec.__dict__[_SPEC_ARGV] = argv  # a frozen dataclass: set as cached_property does
    return argv


class GateStore(Protocol):
    """What :func:`gate_keys` and :func:`gate_args` read of a store."""

    settings: Settings
    gate_prefixes: tuple[tuple[str, str], ...]


def gate_keys(store: GateStore, call: PreparedCall) -> list[str]:
    """KEYS of gate.lua: ``open_key(tag, ident)`` and ``due_key(tag)``, from prefixes the
    store built once per shard with those builders (no call per call)."""
    open_prefix, due = store.gate_prefixes[call.shard]
    return [open_prefix + call.ident, due]


#: 1-based ARGV positions of the optional groups of gate.lua (see its header): the cap,
#: the edge mode (with the history TTL), the collect byte budget (with the embed).
CAP_ARGV = 12
EDGE_ARGV = 13
COLLECT_ARGV = 15


def _pad_to(args: list[object], position: int) -> None:
    """Send '' (not given) for every ARGV before ``position`` the call has not filled."""
    args += [""] * (position - 1 - len(args))


def gate_args(store: GateStore, call: PreparedCall, fixed: FixedId | None = None) -> list[object]:
    """ARGV of ``gate.lua``; defaults (JSON payload, no options) are sent as ''.

    Seven values for a default call; the fixed-id four (ARGV[8..11]) only with
    ``fixed``; the cap (ARGV[12]) only with ``debounce_max_calls``; the edge mode and
    the history TTL (ARGV[13..14]) only with ``debounce_leading=True``; the window's
    byte budget and the embed (ARGV[15..16]) only with ``debounce_collect`` (each
    ARGV not given before them sent as '').
    """
    try:
        window, max_wait, replace = call.spec.__dict__[_SPEC_ARGV]
    except KeyError:  # the spec's first call
        window, max_wait, replace = spec_argv(call.spec)
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
    return base._replace(edge=as_edge(edge.decode() if isinstance(edge, bytes) else str(edge)))


# -- finish.lua ----------------------------------------------------------------------------


def finish_aliases(reply: Any) -> list[Any]:
    """The raw aliases (``aliases.parse_aliases``) in ``finish.lua``'s reply."""
    return list(reply[2:])
