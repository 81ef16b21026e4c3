"""Read-only view of windows for operators: the data behind ``celery debounce inspect``."""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from celery import Celery

from ..layout import TAKEN_SETS, Record, ident_prefix, split_ident, window_ident
from ..store import store_for
from ..store.api import OperatorStore

#: States in the order a window goes through them.
STATES = ("pending", "dispatching", "queued", "claimed", "quarantined")
_CHUNK = 500


@dataclass(frozen=True)
class WindowInfo:
    """One window as operators see it. Times are epoch seconds (Redis clock)."""

    task: str
    key: str
    task_id: str
    state: str
    first_seen: float
    deadline: float
    max_wait_at: float
    calls: int
    shard: int
    error: str | None = None
    max_calls: int | None = None  # the window's debounce_max_calls, when it has one
    #: "leading": a leading run (published at its first call); "trailing": a window
    #: opened during the quiet period after a leading run (due at its end); None: neither
    edge: str | None = None
    #: the end of the quiet period this window belongs to (epoch seconds), while it
    #: runs: set on a leading run by listings and ``find``; None otherwise
    quiet_until: float | None = None
    #: a debounce_collect window: bytes of the body its run gets (``calls`` calls)
    collected_bytes: int | None = None
    #: a pending debounce_exclusive window held while a run of its key is in progress:
    #: since when (epoch seconds), and the id of the window it waits for
    held_since: float | None = None
    waits_for: str | None = None

    @property
    def forced_by_max_wait(self) -> bool:
        return self.deadline >= self.max_wait_at

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["forced_by_max_wait"] = self.forced_by_max_wait
        return data


def window_info(
    record: Record, shard: int, state: str, quiet_until_ms: int | None = None
) -> WindowInfo:
    """A decoded record (layout.decode_record) as operators see it; ``state`` is used
    when the record holds none (a pending window); ``quiet_until_ms``: the end of the
    quiet period a leading run still owns (``OperatorStore.quiet_ends``)."""
    raw = record.ident or ""
    try:
        task, key = split_ident(raw)
    except ValueError:  # a garbled record (quarantined by the dispatcher): show it as is
        task, key = "?", raw
    return WindowInfo(
        task=task,
        key=key,
        task_id=record.task_id,
        state=record.state if record.state is not None else state,
        first_seen=record.first_seen_ms / 1000,
        deadline=record.deadline_ms / 1000,
        max_wait_at=record.ceiling_ms / 1000,
        calls=record.calls,
        shard=shard,
        error=record.error,
        max_calls=record.max_calls,
        edge="leading" if record.leading else "trailing" if record.trailing else None,
        quiet_until=quiet_until_ms / 1000 if quiet_until_ms is not None else None,
        collected_bytes=record.collected_bytes,
    )


def pending_info(store: OperatorStore, ident: str, shard: int) -> WindowInfo | None:
    """The pending window of ``ident``, or None: one HMGET and one ZSCORE (its deadline)."""
    record = store.pending(shard, ident)
    return None if record is None else window_info(record, shard, "pending")


def _shard_windows(
    store: OperatorStore,
    shard: int,
    wanted: set[str],
    task: str | None,
    key_glob: str | None,
    limit: int | None = None,
) -> Iterator[WindowInfo]:
    if "pending" in wanted:
        held = store.held(shard)
        for info in walk_pending(store, shard, task=task, key_glob=key_glob, limit=limit):
            hold = held.get(window_ident(info.task, info.key)) if held else None
            yield (
                info
                if hold is None
                else replace(info, held_since=hold[0] / 1000, waits_for=hold[1])
            )
    for zset, states in TAKEN_SETS:
        if not states & wanted:
            continue
        found = 0
        # Read the set a page at a time, in score order (lease expiry, hand-over time,
        # quarantine time), and stop once `limit` windows matched: a limited listing
        # does not read a large set whole.
        for start in itertools.count(0, _CHUNK):
            page = store.taken_page(shard, zset, start, _CHUNK)
            quiet = store.quiet_ends(shard, [e.record for e in page if e.record is not None])
            for entry in page:
                if entry.error is not None:  # not a hash: see take.lua's wrong-type rule
                    if "quarantined" in wanted and task is None and key_glob is None:
                        found += 1
                        yield WindowInfo(
                            "?", "", entry.task_id, "quarantined", 0, 0, 0, 0, shard, entry.error
                        )
                    continue
                if entry.record is None:
                    continue
                info = window_info(entry.record, shard, "", quiet.get(entry.task_id))
                if info.state in wanted and _matches(info, task, key_glob):
                    found += 1
                    yield info
            if len(page) < _CHUNK or (limit is not None and found >= limit):
                break


#: Members list.lua examines per call: the first call is small (a limited listing
#: usually stops there), later ones larger; each call blocks Redis for ~1 us a member.
_WALK_FIRST = 1000
_WALK_MAX = 20000


def walk_pending(
    store: OperatorStore,
    shard: int,
    *,
    task: str | None = None,
    key_glob: str | None = None,
    limit: int | None = None,
) -> Iterator[WindowInfo]:
    """Pending windows of ``shard`` in deadline order, filtered inside Redis.

    Runs ``list.lua`` in bounded steps along the due set and stops as soon as
    ``limit`` windows matched: a limited listing reads only the front of the set.
    """
    prefix = ident_prefix(task) if task is not None else ""
    pattern = glob_to_lua(key_glob) if key_glob is not None else b""
    start, skip, budget, found = "-inf", 0, _WALK_FIRST, 0
    while limit is None or found < limit:
        want = budget if limit is None else limit - found
        step = store.list_step(shard, start, skip, budget, want, prefix, pattern)
        for record in step.windows:
            info = window_info(record, shard, "pending")
            if _matches(info, task, key_glob):
                found += 1
                yield info
        if step.done or step.examined == 0:
            return
        start, skip = step.cursor, step.at_cursor
        budget = min(budget * 4, _WALK_MAX)


_LUA_MAGIC = frozenset(b"^$()%.[]*+-?")
#: One UTF-8 encoded character in a Lua pattern: a byte that does not continue a
#: character, then any continuation bytes. Keys are valid UTF-8 (key_templates.resolve).
_ONE_CHAR = b"[^\x80-\xbf][\x80-\xbf]*"


def glob_to_lua(glob: str) -> bytes:
    """An anchored Lua pattern matching at least what the fnmatch ``glob`` matches.

    Lua patterns work on bytes; the pattern is built on the glob's UTF-8 bytes and
    ``?`` matches one whole character (1 to 4 bytes), as fnmatch does on text. Exact
    for ``*``, ``?`` and literal text; a glob with ``[...]`` sets gives b"" (match
    all), and the caller's exact fnmatch check does the filtering.
    """
    if "[" in glob:
        return b""
    out = [b"^"]
    for ch in glob:
        if ch == "*":
            out.append(b".*")
        elif ch == "?":
            out.append(_ONE_CHAR)
        else:
            raw = ch.encode("utf-8", "surrogatepass")
            out.append(b"%" + raw if raw[0] in _LUA_MAGIC else raw)
    out.append(b"$")
    return b"".join(out)


def _matches(info: WindowInfo, task: str | None, key_glob: str | None) -> bool:
    if task is not None and info.task != task:
        return False
    return key_glob is None or fnmatch.fnmatchcase(info.key, key_glob)


def list_windows(
    app: Celery,
    *,
    states: Iterable[str] | None = None,
    task: str | None = None,
    key_glob: str | None = None,
    limit: int | None = None,
) -> list[WindowInfo]:
    """Windows matching the filters, sorted by deadline (at most ``limit`` of them).

    Pending windows are read along the due set in deadline order, so a limited
    listing costs O(limit) reads per shard whatever the number of open windows.
    The sets are read one after the other, not atomically: a window taken between
    two reads is listed once, in its later state.
    """
    store: OperatorStore = store_for(app)
    wanted = set(states) if states else set(STATES)
    by_id: dict[str, WindowInfo] = {}
    for shard in range(store.settings.shards):
        for info in _shard_windows(store, shard, wanted, task, key_glob, limit):
            by_id[info.task_id] = info  # pending is read first: a later state wins
    found = sorted(by_id.values(), key=lambda w: w.deadline)
    return found if limit is None else found[:limit]
