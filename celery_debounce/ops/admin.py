"""Admin API: list, look up, flush, cancel windows and read their statistics.

The ``celery debounce`` command is a thin layer over :class:`DebounceAdmin`;
admin pages and scripts can use it the same way::

    admin = DebounceAdmin(app)
    admin.windows(task="app.tasks.report", limit=20)
    admin.flush("app.tasks.report", "user:42")      # run now
    admin.cancel_id("6b2f...")                      # never run; result revoked
    admin.stats().tasks["app.tasks.report"].coalescing_ratio

:func:`read_snapshot` reads the store's gauges at a bounded cost (``top`` draws it, the
exporter serves it).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from ..errors import WindowNotFound, WindowNotPending
from ..producer import steering
from ..producer.steering import WindowInfo, flush_window, window_info
from ..store import store_for
from ..store.api import OperatorStore
from ..store.idents import shard_of, window_ident
from ..store.records import COUNTER_KINDS, HELD_LISTED, LATE_BUCKETS_MS, split_counter
from .read_view import list_windows, walk_pending

logger = logging.getLogger("celery_debounce.admin")

__all__ = [
    "LATE_BUCKETS_MS",
    "DebounceAdmin",
    "Held",
    "Snapshot",
    "Stats",
    "TaskStats",
    "read_snapshot",
]

_PIPE_CHUNK = 500


@dataclass
class TaskStats:
    """Figures for one task. Counters (``runs`` on) cover every window taken since
    the stats were last reset; ``open`` on are the windows pending right now."""

    task: str
    open: int = 0
    due: int = 0
    oldest_first_seen: float | None = None
    calls_waiting: int = 0
    runs: int = 0
    calls: int = 0
    forced: int = 0
    cancelled: int = 0
    closed_by_cap: int = 0
    leading_runs: int = 0
    suppressed: int = 0
    duplicates_skipped: int = 0
    holds: int = 0
    held_ms: int = 0
    #: calls the gate accepted (gate.lua's i|<task>), counted as they arrive, whatever
    #: their window later does; ``calls`` counts the calls of windows taken
    calls_in: int = 0
    lateness_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATE_BUCKETS_MS) + 1))

    @property
    def coalescing_ratio(self) -> float | None:
        """Calls per run: how many calls each dispatched window absorbed on average."""
        return self.calls / self.runs if self.runs else None

    def lateness_ms(self, quantile: float) -> float | None:
        """Upper bound (ms) of the bucket holding that quantile of dispatch lateness;
        ``inf`` when it falls above the last bound, None without runs."""
        total = sum(self.lateness_buckets)
        if not total:
            return None
        rank = quantile * total
        seen = 0
        for index, count in enumerate(self.lateness_buckets):
            seen += count
            if seen >= rank and count:
                bounds = LATE_BUCKETS_MS
                return float(bounds[index]) if index < len(bounds) else float("inf")
        return float("inf")

    def merge(self, other: TaskStats) -> None:
        self.open += other.open
        self.due += other.due
        self.calls_waiting += other.calls_waiting
        if other.oldest_first_seen is not None and (
            self.oldest_first_seen is None or other.oldest_first_seen < self.oldest_first_seen
        ):
            self.oldest_first_seen = other.oldest_first_seen
        self.runs += other.runs
        self.calls += other.calls
        self.forced += other.forced
        self.cancelled += other.cancelled
        self.closed_by_cap += other.closed_by_cap
        self.leading_runs += other.leading_runs
        self.suppressed += other.suppressed
        self.duplicates_skipped += other.duplicates_skipped
        self.holds += other.holds
        self.held_ms += other.held_ms
        self.calls_in += other.calls_in
        self.lateness_buckets = [
            a + b for a, b in zip(self.lateness_buckets, other.lateness_buckets, strict=True)
        ]

    def as_json(self, census: bool = True) -> dict[str, Any]:
        """``census=False`` (``stats --quick``): the figures the scan counts (open, due,
        oldest_first_seen, calls_waiting) are null, "not counted", never 0."""
        return {
            "task": self.task,
            "open": self.open if census else None,
            "due": self.due if census else None,
            "oldest_first_seen": self.oldest_first_seen if census else None,
            "calls_waiting": self.calls_waiting if census else None,
            "runs": self.runs,
            "calls": self.calls,
            "coalescing_ratio": self.coalescing_ratio,
            "forced_by_max_wait": self.forced,
            "cancelled": self.cancelled,
            "closed_by_cap": self.closed_by_cap,
            "leading_runs": self.leading_runs,
            "suppressed": self.suppressed,
            "duplicates_skipped": self.duplicates_skipped,
            "holds": self.holds,
            "held_ms": self.held_ms,
            "calls_in": self.calls_in,
            "lateness_ms": {
                f"p{int(q * 100)}": _finite(self.lateness_ms(q)) for q in (0.5, 0.9, 0.99)
            },
            "lateness_buckets": dict(
                zip(
                    [*(f"le_{b}" for b in LATE_BUCKETS_MS), "above"],
                    self.lateness_buckets,
                    strict=True,
                )
            ),
        }


def _finite(value: float | None) -> float | str | None:
    return "inf" if value == float("inf") else value


@dataclass
class Stats:
    """What ``celery debounce stats`` shows. ``census`` is False when per-task
    open counts and the oldest window were skipped (then ``open``/``due`` are
    still exact totals; per-task ``open``/``due`` are 0 here and null in
    :meth:`as_json`)."""

    now: float
    open: int
    due: int
    census: bool
    tasks: dict[str, TaskStats]

    @property
    def total(self) -> TaskStats:
        total = TaskStats(task="*")
        for stats in self.tasks.values():
            total.merge(stats)
        total.open, total.due = self.open, self.due
        return total

    def as_json(self) -> dict[str, Any]:
        """Without the census, per-task open/due and every oldest/calls-waiting figure
        are null (not counted); the total open and due are exact either way."""
        total = self.total.as_json(self.census)
        total["open"], total["due"] = self.open, self.due
        return {
            "now": self.now,
            "open": self.open,
            "due": self.due,
            "census": self.census,
            "total": total,
            "tasks": [self.tasks[name].as_json(self.census) for name in sorted(self.tasks)],
        }


class DebounceAdmin:
    """Operator actions on one app's windows. Every method raises
    :class:`~celery_debounce.DebounceBackendError` when Redis fails."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.store: OperatorStore = store_for(app)
        self.settings = self.store.settings

    @property
    def backend(self) -> OperatorStore:
        """:attr:`store` under its name before ``store``: deprecated, warns."""
        warnings.warn(
            "DebounceAdmin.backend is deprecated: use DebounceAdmin.store",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.store

    @backend.setter
    def backend(self, store: OperatorStore) -> None:
        warnings.warn(
            "DebounceAdmin.backend is deprecated: use DebounceAdmin.store",
            DeprecationWarning,
            stacklevel=2,
        )
        self.store = store

    # -- reading ------------------------------------------------------------
    def windows(
        self,
        *,
        task: str | None = None,
        key_glob: str | None = None,
        states: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> list[WindowInfo]:
        """Windows sorted by deadline; see :func:`celery_debounce.ops.read_view.list_windows`."""
        return list_windows(self.app, states=states, task=task, key_glob=key_glob, limit=limit)

    def window(self, task: str, key: str) -> WindowInfo | None:
        """The pending window of (task, key), or None. One HMGET and one ZSCORE."""
        return steering.window(self.store, task, key)

    def find(self, task_id: str) -> WindowInfo | None:
        """The window with this task id, in any state, or None.

        Taken windows are one lookup per shard (``win:<task_id>``). Pending windows
        are stored by (task, key), so finding one by id is a scan of the due set
        inside Redis (``find.lua``, 1,000 members a step): about 1.5 s per million
        open windows. Prefer ``window(task, key)`` when you know the key.
        """
        tagged = self._taken(task_id)
        if tagged is not None:
            return tagged
        found = self._find_pending(task_id)
        return found[1] if found else None

    # -- flush ----------------------------------------------------------------
    def flush(self, task: str, key: str) -> WindowInfo:
        """Close the pending window of (task, key) to new calls and make it due now;
        dispatchers publish it at once. Returns the window as flushed (deadline now).
        The next call for the key opens a new window. Raises WindowNotFound."""
        return steering.flush(self.store, task, key)

    def flush_id(self, task_id: str) -> WindowInfo:
        """Flush the pending window with this task id. Raises WindowNotFound or
        WindowNotPending (already taken for dispatch)."""
        ident, found = self._pending_by_id(task_id)
        info = flush_window(self.store, found.shard, ident, task_id)
        if info is None:
            raise WindowNotPending(f"window {task_id} was dispatched meanwhile", "dispatching")
        logger.info("debounce: flushed %s[%s] key=%r", info.task, task_id, info.key)
        return info

    def flush_all(self, task: str | None = None) -> int:
        """Flush every pending window (of ``task`` if given). Returns how many."""
        flushed = 0
        for shard, listed in self._pending_idents(task):
            for chunk in _chunks(listed, _PIPE_CHUNK):  # only the windows listed, never a newer one
                flushed += len(self.store.flush(shard, chunk))
        logger.info("debounce: flushed %d window(s)%s", flushed, f" of {task}" if task else "")
        return flushed

    # -- cancel ---------------------------------------------------------------
    def cancel(self, task: str, key: str) -> WindowInfo:
        """Drop the pending window of (task, key) so it never runs, and mark its
        result revoked (``.get()`` raises TaskRevokedError). Returns the window
        cancelled (read in the same script that drops it). Raises WindowNotFound."""
        return steering.cancel(self.app, self.store, task, key)

    def cancel_id(self, task_id: str) -> WindowInfo:
        """Cancel the pending window with this task id. Raises WindowNotFound or
        WindowNotPending (already taken: revoke it with ``celery control revoke``)."""
        ident, found = self._pending_by_id(task_id)
        info = self._cancel_one(ident, found.shard, task_id)
        if info is None:
            raise WindowNotPending(f"window {task_id} was dispatched meanwhile", "dispatching")
        return info

    def cancel_all(self, task: str | None = None) -> int:
        """Cancel every pending window (of ``task`` if given). Returns how many."""
        cancelled = 0
        for shard, listed in self._pending_idents(task):
            for ident, task_id in listed:  # only the windows listed, never a newer one
                if self._cancel_one(ident, shard, task_id) is not None:
                    cancelled += 1
        return cancelled

    # -- stats ----------------------------------------------------------------
    def stats(self, *, census: bool = True) -> Stats:
        """Open and due windows, counters and lateness per task.

        ``census=False`` skips the per-task scan of open windows (per-task open
        counts, oldest window, calls waiting): with a million open windows the
        scan takes about 1.5 s, the rest a few round trips.
        """
        tasks: dict[str, TaskStats] = {}
        total_open = total_due = 0
        now_ms = self.store.time_ms("stats")
        for shard in range(self.settings.shards):
            counts = self.store.snapshot(shard, now_ms)
            total_open += counts.open
            total_due += counts.due
            for name, value in counts.counters.items():
                _add_counter(tasks, name, value)
            if census:
                for rows in self.store.census(shard, now_ms):
                    for found in rows:
                        row = TaskStats(
                            task=found.task,
                            open=found.open,
                            due=found.due,
                            calls_waiting=found.calls_waiting,
                        )
                        if found.oldest_first_seen_ms >= 0:
                            row.oldest_first_seen = found.oldest_first_seen_ms / 1000
                        tasks.setdefault(row.task, TaskStats(task=row.task)).merge(row)
        return Stats(now=now_ms / 1000, open=total_open, due=total_due, census=census, tasks=tasks)

    def reset_stats(self) -> dict[str, TaskStats]:
        """Zero the counters (runs, calls, forced, cancelled, lateness) atomically.

        Returns the counters removed, per task: every increment is either in them or
        counted after the reset, never lost. Each shard's hash is RENAMEd away (one
        atomic step: later increments start a new hash), read, then deleted; the
        renamed copy keeps the hash's TTL, so a crash in between leaves nothing forever.
        """
        removed: dict[str, TaskStats] = {}
        for shard in range(self.settings.shards):
            for name, value in self.store.reset_counters(shard).items():
                _add_counter(removed, name, value)
        return removed

    # -- internals ------------------------------------------------------------
    def _shard(self, ident: str) -> int:
        return shard_of(ident, self.settings.shards)

    def _taken(self, task_id: str) -> WindowInfo | None:
        found = self.store.taken(task_id)
        if found is None:
            return None
        shard, record = found
        return window_info(record, shard, "", record.quiet_end_ms)

    def _find_pending(self, task_id: str) -> tuple[str, WindowInfo] | None:
        for shard in range(self.settings.shards):
            for record in self.store.open_windows(shard, task_id=task_id):
                return record.ident or "", window_info(record, shard, "pending")
        return None

    def _pending_by_id(self, task_id: str) -> tuple[str, WindowInfo]:
        taken = self._taken(task_id)  # one lookup; spares the scan for taken windows
        if taken is not None:
            raise WindowNotPending(
                f"window {task_id} ({taken.task} key {taken.key!r}) is {taken.state}: "
                "already taken for dispatch",
                taken.state,
            )
        found = self._find_pending(task_id)
        if found is not None:
            return found
        raise WindowNotFound(f"no window with task id {task_id!r}")

    def _pending_idents(self, task: str | None) -> Iterable[tuple[int, list[tuple[str, str]]]]:
        """Per shard, (ident, task id) of every pending window (of ``task``)."""
        for shard in range(self.settings.shards):
            listed = [
                (window_ident(w.task, w.key), w.task_id)
                for w in walk_pending(self.store, shard, task=task)
            ]
            if listed:
                yield shard, listed

    def _cancel_one(self, ident: str, shard: int, task_id: str) -> WindowInfo | None:
        return steering.cancel_one(self.app, self.store, ident, shard, task_id)


def _add_counter(tasks: dict[str, TaskStats], name: str, value: int) -> None:
    """Add one ``<kind>|<task>`` counter (records.COUNTER_KINDS) to its task's row."""
    kind, task = split_counter(name)
    row = tasks.setdefault(task, TaskStats(task=task))
    attr = COUNTER_KINDS.get(kind)
    if attr is not None:
        setattr(row, attr, getattr(row, attr) + value)
    elif kind.startswith("l") and kind[1:].isdigit() and int(kind[1:]) < len(row.lateness_buckets):
        row.lateness_buckets[int(kind[1:])] += value


def _chunks(items: list[tuple[str, str]], size: int) -> Iterable[list[tuple[str, str]]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


@dataclass(frozen=True)
class Held:
    """A ``debounce_exclusive`` window held behind a run of its key (the longest held
    are listed: ``HELD_LISTED`` per shard)."""

    ident: str
    since: float  # Redis time (s) it was first held
    waits_for: str | None  # the id of the window in progress (None: it just ended)
    state: str | None  # that window's state: dispatching, queued, claimed


@dataclass(frozen=True)
class Snapshot:
    """What one refresh reads from Redis. ``at`` is the Redis clock, in seconds."""

    at: float
    open: int
    due: int
    oldest_due_s: float | None  # how long the most overdue pending window has been due
    leased: int
    active: int
    quarantined: int
    tasks: dict[str, TaskStats]
    hot: dict[str, int]  # ident -> calls absorbed by its taken windows
    dispatchers: dict[str, float]  # name -> Redis time (s) of its last pass that took windows
    alive: dict[str, float] = field(default_factory=dict)  # name -> last heartbeat (s)
    stopped: dict[str, float] = field(default_factory=dict)  # name -> clean stop (s)
    held: int = 0  # debounce_exclusive windows held behind a run of their key
    held_windows: list[Held] = field(default_factory=list)  # the longest held, listed

    @property
    def total(self) -> TaskStats:
        total = TaskStats(task="*")
        for row in self.tasks.values():
            total.merge(row)
        return total


def read_snapshot(store: OperatorStore) -> Snapshot:
    """The store's gauges, at a cost that does not grow with the open windows: ``TIME``,
    then one :meth:`~celery_debounce.store.api.OperatorStore.snapshot` per shard (on Redis
    one pipeline of 13 commands: the sizes of the due, lease, active, quarantine and held
    sets, the front of the due set, the ``<tag>:stats`` counters, ``<tag>:hot``, the
    dispatchers and their heartbeats; on PostgreSQL one statement); only when windows are
    held, one more round trip reads the run each of the longest held waits for."""
    now_ms = store.time_ms("top")
    tasks: dict[str, TaskStats] = {}
    hot: dict[str, int] = {}
    dispatchers: dict[str, float] = {}
    alive: dict[str, float] = {}
    stopped: dict[str, float] = {}
    held: list[Held] = []
    n_open = n_due = leased = active = quarantined = n_held = 0
    oldest_due: float | None = None
    for shard in range(store.settings.shards):
        part = store.snapshot(shard, now_ms)
        n_open += part.open
        n_due += part.due
        leased += part.leased
        active += part.active
        quarantined += part.quarantined
        if part.first_due_ms is not None and part.first_due_ms <= now_ms:
            late = (now_ms - part.first_due_ms) / 1000
            oldest_due = late if oldest_due is None else max(oldest_due, late)
        for name, value in part.counters.items():
            _add_counter(tasks, name, value)
        for ident, calls in part.hot:
            hot[ident] = hot.get(ident, 0) + calls
        for name, ms in part.dispatchers:
            dispatchers[name] = max(dispatchers.get(name, 0.0), ms / 1000)
        for name, ms in part.alive:
            alive[name] = max(alive.get(name, 0.0), ms / 1000)
        for name, ms in part.stopped:
            stopped[name] = max(stopped.get(name, 0.0), ms / 1000)
        n_held += part.held
        for front in part.held_front:
            held.append(Held(front.ident, front.since_ms / 1000, front.waits_for, front.state))
    held.sort(key=lambda h: h.since)
    return Snapshot(
        now_ms / 1000,
        n_open,
        n_due,
        oldest_due,
        leased,
        active,
        quarantined,
        tasks,
        hot,
        dispatchers,
        alive,
        stopped,
        n_held,
        held[:HELD_LISTED],
    )
