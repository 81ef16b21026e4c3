"""What the stage tests read of an app's windows, through its store's operator role.

Each read is in domain terms (a window's record, its deadline, how many are open,
taken or held), built only on the store's public members (``store/api.py``), so a test
says what it means and could run over any store. What only Redis has (its faults, a
planted corrupt record, its key layout) the tests still read raw, marked there.
"""

from __future__ import annotations

from collections.abc import Iterator

from celery import Celery

from celery_debounce.store import store_for
from celery_debounce.store.api import Store
from celery_debounce.store.idents import TakenGroup, shard_of, window_ident
from celery_debounce.store.records import Record
from celery_debounce.store.results import ShardSnapshot

__all__ = [
    "counters",
    "deadline_of",
    "held_count",
    "held_idents",
    "nothing_stored",
    "open_count",
    "open_payload",
    "open_records",
    "open_window",
    "shard_for",
    "snapshots",
    "state_of",
    "store_time_ms",
    "taken_count",
    "taken_ids",
    "taken_record",
]


def _store(app: Celery) -> Store:
    """The app's store in this process."""
    return store_for(app)


def shard_for(app: Celery, task: str, key: str) -> int:
    """The shard the window of (``task``, ``key``) lives in, by the app's layout."""
    return shard_of(window_ident(task, key), _store(app).settings.shards)


def open_window(app: Celery, task: str, key: str) -> Record | None:
    """The open window of (``task``, ``key``), or None."""
    return _store(app).pending(shard_for(app, task, key), window_ident(task, key))


def deadline_of(app: Celery, task: str, key: str) -> int | None:
    """The deadline (ms, the store's clock) of the open window of (``task``, ``key``)."""
    record = open_window(app, task, key)
    return None if record is None else record.deadline_ms


def open_payload(app: Celery, task: str, key: str) -> Record | None:
    """The open window of (``task``, ``key``) with its payload and options, or None."""
    ident = window_ident(task, key)
    for record in _store(app).pending_payloads(shard_for(app, task, key), ident):
        if record.ident == ident:
            return record
    return None


def open_records(app: Celery) -> list[Record]:
    """Every open window of the app (each shard's in deadline order, shard by shard)."""
    store = _store(app)
    return [r for shard in range(store.settings.shards) for r in store.open_windows(shard)]


def snapshots(app: Celery) -> Iterator[ShardSnapshot]:
    """Each shard's gauges, read now."""
    store = _store(app)
    now_ms = store.time_ms()
    for shard in range(store.settings.shards):
        yield store.snapshot(shard, now_ms)


def open_count(app: Celery) -> int:
    """How many windows are open, over every shard."""
    return sum(s.open for s in snapshots(app))


def nothing_stored(app: Celery) -> bool:
    """No window of the app in its store: none open, none taken (leased, active or
    quarantined), no counter (what a refused call leaves)."""
    return all(
        s.open == s.leased == s.active == s.quarantined == 0 and not s.counters
        for s in snapshots(app)
    )


def taken_count(app: Celery, group: TakenGroup) -> int:
    """How many taken windows are in ``group`` (leased, active, quarantine), every shard."""
    field = "quarantined" if group == "quarantine" else group
    return sum(int(getattr(s, field)) for s in snapshots(app))


def taken_ids(app: Celery, group: TakenGroup) -> list[str]:
    """The task ids of the taken windows in ``group``, shard by shard in its order."""
    store = _store(app)
    shards = range(store.settings.shards)
    return [e.task_id for shard in shards for e in store.taken_windows(shard, group)]


def held_count(app: Celery) -> int:
    """How many open windows are held behind a run of their key, over every shard."""
    return sum(s.held for s in snapshots(app))


def held_idents(app: Celery) -> list[str]:
    """The idents of the longest-held windows (a snapshot lists a few per shard)."""
    return [h.ident for s in snapshots(app) for h in s.held_front]


def counters(app: Celery) -> dict[str, int]:
    """The stats counters (``<kind>|<task>`` -> value), summed over the shards."""
    total: dict[str, int] = {}
    for snap in snapshots(app):
        for name, value in snap.counters.items():
            total[name] = total.get(name, 0) + value
    return total


def taken_record(app: Celery, task_id: str) -> Record | None:
    """The record of the taken window ``task_id`` (any state from taken to finished)."""
    found = _store(app).taken(task_id)
    return None if found is None else found[1]


def state_of(app: Celery, task_id: str) -> str | None:
    """The state of the taken window ``task_id`` (None: no such taken window)."""
    record = taken_record(app, task_id)
    return None if record is None else record.state


def store_time_ms(app: Celery) -> int:
    """The store's clock, ms."""
    return _store(app).time_ms()
