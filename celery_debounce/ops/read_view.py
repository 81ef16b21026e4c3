"""Read-only view of windows for operators: the data behind ``celery debounce inspect``."""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import replace

from celery import Celery

from ..producer.steering import WindowInfo, pending_info, window_info
from ..store import store_for
from ..store.api import OperatorStore
from ..store.idents import TAKEN_SETS, ident_prefix, window_ident

__all__ = [
    "STATES",
    "WindowInfo",
    "glob_to_lua",
    "list_windows",
    "pending_info",
    "walk_pending",
    "window_info",
]

#: States in the order a window goes through them.
STATES = ("pending", "dispatching", "queued", "claimed", "quarantined")
_CHUNK = 500


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
