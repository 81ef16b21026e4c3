"""``top``'s readings: the per-task census of open windows, and the last minute's
snapshots (:class:`History`) whose differences give rates and lateness (Redis keeps
only running totals)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..store.api import OperatorStore
from ..store.results import CensusRow
from .admin import Snapshot, TaskStats

#: How far back the per-minute figures (lateness, coalescing, forced) look.
MINUTE_S = 60.0
#: How far back calls/s and runs/s look (short enough to follow a burst).
RATE_S = 10.0


#: Pending windows one refresh's census step reads per shard (``census.lua``, a ZSCAN
#: COUNT hint): per-task open windows cost a bounded slice per refresh.
CENSUS_STEP = 1000


@dataclass
class Census:
    """Per-task open windows, counted a slice at a time: each refresh counts one census
    step per shard (about :data:`CENSUS_STEP` windows; the store reads one step ahead,
    so a pass's first refresh reads two); when every shard's pass is complete its counts
    are published. Up to ~1,000 windows per shard a pass takes one refresh; a million
    take ~1,000."""

    #: each shard's census under way (``OperatorStore.census``) and its next batch, read
    #: one step ahead so that a pass's last batch is known as the last when it is counted
    steps: dict[int, tuple[Iterator[list[CensusRow]], list[CensusRow]]] = field(
        default_factory=dict
    )
    partial: dict[str, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    open: dict[str, int] | None = None  # the last complete pass
    at: float | None = None  # when it completed (the store's clock, s)
    passes: int = 0

    def step(self, store: OperatorStore, now_ms: int) -> None:
        shards = store.settings.shards
        for shard in range(shards):
            if shard in self.done:
                continue
            if shard in self.steps:
                steps, rows = self.steps.pop(shard)
            else:
                steps = store.census(shard, now_ms, CENSUS_STEP)
                rows = next(steps, [])
            for row in rows:
                self.partial[row.task] = self.partial.get(row.task, 0) + row.open
            ahead = next(steps, None)  # free once the store read its last step
            if ahead is None:
                self.done.add(shard)
            else:
                self.steps[shard] = (steps, ahead)
        if len(self.done) >= shards:
            self.open, self.at, self.passes = self.partial, now_ms / 1000, self.passes + 1
            self.partial, self.done = {}, set()


@dataclass
class Rates:
    """Figures computed from two snapshots."""

    seconds: float
    calls: int
    runs: int
    forced: int
    cancelled: int
    lateness_buckets: list[int]
    calls_in: int = 0  # calls the gate accepted (i|<task>), counted as they came

    def per_s(self, value: int) -> float:
        return value / self.seconds if self.seconds > 0 else 0.0

    @property
    def ratio(self) -> float | None:
        return self.calls / self.runs if self.runs else None

    def lateness_ms(self, quantile: float) -> float | None:
        return TaskStats(task="", lateness_buckets=self.lateness_buckets).lateness_ms(quantile)


def _diff(new: TaskStats, old: TaskStats | None, seconds: float) -> Rates:
    """Counter differences; one shard's counters may expire or reset on their own, so
    a counter that went back counts as 0 rather than as a negative rate."""
    if old is None:
        old = TaskStats(task=new.task)

    def up(a: int, b: int) -> int:
        return max(0, a - b)

    return Rates(
        seconds,
        up(new.calls, old.calls),
        up(new.runs, old.runs),
        up(new.forced, old.forced),
        up(new.cancelled, old.cancelled),
        [up(a, b) for a, b in zip(new.lateness_buckets, old.lateness_buckets, strict=True)],
        up(new.calls_in, old.calls_in),
    )


@dataclass
class History:
    """The snapshots of the last minute; Redis keeps only running totals."""

    keep_s: float = MINUTE_S
    snapshots: deque[Snapshot] = field(default_factory=deque)

    def add(self, snap: Snapshot) -> None:
        if self.snapshots and self._went_back(self.snapshots[-1], snap):
            self.snapshots.clear()  # counters reset (stats --reset, or expired): start over
        self.snapshots.append(snap)
        while len(self.snapshots) > 2 and snap.at - self.snapshots[1].at >= self.keep_s:
            self.snapshots.popleft()

    @staticmethod
    def _went_back(old: Snapshot, new: Snapshot) -> bool:
        a, b = old.total, new.total
        return (
            b.runs < a.runs
            or b.calls < a.calls
            or b.calls_in < a.calls_in
            or sum(b.lateness_buckets) < sum(a.lateness_buckets)
        )

    def since(self, seconds: float) -> Snapshot | None:
        """The oldest kept snapshot at most ``seconds`` older than the newest."""
        if len(self.snapshots) < 2:
            return None
        newest = self.snapshots[-1]
        for snap in self.snapshots:
            if newest.at - snap.at <= seconds + 0.5:
                return snap if snap is not newest else None
        return None

    def rates(self, seconds: float, task: str | None = None) -> Rates | None:
        old = self.since(seconds)
        if old is None:
            return None
        new = self.snapshots[-1]
        span = new.at - old.at
        if task is None:
            return _diff(new.total, old.total, span)
        row = new.tasks.get(task)
        return None if row is None else _diff(row, old.tasks.get(task), span)
