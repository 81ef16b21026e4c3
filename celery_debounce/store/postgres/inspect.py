"""The PostgreSQL store's operator reads (a base of ``PostgresStore``): windows listed
and found for ``celery debounce inspect``, ``cancel --id``/``--all`` and ``flush --all``,
and a collect window's calls so far.
Reads only, each one statement; the flushes of ``flush_many`` are one call each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..records import Record
from ..results import ListStep, TakenEntry
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
_WAITS_FOR = (
    "SELECT (SELECT t.task_id || '|' || t.state FROM debounce_taken t "
    "WHERE t.ident = i AND t.exclusive AND t.state IN ('dispatching', 'queued', 'claimed') "
    "LIMIT 1) FROM unnest(%s::text[]) WITH ORDINALITY AS u(i, n) ORDER BY n"
)
#: The cursor of a listing's first step (read_view.walk_pending).
_FIRST = "-inf"
_FIRST_DEADLINE = "-infinity"
_SEP = "|"  # between a cursor's deadline and ident: never in a timestamp's text


class PostgresInspect:
    """The operators' reads of :class:`~.store.PostgresStore` (one shard: 0)."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides

        def _check(self) -> None: ...

        def _read(self, fn: Any) -> Any: ...

        def flush(self, shard: int, ident: str, task_id: str = "") -> Record | None: ...

    def taken(self, task_id: str) -> tuple[int, Record] | None:
        """``(0, record)`` of the window ``task_id`` once taken (any state), or None."""
        self._check()
        row = self._read(one(_TAKEN, (task_id,)))
        return None if row is None else (0, _taken_record(row))

    def list_step(
        self, shard: int, start: str, skip: int, budget: int, want: int, prefix: str, pattern: bytes
    ) -> ListStep:
        """Open windows whose ident starts with ``prefix``, in deadline order after the
        cursor ``start`` (``"-inf"``: from the first). ``pattern`` is not applied here
        (the caller filters by its glob), so with one, up to ``budget`` windows come
        back, else up to ``want``. ``skip`` is not needed: the cursor is exact."""
        self._check()
        deadline, _, after = (_FIRST_DEADLINE, "", "") if start == _FIRST else start.partition(_SEP)
        limit = max(1, budget if pattern else min(want, budget))
        args = (prefix, prefix, deadline, after, limit)
        rows = self._read(many(_LIST, args))
        windows = [_open_record(row) for row in rows]
        cursor = f"{rows[-1][-1]}{_SEP}{rows[-1][1]}" if rows else start  # deadline, ident
        return ListStep(len(rows), cursor, 0, len(rows) < limit, windows)

    def taken_page(self, shard: int, set_name: str, start: int, count: int) -> list[TakenEntry]:
        """Windows ``start .. start+count-1`` of one of keys.TAKEN_SETS, in its order."""
        self._check()
        query = _TAKEN_PAGE[set_name]
        rows = self._read(many(query, (start, count)))
        return [TakenEntry(row[0], _taken_record(row), None) for row in rows]

    def quiet_ends(self, shard: int, leading: Sequence[Record]) -> dict[str, int]:
        """Task id -> end (ms) of the quiet period each leading run still owns."""
        runs = {r.task_id: r.ident for r in leading if r.leading and r.ident is not None}
        if not runs:
            return {}
        self._check()
        idents = sorted({ident for ident in runs.values() if ident is not None})
        rows = self._read(many(_QUIET, (idents,)))
        return {task_id: int(end) for task_id, end in rows if task_id in runs}

    def find_step(
        self, shard: int, cursor: str, task_id: str, count: int
    ) -> tuple[str, str | None]:
        """``("0", ident of the open window with this id, or None)``: one lookup."""
        self._check()
        row = self._read(one(_FIND, (task_id,)))
        return "0", None if row is None else row[0]

    def waits_for(self, shard: int, idents: Sequence[str]) -> list[tuple[str | None, str | None]]:
        """For held idents: (id, state) of the run in progress each waits for, or
        ``(None, None)`` where it just ended."""
        if not idents:
            return []
        self._check()
        rows = self._read(many(_WAITS_FOR, (list(idents),)))
        found: list[tuple[str | None, str | None]] = []
        for (runner,) in rows:
            task_id, _, state = (runner or "").rpartition("|")
            found.append((task_id, state) if runner else (None, None))
        return found

    def collected(self, shard: int, collect_list: str) -> list[bytes]:
        """The elements a pending debounce_collect window gathered so far
        (``collect_list``: the window's id, as its records give it)."""
        self._check()
        rows = self._read(many(_COLLECTED, (collect_list,)))
        return [bytes(element) for (element,) in rows]

    def flush_many(self, shard: int, windows: Sequence[tuple[str, str]]) -> int:
        """:meth:`flush` of each ``(ident, task id)``, one call each; how many were."""
        return sum(self.flush(shard, ident, task_id) is not None for ident, task_id in windows)


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
