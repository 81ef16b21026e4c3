"""Each script's KEYS/ARGV builder, reply decoder and typed result.

Nothing here imports the call encoding (``call.py``, ``message.py``, ``options.py``):
a :class:`~celery_debounce.producer.call.PreparedCall` is read by attribute only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..aliases import MAX_ALIASES
from ..stored_call import DEFAULT_CONTENT_TYPE, EMPTY_OPTIONS, new_task_id
from .keys import split_ident
from .records import TAKE_FIELDS, Record, decode_record
from .states import Edge, as_edge

if TYPE_CHECKING:  # pragma: no cover
    from ..aliases import FixedId
    from ..producer.call import PreparedCall
    from ..producer.options import DebounceSpec
    from ..settings import Settings

#: A shard as the store's methods take it: a number of this process's layout
#: (``settings.tag``), or a shard's tag as it is (a message's ``debounce_tag``, a
#: shard of another layout that a dispatcher drains).
Shard = int | str

#: How long after its message's ``expires`` a window still queued is finished as
#: REVOKED (expire.lua): room for a worker whose clock is behind Redis's, and for the
#: time between the take and the broker's enqueue.
EXPIRY_GRACE_MS = 2000


# -- typed results ----------------------------------------------------------------------


@dataclass(frozen=True)
class TakenWindow:
    """A window taken out of the due set, ready to publish (times: Redis ms): its
    record as decoded (the one owner of its fields; read here as attributes) and what
    the take added."""

    shard: Shard
    #: decoded strictly from ``TAKE_FIELDS``; :func:`_taken` checked ident and payload
    record: Record
    taken_ms: int
    #: publish failures counted against it (``fl``); ``tries`` also counts the takes a
    #: broker outage wasted, which never count
    failures: int = 0
    #: a debounce_exclusive window that was held: ms it was held (0: it was not)
    held_ms: int = 0

    @property
    def task_id(self) -> str:
        return self.record.task_id

    @property
    def ident(self) -> str:
        return self.record.ident or ""

    @property
    def first_seen_ms(self) -> int:
        return self.record.first_seen_ms

    @property
    def deadline_ms(self) -> int:
        return self.record.deadline_ms

    @property
    def ceiling_ms(self) -> int:
        """Absolute: first_seen_ms + the window's max wait."""
        return self.record.ceiling_ms

    @property
    def calls(self) -> int:
        return self.record.calls

    @property
    def content_type(self) -> str:
        return self.record.content_type

    @property
    def payload(self) -> bytes:
        """The protocol-2 body, published as it is."""
        return self.record.payload or b""

    @property
    def options_json(self) -> str:
        return self.record.options_json

    @property
    def tries(self) -> int:
        return self.record.tries

    @property
    def capped(self) -> bool:
        """Closed by its debounce_max_calls (gate.lua), not by time."""
        return self.record.capped

    @property
    def leading(self) -> bool:
        """A leading run (debounce_leading=True), due at its first call."""
        return self.record.leading

    @property
    def task_name(self) -> str:
        return split_ident(self.ident)[0]

    @property
    def key(self) -> str:
        return split_ident(self.ident)[1]

    @property
    def lateness_ms(self) -> int:
        return max(0, self.taken_ms - self.deadline_ms)

    @property
    def forced_by_max_wait(self) -> bool:
        """The max wait, not a quiet period, set this window's deadline."""
        return self.deadline_ms >= self.ceiling_ms


@dataclass(frozen=True)
class TakeResult:
    now_ms: int
    next_in_ms: int  # -1: nothing pending
    windows: list[TakenWindow]
    #: (key, Redis error) of entries take.lua set aside: a key of the wrong type
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: (task id, reason) of taken records whose fields cannot be read
    unreadable: list[tuple[str, str]] = field(default_factory=list)


class ListStep(NamedTuple):
    """One ``list.lua`` step along the due set."""

    examined: int
    cursor: str
    at_cursor: int
    done: bool
    windows: list[Record]


class TakenEntry(NamedTuple):
    """One member of a taken-window set: its record, or the error reading it (a key of
    the wrong type), or neither (the record is gone)."""

    task_id: str
    record: Record | None
    error: str | None


class Cancelled(NamedTuple):
    record: Record
    aliases: list[Any]  # raw alias JSON texts (aliases.parse_aliases)


class CensusRow(NamedTuple):
    task: str
    open: int
    due: int
    oldest_first_seen_ms: int  # -1: none
    calls_waiting: int


class ShardCounts(NamedTuple):
    """``stats`` of one shard: open and due windows, the counters (``<kind>|<task>``)."""

    open: int
    due: int
    counters: dict[str, int]


class ShardSnapshot(NamedTuple):
    """What ``top`` reads of one shard; a key of the wrong type reads as empty."""

    open: int
    due: int
    first_due_ms: int | None
    leased: int
    active: int
    quarantined: int
    counters: dict[str, int]
    hot: list[tuple[str, int]]
    dispatchers: list[tuple[str, int]]
    alive: list[tuple[str, int]] = []  # name -> last heartbeat ms (alive.lua)
    stopped: list[tuple[str, int]] = []  # name -> clean stop ms
    held: int = 0  # debounce_exclusive windows held behind a run of their key
    held_front: list[tuple[str, int]] = []  # the longest held: ident -> held since ms


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

#: The version of the gate contract (docs/contract.md) this producer speaks: sent as
#: ``gate.lua``'s ARGV[4] prefix ``<version>:``; the gate refuses another version
#: (``DebounceContractMismatch``). gate.lua's ``CONTRACT`` and contract/vectors.json
#: carry the same number (tests/system/test_contract_vectors.py checks all three).
CONTRACT_VERSION = 1
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


class GateResult(NamedTuple):
    """What the gate decided for one call (times are Redis server ms)."""

    task_id: str
    opened: bool
    deadline_ms: int
    calls: int
    now_ms: int
    #: ``"lead"``: this call is a leading run (published at once); ``"suppressed"``:
    #: folded into the leading run ``task_id`` (leading only); ``""`` otherwise
    edge: Edge = ""


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
