"""Read-only view of windows for operators: the data behind ``celery debounce inspect``."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import replace

from celery import Celery

from ..producer.steering import WindowInfo, pending_info, window_info
from ..store import store_for
from ..store.api import OperatorStore
from ..store.idents import TAKEN_SETS, key_matches

__all__ = [
    "STATES",
    "WindowInfo",
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
        yield from walk_pending(store, shard, task=task, key_glob=key_glob, limit=limit)
    for group, states in TAKEN_SETS:
        if not states & wanted:
            continue
        found = 0
        # Read the group a page at a time, in its order (lease expiry, hand-over time,
        # quarantine time), and stop once `limit` windows matched: a limited listing
        # does not read a large group whole.
        entries = store.taken_windows(shard, group, _CHUNK)
        while page := list(itertools.islice(entries, _CHUNK)):
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
                info = window_info(entry.record, shard, "", entry.record.quiet_end_ms)
                if info.state in wanted and key_matches(info.task, info.key, task, key_glob):
                    found += 1
                    yield info
            if limit is not None and found >= limit:
                break


def walk_pending(
    store: OperatorStore,
    shard: int,
    *,
    task: str | None = None,
    key_glob: str | None = None,
    limit: int | None = None,
) -> Iterator[WindowInfo]:
    """Pending windows of ``shard`` in deadline order, filtered inside the store
    (``OperatorStore.open_windows``: bounded steps, a limited listing reads only the
    front of the open windows)."""
    for record in store.open_windows(shard, task=task, key_glob=key_glob, limit=limit):
        info = window_info(record, shard, "pending")
        if record.held_since_ms is not None:
            info = replace(info, held_since=record.held_since_ms / 1000, waits_for=record.waits_for)
        yield info


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
