"""The PostgreSQL store's operator reads (a base of ``PostgresStore``): windows listed
and found for ``celery debounce inspect``, ``cancel --id``/``--all`` and ``flush --all``,
and a collect window's calls so far.
Reads only, each one statement."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..idents import TakenGroup, ident_prefix, matches
from ..records import Record, open_by_id, with_hold
from ..results import OPEN_PAGE, TAKEN_PAGE, TakenEntry
from ..states import as_state
from .columns import record_fields, select_record
from .step import many, one

#: A record of ``debounce_taken`` as operators see it (records.INSPECT_FIELDS): by id,
#: and a page of one of keys.TAKEN_SETS (its states, in the order Redis keeps the set:
#: a lease's end, the hand-over, the quarantine).
_TAKEN_FROM = ", state, reason, is_leading, is_trailing FROM debounce_taken WHERE "
_TAKEN = select_record(_TAKEN_FROM + "task_id = %s")
_TAKEN_PAGE = {
    "leased": select_record(
        _TAKEN_FROM + "state = 'dispatching' ORDER BY until, task_id OFFSET %s LIMIT %s"
    ),
    "active": select_record(
        _TAKEN_FROM + "state IN ('queued', 'claimed', 'stale') ORDER BY taken_at, task_id "
        "OFFSET %s LIMIT %s"
    ),
    "quarantine": select_record(
        _TAKEN_FROM + "state = 'quarantined' ORDER BY taken_at, task_id OFFSET %s LIMIT %s"
    ),
}
#: Open windows in deadline order after a cursor (the deadline as the server writes it,
#: exact to the microsecond, and the ident), of an ident prefix.
_LIST = select_record(
    ", max_calls, is_trailing, collect_bytes, deadline::text FROM debounce_open "
    "WHERE left(ident, length(%s)) = %s AND (deadline, ident) > (%s::timestamptz, %s) "
    "ORDER BY deadline, ident LIMIT %s"
)
_FIND = "SELECT ident FROM debounce_open WHERE task_id = %s"
#: A collect window's calls so far, in call order (its list is its id).
_COLLECTED = "SELECT element FROM debounce_calls WHERE task_id = %s ORDER BY seq"
_QUIET = "SELECT task_id, debounce_ms(quiet_end) FROM debounce_quiet WHERE ident = ANY (%s)"
#: Before the first open window's deadline.
_FIRST_DEADLINE = "-infinity"


class PostgresInspect:
    """The operators' reads of :class:`~.store.PostgresStore` (one shard: 0)."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides

        def _check(self) -> None: ...

        def _read(self, fn: Any) -> Any: ...

        def held(self, shard: int) -> dict[str, tuple[int, str | None]]: ...

        def pending(self, shard: int, ident: str) -> Record | None: ...

    def taken(self, task_id: str) -> tuple[int, Record] | None:
        """``(0, record)`` of the window ``task_id`` once taken (any state), or None."""
        self._check()
        row = self._read(one(_TAKEN, (task_id,)))
        return None if row is None else (0, self._with_quiet_ends([_taken_record(row)])[0])

    def open_windows(
        self,
        shard: int,
        *,
        task: str | None = None,
        key_glob: str | None = None,
        task_id: str | None = None,
        limit: int | None = None,
        page: int = OPEN_PAGE,
    ) -> Iterator[Record]:
        """Open windows in deadline order, of ``task``'s idents (a prefix the index
        serves), ``page`` a statement after the last one read (its deadline, exact to
        the microsecond, and ident); the key glob is checked here; the held windows are
        read once, first. The one whose id is ``task_id`` by its unique index."""
        if task_id is not None:
            self._check()
            row = self._read(one(_FIND, (task_id,)))
            record = None if row is None else self.pending(shard, str(row[0]))
            yield from open_by_id(record, task_id, task, key_glob, limit, lambda: self.held(shard))
            return
        prefix = ident_prefix(task) if task is not None else ""
        deadline, after, found = _FIRST_DEADLINE, "", 0
        held = self.held(shard)
        while True:
            self._check()
            size = max(
                1, page if key_glob is not None or limit is None else min(page, limit - found)
            )
            rows = self._read(many(_LIST, (prefix, prefix, deadline, after, size)))
            for row in rows:
                record = _open_record(row)
                if matches(record.ident or "", task, key_glob):
                    found += 1
                    yield with_hold(record, held)
                    if limit is not None and found >= limit:
                        return
            if len(rows) < size:
                return
            deadline, after = rows[-1][-1], rows[-1][1]

    def taken_windows(
        self, shard: int, group: TakenGroup, page: int = TAKEN_PAGE
    ) -> Iterator[TakenEntry]:
        """The taken windows of one group in its order, ``page`` a statement."""
        query, size = _TAKEN_PAGE[group], max(1, page)
        for start in itertools.count(0, size):
            self._check()
            rows = self._read(many(query, (start, size)))
            records = self._with_quiet_ends([_taken_record(row) for row in rows])
            for row, record in zip(rows, records, strict=True):
                yield TakenEntry(row[0], record, None)
            if len(rows) < size:
                return

    def _with_quiet_ends(self, records: list[Record]) -> list[Record]:
        """``records``, each leading run's with the end (ms) of the quiet period it still
        owns (one more read, only when there is a leading run)."""
        runs = {r.task_id: r.ident for r in records if r.leading and r.ident is not None}
        if not runs:
            return records
        idents = sorted({ident for ident in runs.values() if ident is not None})
        rows = self._read(many(_QUIET, (idents,)))
        ends = {task_id: int(end) for task_id, end in rows if task_id in runs}
        return [r._replace(quiet_end_ms=ends.get(r.task_id)) if r.leading else r for r in records]

    def _collected(self, collect_list: str) -> tuple[bytes, ...]:
        """The elements a pending debounce_collect window gathered so far
        (``collect_list``: the window's id, as its records give it)."""
        rows = self._read(many(_COLLECTED, (collect_list,)))
        return tuple(bytes(element) for (element,) in rows)


def _open_record(row: Sequence[Any]) -> Record:
    task_id = row[0]
    max_calls, trailing, size, _ = row[6:]
    return Record(
        **record_fields(row),
        max_calls=max_calls,
        trailing=bool(trailing),
        collected_bytes=size,
        collect_list=None if size is None else task_id,
    )


def _taken_record(row: Sequence[Any]) -> Record:
    state, reason, leading, trailing = row[6:]
    return Record(
        **record_fields(row),
        state=as_state(state),
        error=reason,
        leading=bool(leading),
        trailing=bool(trailing),
    )
