"""The PostgreSQL store's counters and gauges (a base of ``PostgresStore``): what
``celery debounce stats``, ``top`` and the exporter read, and ``stats --reset``.

The counters are ``debounce_stats`` (steps/3.sql: bumped by ``debounce_take`` and
``debounce_cancel``); the gauges are counts over the window tables, read in one
statement. A held window (``debounce_exclusive``, waiting for its key's run) is open and
not due, as on Redis. The census reads the open windows in ident order, a bounded page a step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..reach import Reached
from ..records import HELD_LISTED, HOT_KEYS_KEPT
from ..results import (
    CENSUS_PAGE,
    CensusRow,
    HeldFront,
    ShardSnapshot,
)
from .step import many, one

if TYPE_CHECKING:  # pragma: no cover
    pass

_RESET = (
    "WITH gone AS (DELETE FROM debounce_stats RETURNING kind || '|' || task AS name, n, "
    "updated_at >= clock_timestamp() - debounce_history_ttl() AS live) "
    "SELECT name, sum(n) FROM gone WHERE live GROUP BY name"
)
#: One page of open windows after an ident, counted per task: the page's last ident,
#: then a row per task.
_CENSUS = (
    "WITH page AS (SELECT ident, deadline, first_seen, calls, held_since FROM debounce_open "
    "WHERE ident > %s ORDER BY ident LIMIT %s) "
    "SELECT (SELECT max(ident) FROM page), (SELECT count(*) FROM page), "
    "coalesce((SELECT json_agg(json_build_array(task, n, due, oldest, waiting)) FROM ("
    "SELECT debounce_task_of(ident) AS task, count(*) AS n, "
    "count(*) FILTER (WHERE deadline <= to_timestamp(%s / 1000.0) AND held_since IS NULL) "
    "AS due, "
    "debounce_ms(min(first_seen)) AS oldest, sum(calls) AS waiting FROM page "
    "GROUP BY 1) AS per_task WHERE task IS NOT NULL), '[]')"
)
_SNAPSHOT = (
    "SELECT (SELECT count(*) FROM debounce_open), "
    "(SELECT count(*) FROM debounce_open "
    "WHERE deadline <= to_timestamp(%s / 1000.0) AND held_since IS NULL), "
    "(SELECT debounce_ms(min(deadline)) FROM debounce_open WHERE held_since IS NULL), "
    "(SELECT count(*) FROM debounce_taken WHERE state = 'dispatching'), "
    "(SELECT count(*) FROM debounce_taken WHERE state IN ('queued', 'claimed', 'stale')), "
    "(SELECT count(*) FROM debounce_taken WHERE state = 'quarantined'), "
    "debounce_counters(), "
    "(SELECT coalesce(json_agg(json_build_array(ident, calls)), '[]') FROM ("
    "SELECT ident, calls FROM debounce_open WHERE calls > 1 ORDER BY calls DESC, ident "
    "LIMIT %s) AS hot), "
    "(SELECT coalesce(json_agg(json_build_array(name, debounce_ms(seen_at), alive) "
    "ORDER BY name), '[]') FROM debounce_dispatchers), "
    "(SELECT count(*) FROM debounce_open WHERE held_since IS NOT NULL), "
    "(SELECT coalesce(json_agg(json_build_array(ident, debounce_ms(held_since))), '[]') "
    "FROM (SELECT ident, held_since FROM debounce_open WHERE held_since IS NOT NULL "
    "ORDER BY held_since, ident LIMIT %s) AS held)"
)

#: The run each held window waits for (``task_id|state``), in the idents' order.
_WAITS_FOR = (
    "SELECT (SELECT t.task_id || '|' || t.state FROM debounce_taken t "
    "WHERE t.ident = i AND t.exclusive AND t.state IN ('dispatching', 'queued', 'claimed') "
    "LIMIT 1) FROM unnest(%s::text[]) WITH ORDINALITY AS u(i, n) ORDER BY n"
)


class PostgresStats:
    """The counters and gauges of :class:`~.store.PostgresStore` (one shard: 0)."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides

        def _check(self) -> None: ...

        def _read(self, fn: Any) -> Any: ...

        def _write(self, fn: Any, operation: str) -> Any: ...

    def census(self, shard: int, now_ms: int, page: int = CENSUS_PAGE) -> Iterator[list[CensusRow]]:
        """The open windows in ident order, ``page`` a statement, counted per task: a
        batch of rows per page, until a page comes back short."""
        after, limit = "", max(1, page)
        while True:
            self._check()
            last, read_count, per_task = self._read(one(_CENSUS, (after, limit, now_ms)))
            yield [
                CensusRow(str(task), int(n), int(due), int(oldest), int(waiting))
                for task, n, due, oldest, waiting in _json(per_task)
            ]
            if read_count < limit:
                return
            after = last

    def reset_counters(self, shard: int) -> dict[str, int]:
        """Zero the counters in one statement; those removed (every increment is in
        them or counted after the reset, never lost)."""
        self._check()
        rows = self._write(many(_RESET), "stats reset")
        return {name: int(n) for name, n in rows}

    def reach(self) -> Reached:
        """What reaching the database found, for ``check --connect`` (reach.py)."""
        from .reach_postgres import reach_postgres

        return reach_postgres(self)  # type: ignore[arg-type]

    def snapshot(self, shard: int, now_ms: int) -> ShardSnapshot:
        """The gauges in one statement (``top``, the exporter). ``hot``: the open
        windows with the most calls; ``dispatchers``: each one's last heartbeat."""
        self._check()
        args = (now_ms, HOT_KEYS_KEPT, HELD_LISTED)
        row = self._read(one(_SNAPSHOT, args))
        (open_, due, first, leased, active, quarantined, counters, hot, seen, held, front) = row
        beats = [(str(name), int(ms), bool(alive)) for name, ms, alive in _json(seen)]
        return ShardSnapshot(
            int(open_),
            int(due),
            None if first is None else int(first),
            int(leased),
            int(active),
            int(quarantined),
            _counters(counters),
            [(str(ident), int(calls)) for ident, calls in _json(hot)],
            [(name, ms) for name, ms, alive in beats if alive],
            [(name, ms) for name, ms, alive in beats if alive],
            [(name, ms) for name, ms, alive in beats if not alive],
            int(held),
            self._held_front([(str(ident), int(ms)) for ident, ms in _json(front)]),
        )

    def _held_front(self, front: list[tuple[str, int]]) -> list[HeldFront]:
        """The longest held with the run each waits for (one more read, only when
        windows are held): ``(None, None)`` where that run just ended."""
        if not front:
            return []
        rows = self._read(many(_WAITS_FOR, ([ident for ident, _ in front],)))
        held = []
        for (ident, since), (runner,) in zip(front, rows, strict=True):
            task_id, _, state = (runner or "").rpartition("|")
            held.append(
                HeldFront(ident, since, task_id, state) if runner else HeldFront(ident, since)
            )
        return held


def _json(value: Any) -> Any:
    """A JSON value as psycopg returns it (parsed), or its text."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def _counters(value: Any) -> dict[str, int]:
    return {str(name): int(n) for name, n in _json(value).items()}
