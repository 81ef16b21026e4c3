"""The store contract's results: what the gate, a take, the operators' reads and a cancel
return, in the store's own terms (times are the store's clock, ms). Every store returns
these; nothing here knows how a store keeps its windows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .idents import split_ident
from .records import Record
from .states import Edge

#: A shard as the store's methods take it: a number of this process's layout
#: (``store.tag``), or a shard's tag as it is (a message's ``debounce_tag``, a
#: shard of another layout that a dispatcher drains).
Shard = int | str

#: How long after its message's ``expires`` a window still queued is finished as
#: REVOKED (expire.lua): room for a worker whose clock is behind Redis's, and for the
#: time between the take and the broker's enqueue.
EXPIRY_GRACE_MS = 2000

#: The version of the gate contract (docs/contract.md) this producer speaks: the Redis
#: gate's ARGV[4] prefix ``<version>:`` and every published task definition carry it; a
#: store refuses another version (``DebounceContractMismatch``). gate.lua's
#: ``CONTRACT`` and contract/vectors.json carry the same number
#: (tests/system/test_contract_vectors.py checks all three).
CONTRACT_VERSION = 1


@dataclass(frozen=True)
class TakenWindow:
    """A window taken out of the due set, ready to publish (times: the store's clock, ms): its
    record as decoded (the one owner of its fields; read here as attributes) and what
    the take added."""

    shard: Shard
    #: decoded strictly by the store's take, which checked its ident and payload
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


#: Windows an operator read takes in its first bounded step (``OperatorStore.open_windows``;
#: the Redis store grows later steps), a page of taken windows, a census step.
OPEN_PAGE = 1000
TAKEN_PAGE = 500
CENSUS_PAGE = 1000


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


class HeldFront(NamedTuple):
    """One of the longest-held exclusive windows of a snapshot."""

    ident: str
    since_ms: int  # held since (the store's clock)
    waits_for: str | None = None  # the id of the run in progress (None: it just ended)
    state: str | None = None  # that run's state: dispatching, queued, claimed


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
    held_front: list[HeldFront] = []  # the longest held, with the run each waits for


class GateResult(NamedTuple):
    """What the gate decided for one call (times are the store's clock, ms)."""

    task_id: str
    opened: bool
    deadline_ms: int
    calls: int
    now_ms: int
    #: ``"lead"``: this call is a leading run (published at once); ``"suppressed"``:
    #: folded into the leading run ``task_id`` (leading only); ``""`` otherwise
    edge: Edge = ""
