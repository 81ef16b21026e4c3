"""The Redis store's operator reads that walk a shard's windows in bounded steps (a base
of :class:`~celery_debounce.store.redis.operators.Operators`): the open windows along the
due set (``list.lua``) or the one of an id (``find.lua``), a taken set a page at a
time and the per-task census (``census.lua``). Each script call examines a
bounded number of members, so no read blocks Redis for long, whatever the windows."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..idents import TakenGroup, ident_prefix, matches
from ..records import Record, as_text, open_by_id, with_hold
from ..results import CENSUS_PAGE, OPEN_PAGE, TAKEN_PAGE, CensusRow, ListStep, Shard, TakenEntry
from .fields import INSPECT_FIELDS, LIST_FIELDS, QUIET_END, QUIET_ID, decode_record
from .keys import due_key, quiet_key, taken_set_key, win_key
from .translate import translate_errors

#: The most members a ``list.lua`` step examines (each blocks Redis about 1 us).
WALK_MAX = 20000
#: Members a ``find.lua`` step scans.
FIND_STEP = 1000


class Listing:
    """The bounded walks of :class:`~.operators.Operators`."""

    client: Any
    run: Callable[[str, list[str], list[Any]], Any]

    if TYPE_CHECKING:  # pragma: no cover

        def tag(self, shard: Shard) -> str: ...

        def held(self, shard: Shard) -> dict[str, tuple[int, str | None]]: ...

        def pending(self, shard: int, ident: str) -> Record | None: ...

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
        """Pending windows of ``shard`` in deadline order, filtered inside Redis: ``list.lua``
        in bounded steps along the due set (``page`` members examined first, then four
        times more each step up to :data:`WALK_MAX`), stopping once ``limit`` matched;
        the one whose id is ``task_id`` by ``find.lua``."""
        if task_id is not None:
            ident = self._find(shard, task_id)
            record = None if ident is None else self.pending(shard, ident)
            yield from open_by_id(record, task_id, task, key_glob, limit, lambda: self.held(shard))
            return
        prefix = ident_prefix(task) if task is not None else ""
        pattern = glob_to_lua(key_glob) if key_glob is not None else b""
        start, skip, budget, found = "-inf", 0, max(1, page), 0
        held = self.held(shard)
        while limit is None or found < limit:
            want = budget if limit is None else limit - found
            step = self._list_step(shard, start, skip, budget, want, prefix, pattern)
            for record in step.windows:
                if matches(record.ident or "", task, key_glob):
                    found += 1
                    yield with_hold(record, held)
                    if limit is not None and found >= limit:
                        return
            if step.done or step.examined == 0:
                return
            start, skip = step.cursor, step.at_cursor
            budget = min(budget * 4, max(WALK_MAX, page))

    def _list_step(
        self, shard: int, start: str, skip: int, budget: int, want: int, prefix: str, pattern: bytes
    ) -> ListStep:
        """One ``list.lua`` step: pending windows along the due set, filtered in Redis."""
        tag = self.tag(shard)
        reply = self.run("list", [due_key(tag)], [tag, start, skip, budget, want, prefix, pattern])
        examined, last, at_last, done = reply[:4]
        windows = []
        for ident, *row in reply[4:]:
            record = decode_record(LIST_FIELDS, row, ident=as_text(ident))
            if record is not None:
                windows.append(record)
        return ListStep(int(examined), as_text(last), int(at_last), bool(int(done)), windows)

    def taken_windows(
        self, shard: int, group: TakenGroup, page: int = TAKEN_PAGE
    ) -> Iterator[TakenEntry]:
        """The members of a taken set in score order with their records, ``page`` at a
        time (one ZRANGE and one pipelined HMGET per page)."""
        for start in itertools.count(0, max(1, page)):
            entries = self._taken_page(shard, group, start, max(1, page))
            yield from entries
            if len(entries) < page:
                return

    def _taken_page(
        self, shard: int, group: TakenGroup, start: int, count: int
    ) -> list[TakenEntry]:
        tag = self.tag(shard)
        client = self.client
        with translate_errors("inspect"):
            ids = [
                as_text(m)
                for m in client.zrange(taken_set_key(tag, group), start, start + count - 1)
            ]
        if not ids:
            return []
        with translate_errors("inspect"), client.pipeline(transaction=False) as pipe:
            for tid in ids:
                pipe.hmget(win_key(tag, tid), *INSPECT_FIELDS)
            rows = pipe.execute(raise_on_error=False)
        out = []
        for tid, row in zip(ids, rows, strict=True):
            if isinstance(row, Exception):  # not a hash: see take.lua's wrong-type rule
                out.append(TakenEntry(tid, None, f"{win_key(tag, tid)}: {row}"))
            else:
                out.append(TakenEntry(tid, decode_record(INSPECT_FIELDS, row), None))
        read = iter(self._with_quiet_ends(shard, [e.record for e in out if e.record is not None]))
        return [e if e.record is None else e._replace(record=next(read)) for e in out]

    def _with_quiet_ends(self, shard: int, records: list[Record]) -> list[Record]:
        """``records``, each leading run's with the end (ms) of the quiet period it still
        owns (``quiet_key`` of its ident holds its id): one pipelined HMGET per run."""
        tag = self.tag(shard)
        runs = [r for r in records if r.leading and r.ident is not None]
        if not runs:
            return records
        with translate_errors("inspect"), self.client.pipeline(transaction=False) as pipe:
            for record in runs:
                pipe.hmget(quiet_key(tag, record.ident), QUIET_ID, QUIET_END)  # type: ignore[arg-type]
            rows = pipe.execute(raise_on_error=False)
        ends = {}
        for record, row in zip(runs, rows, strict=True):
            if (
                isinstance(row, list)
                and row[0] is not None
                and row[1] is not None
                and as_text(row[0]) == record.task_id
            ):
                ends[record.task_id] = int(row[1])
        return [r._replace(quiet_end_ms=ends.get(r.task_id)) if r.leading else r for r in records]

    def _find(self, shard: int, task_id: str) -> str | None:
        """The ident of the pending window ``task_id``: ``find.lua`` in bounded steps along
        the due set (:data:`FIND_STEP` members each), or None."""
        tag = self.tag(shard)
        cursor = "0"
        while True:
            cursor, ident = self.run("find", [due_key(tag)], [tag, cursor, FIND_STEP, task_id])
            if ident:
                return as_text(ident)
            if as_text(cursor) == "0":
                return None

    def census(self, shard: int, now_ms: int, page: int = CENSUS_PAGE) -> Iterator[list[CensusRow]]:
        """Per-task counts of pending windows: one ``census.lua`` step of ``page`` members a
        batch, until the due set's cursor comes back to 0."""
        tag = self.tag(shard)
        cursor = "0"
        while True:
            reply = self.run("census", [due_key(tag)], [tag, cursor, max(1, page), now_ms])
            yield [
                CensusRow(as_text(task), int(n_open), int(n_due), int(oldest), int(waiting))
                for task, n_open, n_due, oldest, waiting in reply[1:]
            ]
            cursor = as_text(reply[0])
            if cursor == "0":
                return


_LUA_MAGIC = frozenset(b"^$()%.[]*+-?")
#: One UTF-8 encoded character in a Lua pattern: a byte that does not continue a
#: character, then any continuation bytes. Keys are valid UTF-8 (key_templates.resolve).
_ONE_CHAR = b"[^\x80-\xbf][\x80-\xbf]*"


def glob_to_lua(glob: str) -> bytes:
    """An anchored Lua pattern matching at least what the fnmatch ``glob`` matches.

    Lua patterns work on bytes; the pattern is built on the glob's UTF-8 bytes and
    ``?`` matches one whole character (1 to 4 bytes), as fnmatch does on text. Exact
    for ``*``, ``?`` and literal text; a glob with ``[...]`` sets gives b"" (match
    all), and :meth:`Operators.open_windows` checks each window with fnmatch.
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
