"""The store's typed results, and the decoder of ``take.lua``'s rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..layout import TAKE_FIELDS, Record, decode_record, split_ident

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
    """A window taken out of the due set, ready to publish (times: Redis ms)."""

    shard: Shard
    task_id: str
    ident: str
    first_seen_ms: int
    deadline_ms: int
    ceiling_ms: int  # absolute: first_seen_ms + the window's max wait
    calls: int
    content_type: str
    payload: bytes  # the protocol-2 body, published as it is
    options_json: str
    tries: int
    taken_ms: int
    capped: bool = False  # closed by its debounce_max_calls (gate.lua), not by time
    leading: bool = False  # a leading run (debounce_leading=True), due at its first call
    #: publish failures counted against it (``fl``); ``tries`` also counts the takes a
    #: broker outage wasted, which never count
    failures: int = 0
    #: a debounce_exclusive window that was held: ms it was held (0: it was not)
    held_ms: int = 0

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
        task_id=record.task_id,
        ident=record.ident,
        first_seen_ms=record.first_seen_ms,
        deadline_ms=record.deadline_ms,
        ceiling_ms=record.ceiling_ms,
        calls=record.calls,
        content_type=record.content_type,
        payload=record.payload,
        options_json=record.options_json,
        tries=record.tries,
        taken_ms=now_ms,
        capped=record.capped,
        leading=record.leading,
        failures=int(row[len(TAKE_FIELDS)] or 0) if len(row) > len(TAKE_FIELDS) else 0,
        held_ms=int(row[len(TAKE_FIELDS) + 1]) if len(row) > len(TAKE_FIELDS) + 1 else 0,
    )
