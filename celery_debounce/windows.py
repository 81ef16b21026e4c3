"""Read-only view of windows for operators: the data behind ``celery debounce inspect``."""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from celery import Celery

from .backend import Backend, as_text, backend_for, translate_errors
from .keys import ident_prefix, split_ident

#: States in the order a window goes through them.
STATES = ("pending", "dispatching", "queued", "claimed", "quarantined")
_FIELDS = ("id", "i", "fs", "dl", "mw", "n", "st", "qe", "mc", "cb")
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
    #: a debounce_collect window: bytes of the body its run gets (``calls`` calls)
    collected_bytes: int | None = None

    @property
    def forced_by_max_wait(self) -> bool:
        return self.deadline >= self.max_wait_at

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["forced_by_max_wait"] = self.forced_by_max_wait
        return data



def _info(ident: str | None, state: str, shard: int, row: list[Any]) -> WindowInfo | None:
    tid, rec_ident, fs, dl, mw, n, st, qe, *rest = row
    mc = rest[0] if rest else None
    cb = rest[1] if len(rest) > 1 else None
    if tid is None:
        return None
    raw = ident if ident is not None else as_text(rec_ident or "")
    try:
        task, key = split_ident(raw)
    except ValueError:  # a garbled record (quarantined by the dispatcher): show it as is
        task, key = "?", raw
    return WindowInfo(
        task=task,
        key=key,
        task_id=as_text(tid),
        state=as_text(st) if st is not None else state,
        first_seen=_number(fs) / 1000,
        deadline=_number(dl) / 1000,
        max_wait_at=(_number(fs) + _number(mw)) / 1000,  # mw is the max wait, from first_seen
        calls=_number(n),
        shard=shard,
        error=as_text(qe) if qe is not None else None,
        max_calls=_number(mc) if mc is not None else None,
        collected_bytes=_number(cb) if cb is not None else None,
    )


def _number(value: Any) -> int:
    """A record's integer field; 0 when missing or garbled (an unreadable record)."""
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


def pending_info(backend: Backend, ident: str, shard: int) -> WindowInfo | None:
    """The pending window of ``ident``, or None: one HMGET and one ZSCORE (its deadline)."""
    tag = backend.settings.tag(shard)
    with translate_errors("inspect"), backend.client.pipeline(transaction=False) as pipe:
        pipe.hmget(f"{tag}:open:{ident}", *_FIELDS)
        pipe.zscore(f"{tag}:due", ident)
        row, deadline = pipe.execute()
    if deadline is None:
        return None
    row[3] = deadline  # a pending window's deadline is its due score
    return _info(ident, "pending", shard, row)


def iter_windows(
    app: Celery,
    *,
    states: Iterable[str] | None = None,
    task: str | None = None,
    key_glob: str | None = None,
) -> Iterator[WindowInfo]:
    """Yield windows, pending ones first, each group sorted by deadline per shard."""
    backend = backend_for(app)
    wanted = set(states) if states else set(STATES)
    for shard in range(backend.settings.shards):
        yield from _shard_windows(backend, shard, wanted, task, key_glob)


def _shard_windows(
    backend: Backend, shard: int, wanted: set[str], task: str | None, key_glob: str | None,
    limit: int | None = None,
) -> Iterator[WindowInfo]:
    tag = backend.settings.tag(shard)
    client = backend.client
    if "pending" in wanted:
        yield from walk_pending(backend, shard, task=task, key_glob=key_glob, limit=limit)
    for zset, states in (("leased", {"dispatching"}), ("active", {"queued", "claimed"}),
                         ("quarantine", {"quarantined"})):
        if not states & wanted:
            continue
        found = 0
        # Read the set a page at a time, in score order (lease expiry, hand-over time,
        # quarantine time), and stop once `limit` windows matched: a limited listing
        # does not read a large set whole.
        for start in itertools.count(0, _CHUNK):
            with translate_errors("inspect"):
                ids = [as_text(m) for m in client.zrange(f"{tag}:{zset}", start,
                                                         start + _CHUNK - 1)]
            with translate_errors("inspect"), client.pipeline(transaction=False) as pipe:
                for tid in ids:
                    pipe.hmget(f"{tag}:win:{tid}", *_FIELDS)
                rows = pipe.execute(raise_on_error=False) if ids else []
            for tid, row in zip(ids, rows, strict=True):
                if isinstance(row, Exception):  # not a hash: see take.lua's wrong-type rule
                    if "quarantined" in wanted and task is None and key_glob is None:
                        found += 1
                        yield WindowInfo("?", "", tid, "quarantined", 0, 0, 0, 0, shard,
                                         f"{tag}:win:{tid}: {row}")
                    continue
                info = _info(None, "", shard, row)
                if info is not None and info.state in wanted and _matches(info, task, key_glob):
                    found += 1
                    yield info
            if len(ids) < _CHUNK or (limit is not None and found >= limit):
                break


#: Members list.lua examines per call: the first call is small (a limited listing
#: usually stops there), later ones larger; each call blocks Redis for ~1 us a member.
_WALK_FIRST = 1000
_WALK_MAX = 20000


def walk_pending(
    backend: Backend,
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
    tag = backend.settings.tag(shard)
    prefix = ident_prefix(task) if task is not None else ""
    pattern = glob_to_lua(key_glob) if key_glob is not None else b""
    start, skip, budget, found = "-inf", 0, _WALK_FIRST, 0
    while limit is None or found < limit:
        want = budget if limit is None else limit - found
        reply = backend.run(
            "list", [f"{tag}:due"], [tag, start, skip, budget, want, prefix, pattern]
        )
        examined, last, at_last, done = reply[:4]
        for ident, tid, fs, dl, mw, n, *mc in reply[4:]:
            info = _info(as_text(ident), "pending", shard,
                         [tid, None, fs, dl, mw, n, None, None, *mc])
            if info is not None and _matches(info, task, key_glob):
                found += 1
                yield info
        if int(done) or int(examined) == 0:
            return
        start, skip = as_text(last), int(at_last)
        budget = min(budget * 4, _WALK_MAX)


_LUA_MAGIC = frozenset(b"^$()%.[]*+-?")
#: One UTF-8 encoded character in a Lua pattern: a byte that does not continue a
#: character, then any continuation bytes. Keys are valid UTF-8 (keys.resolve).
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
    backend = backend_for(app)
    wanted = set(states) if states else set(STATES)
    by_id: dict[str, WindowInfo] = {}
    for shard in range(backend.settings.shards):
        for info in _shard_windows(backend, shard, wanted, task, key_glob, limit):
            by_id[info.task_id] = info  # pending is read first: a later state wins
    found = sorted(by_id.values(), key=lambda w: w.deadline)
    return found if limit is None else found[:limit]
