"""One window steered by its (task, key): read it, flush it, cancel it.

What ``DebouncedTask.debounce_pending``, ``debounce_flush`` and ``debounce_cancel`` do,
and what :class:`~celery_debounce.ops.admin.DebounceAdmin` does for one window (its
``window``, ``flush`` and ``cancel`` by key or id come here), through the operators'
store role (:class:`~celery_debounce.store.api.OperatorStore`). :class:`WindowInfo` is
a window as operators see it (``celery debounce inspect``; re-exported by
:mod:`celery_debounce.ops.read_view`). The producer stage owns it so that the task's
own steering needs nothing of ``ops/``, which imports it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from celery import Celery, states

from ..aliases import parse_aliases, resolve_aliases
from ..errors import DebounceBackendError, WindowNotFound
from ..signals import window_cancelled
from ..store import Cancelled, CancelOutcomeUnknown
from ..store.api import OperatorStore
from ..store.idents import shard_of, split_ident, window_ident
from ..store.records import Record

logger = logging.getLogger("celery_debounce.admin")

__all__ = [
    "WindowInfo",
    "cancel",
    "cancel_one",
    "flush",
    "flush_window",
    "pending_info",
    "window",
    "window_info",
]

_REVOKE_REASON = "debounce window cancelled"
#: How long a cancel whose reply was lost is checked in the background (seconds; its
#: token's key lives 5 minutes).
_SETTLE_S = 60


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
    #: "leading": a leading run (published at its first call); "trailing": a window
    #: opened during the quiet period after a leading run (due at its end); None: neither
    edge: str | None = None
    #: the end of the quiet period this window belongs to (epoch seconds), while it
    #: runs: set on a leading run by listings and ``find``; None otherwise
    quiet_until: float | None = None
    #: a debounce_collect window: bytes of the body its run gets (``calls`` calls)
    collected_bytes: int | None = None
    #: a pending debounce_exclusive window held while a run of its key is in progress:
    #: since when (epoch seconds), and the id of the window it waits for
    held_since: float | None = None
    waits_for: str | None = None

    @property
    def forced_by_max_wait(self) -> bool:
        return self.deadline >= self.max_wait_at

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["forced_by_max_wait"] = self.forced_by_max_wait
        return data


def window_info(
    record: Record, shard: int, state: str, quiet_until_ms: int | None = None
) -> WindowInfo:
    """A decoded record (records.decode_record) as operators see it; ``state`` is used
    when the record holds none (a pending window); ``quiet_until_ms``: the end of the
    quiet period a leading run still owns (``Record.quiet_end_ms`` of ``OperatorStore.taken``)."""
    raw = record.ident or ""
    try:
        task, key = split_ident(raw)
    except ValueError:  # a garbled record (quarantined by the dispatcher): show it as is
        task, key = "?", raw
    return WindowInfo(
        task=task,
        key=key,
        task_id=record.task_id,
        state=record.state if record.state is not None else state,
        first_seen=record.first_seen_ms / 1000,
        deadline=record.deadline_ms / 1000,
        max_wait_at=record.ceiling_ms / 1000,
        calls=record.calls,
        shard=shard,
        error=record.error,
        max_calls=record.max_calls,
        edge="leading" if record.leading else "trailing" if record.trailing else None,
        quiet_until=quiet_until_ms / 1000 if quiet_until_ms is not None else None,
        collected_bytes=record.collected_bytes,
    )


def pending_info(store: OperatorStore, ident: str, shard: int) -> WindowInfo | None:
    """The pending window of ``ident``, or None: one HMGET and one ZSCORE (its deadline)."""
    record = store.pending(shard, ident)
    return None if record is None else window_info(record, shard, "pending")


def flush_window(
    store: OperatorStore, shard: int, ident: str, task_id: str = ""
) -> WindowInfo | None:
    """Close the pending window of ``ident`` (with ``task_id`` if given) and make it due
    now (:meth:`OperatorStore.flush`). Returns the window as flushed, or None."""
    for record in store.flush(shard, [(ident, task_id)]):
        return window_info(record, shard, "dispatching")
    return None


def window(store: OperatorStore, task: str, key: str) -> WindowInfo | None:
    """The pending window of (task, key), or None. One HMGET and one ZSCORE."""
    ident = window_ident(task, key)
    return pending_info(store, ident, shard_of(ident, store.settings.shards))


def flush(store: OperatorStore, task: str, key: str) -> WindowInfo:
    """Close the pending window of (task, key) to new calls and make it due now;
    dispatchers publish it at once. Returns the window as flushed (deadline now).
    The next call for the key opens a new window. Raises WindowNotFound."""
    ident = window_ident(task, key)
    info = flush_window(store, shard_of(ident, store.settings.shards), ident)
    if info is None:
        raise WindowNotFound(f"no pending window for task {task!r} key {key!r}")
    logger.info("debounce: flushed %s[%s] key=%r", task, info.task_id, key)
    return info


def cancel(app: Celery, store: OperatorStore, task: str, key: str) -> WindowInfo:
    """Drop the pending window of (task, key) so it never runs, and mark its
    result revoked (``.get()`` raises TaskRevokedError). Returns the window
    cancelled (read in the same script that drops it). Raises WindowNotFound."""
    ident = window_ident(task, key)
    info = cancel_one(app, store, ident, shard_of(ident, store.settings.shards), "")
    if info is None:
        raise WindowNotFound(f"no pending window for task {task!r} key {key!r}")
    return info


def cancel_one(
    app: Celery, store: OperatorStore, ident: str, shard: int, task_id: str
) -> WindowInfo | None:
    """Cancel the pending window of ``ident`` (with ``task_id`` if given): the window
    cancelled, or None. A lost reply raises ``CancelOutcomeUnknown``, and a thread
    settles it once the store answers."""
    try:
        cancelled = store.cancel(shard, ident, task_id)
    except CancelOutcomeUnknown as lost:
        # it may have dropped the window: once Redis answers, its token's key says
        # whether it did, and its result is revoked then (this process permitting)
        threading.Thread(
            target=_settle_cancel, args=(app, store, lost), daemon=True, name="debounce-cancel"
        ).start()
        raise
    if cancelled is None:
        return None
    return _revoke(app, cancelled, shard)


def _settle_cancel(app: Celery, store: OperatorStore, lost: CancelOutcomeUnknown) -> None:
    """Read, until Redis answers (at most :data:`_SETTLE_S`), whether a cancel whose
    reply was lost dropped its window; if it did, revoke its result and aliases."""
    delay, until = 0.25, time.monotonic() + _SETTLE_S
    while time.monotonic() < until:
        time.sleep(delay)
        try:
            cancelled = store.cancelled_by(lost)
        except DebounceBackendError:
            delay = min(delay * 2, 5.0)
            continue
        if cancelled is None:
            logger.warning("debounce: a cancel whose reply was lost did not run (%s)", lost.ident)
        else:
            _revoke(app, cancelled, lost.shard)
        return
    logger.warning(
        "debounce: a cancel whose reply was lost (%s) could not be checked "
        "in %d s: its window may be gone with its result not revoked",
        lost.ident,
        _SETTLE_S,
    )


def _revoke(app: Celery, cancelled: Cancelled, shard: int) -> WindowInfo:
    info = window_info(cancelled.record, shard, "cancelled")
    aliases = cancelled.aliases
    try:
        app.backend.mark_as_revoked(info.task_id, _REVOKE_REASON)
    except Exception as exc:  # no result backend, or it is down: the window is gone anyway
        logger.warning(
            "debounce: cancelled %s[%s] but could not mark its result revoked: %r",
            info.task,
            info.task_id,
            exc,
        )
    if aliases:  # ids callers fixed (task_id=, canvas): revoked too, never left waiting
        resolve_aliases(app, info.task_id, parse_aliases(aliases), states.REVOKED, None)
    logger.info(
        "debounce: cancelled %s[%s] key=%r calls=%d",
        info.task,
        info.task_id,
        info.key,
        info.calls,
    )
    if window_cancelled.receivers:
        window_cancelled.send(
            sender=info.task, task_id=info.task_id, key=info.key, calls=info.calls
        )
    return info
