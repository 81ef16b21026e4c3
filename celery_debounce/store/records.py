"""A window's record as every store returns it (:class:`Record`), and the stats
counters' names. How a store keeps a record is its own (the Redis store's fields:
:mod:`celery_debounce.store.redis.fields`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from ..stored_call import DEFAULT_CONTENT_TYPE, EMPTY_OPTIONS
from .idents import matches
from .states import WindowState

#: Upper bounds (ms) of the dispatch lateness buckets counted by take.lua in
#: ``l<b>|<task>`` (the last bucket, index ``len(LATE_BUCKETS_MS)``, is everything
#: above). take.lua receives them as its ARGV[8..]; nothing else keeps a copy.
LATE_BUCKETS_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)

#: How many idents ``<tag>:hot`` keeps (take.lua: calls absorbed per ident, for ``top``).
HOT_KEYS_KEPT = 100

#: Held windows ``OperatorStore.snapshot`` lists per shard (the longest held first); the
#: others are counted.
HELD_LISTED = 8


# -- stats counters ----------------------------------------------------------------------

#: Counter kinds in ``<tag>:stats`` (field ``<kind>|<task>``): runs, calls in them,
#: forced by max wait, cancelled, closed by the call cap, leading runs (take.lua), calls
#: suppressed after a leading run (gate.lua), duplicate deliveries skipped (claim.lua),
#: exclusive windows held and the ms they were held, counted when taken (take.lua);
#: ``l<b>`` is lateness bucket b.
COUNTER_KINDS = {
    "r": "runs",
    "c": "calls",
    "f": "forced",
    "x": "cancelled",
    "m": "closed_by_cap",
    "e": "leading_runs",
    "s": "suppressed",
    "d": "duplicates_skipped",
    "h": "holds",
    "hm": "held_ms",
    "i": "calls_in",
}


def split_counter(name: str) -> tuple[str, str]:
    """``(kind, task)`` of a stats field ``<kind>|<task>``."""
    kind, _, task = name.partition("|")
    return kind, task


def with_hold(record: Record, held: dict[str, tuple[int, str | None]]) -> Record:
    """``record`` with since when it is held and the run it waits for, when ``held``
    (ident -> (since ms, run id)) holds it."""
    hold = held.get(record.ident or "") if held else None
    return record if hold is None else record._replace(held_since_ms=hold[0], waits_for=hold[1])


def open_by_id(
    record: Record | None,
    task_id: str,
    task: str | None,
    key_glob: str | None,
    limit: int | None,
    held: Callable[[], dict[str, tuple[int, str | None]]],
) -> Iterator[Record]:
    """``OperatorStore.open_windows(task_id=...)`` once a store read the open window its
    id index or scan found (None: none): it, if it still has that id and passes the
    filters, with its hold (``held`` read only then)."""
    if record is not None and record.task_id == task_id and limit != 0:
        if matches(record.ident or "", task, key_glob):
            yield with_hold(record, held())


class Record(NamedTuple):
    """One window's record, as a store read it (times: the store's clock, ms)."""

    task_id: str
    ident: str | None
    first_seen_ms: int
    deadline_ms: int
    max_wait_ms: int  # a duration: the ceiling is first_seen_ms + max_wait_ms
    calls: int
    state: WindowState | None = None
    error: str | None = None
    max_calls: int | None = None
    content_type: str = DEFAULT_CONTENT_TYPE
    payload: bytes | None = None
    options_json: str = EMPTY_OPTIONS
    tries: int = 1
    capped: bool = False
    leading: bool = False  # ld: a leading run
    trailing: bool = False  # tr: a trailing window
    collected_bytes: int | None = None  # a debounce_collect window (cb)
    collect_list: str | None = None  # its list suffix while pending (cl)
    #: its calls so far, each ``[ms, args, kwargs(, id)]`` as JSON, in call order (read
    #: by ``pending_payloads`` only)
    collected: tuple[bytes, ...] | None = None
    #: a leading run's quiet period's end (ms) while the run still owns it (read by
    #: ``taken`` and ``taken_windows`` only)
    quiet_end_ms: int | None = None
    #: a ``debounce_exclusive`` window held behind a run of its key: since when (ms),
    #: and the id of that run (None: it just ended) (read by ``open_windows`` only)
    held_since_ms: int | None = None
    waits_for: str | None = None

    @property
    def ceiling_ms(self) -> int:
        """The absolute time (ms) the max wait forces the deadline to."""
        return self.first_seen_ms + self.max_wait_ms


def as_text(value: Any) -> str:
    """A field a store read (bytes from Redis, text from PostgreSQL) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
