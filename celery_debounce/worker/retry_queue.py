"""Claims and finishes that failed during a Redis blip, kept and retried.

A worker marks a window ``claimed`` when its run starts and ``finished`` when it ends
(worker/receivers.py). If the windows' Redis is unreachable at that moment the mark is
handed here (:class:`ClaimMark`, :class:`FinishMark`: the operation with its
arguments, sent again through the store's ``WorkerStore`` methods): kept in memory
(per process, at most :data:`MAX_PENDING`, oldest dropped first with a warning) and
sent again, in order, by a short-lived daemon thread that starts only when something
is kept and exits once everything is sent. Replaying is safe: ``claim.lua`` changes
only a ``dispatching``/``queued`` record and ``finish.lua`` is idempotent, so a late
claim never reopens a finished window, and a mark whose reply was lost (it may have
run) is safe to send again: this replay is the one deliberate repeat of a script; each
send is still sent at most once (a kept claim by ``claim_late``, never waited for by
replicas; a finish by ``finish_run``). A mark Redis refuses (a script error, NOPERM)
is not retried: it would fail the same way again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from ..store import NotReplicated, is_outage
from ..store.api import WorkerStore
from ..store.domain import ClaimResult, FinishResult, ReplyLost, ShardRef, StoreUnavailable

logger = logging.getLogger("celery_debounce.worker")

#: Most marks kept per process; beyond it the oldest is dropped (its record then waits
#: for ``debounce_record_ttl``).
MAX_PENDING = 10_000
#: First and longest pause between retry rounds (seconds).
FIRST_DELAY = 0.25
MAX_DELAY = 5.0


class ClaimMark(NamedTuple):
    """A run's claim (its run went ahead): sent again by ``claim_late``."""

    shard: ShardRef
    task_id: str
    task_name: str
    retry: bool

    @property
    def name(self) -> str:
        return "claim"

    def send(self, store: WorkerStore) -> ClaimResult:
        return store.claim_late(self.shard, self.task_id, self.task_name, self.retry)


class FinishMark(NamedTuple):
    """A run's finish with its Celery state: sent again by ``finish_run``."""

    shard: ShardRef
    task_id: str
    state: str

    @property
    def name(self) -> str:
        return "finish"

    def send(self, store: WorkerStore) -> FinishResult:
        return store.finish_run(self.shard, self.task_id, self.state)


class Mark(NamedTuple):
    """A kept mark: where it goes, what it is, and what runs with its result."""

    store: WorkerStore
    mark: ClaimMark | FinishMark
    then: Callable[[Any], None] | None = None  # given the mark's result once it ran


_lock = threading.Lock()
_pending: deque[Mark] = deque()
_state: dict[str, Any] = {"pid": os.getpid(), "thread": None, "dropped": 0}


def _forked() -> None:  # a thread that held the lock at the fork is not in the child
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def worth_keeping(exc: BaseException) -> bool:
    """True for an outage (worth retrying), False for an error the store answered with.
    An outage is any store's typed one (unreachable, refused for now, a reply lost with
    its link) or a raw Redis link error. A mark too few replicas acknowledged
    (``debounce_redis_wait_replicas``) is retried."""
    return isinstance(exc, (StoreUnavailable, ReplyLost, NotReplicated)) or is_outage(exc)


def keep(
    store: WorkerStore,
    mark: ClaimMark | FinishMark,
    error: BaseException,
    then: Callable[[Any], None] | None = None,
) -> None:
    """Keep a mark that failed with ``error``; it is sent again once Redis answers,
    and ``then(result)`` runs with its result (a :class:`FinishResult` for a finish:
    e.g. to resolve aliases)."""
    if not worth_keeping(error):
        return
    # nothing under the lock yields: it is made at import, so under gevent patched later
    # (gunicorn --preload) it is a real lock, and a greenlet that yielded holding it would
    # leave the next one blocking the thread (every greenlet hangs). A patched
    # Thread.start yields, and so may a log handler: both come after the lock is released
    start, dropped = None, 0
    with _lock:
        if _state["pid"] != os.getpid():  # a forked child: the parent's thread is not here
            _pending.clear()
            _state.update(pid=os.getpid(), thread=None, dropped=0)
        if len(_pending) >= MAX_PENDING:
            _pending.popleft()
            _state["dropped"] += 1
            dropped = _state["dropped"]
        _pending.append(Mark(store, mark, then))
        thread = _state["thread"]
        # recorded but not started yet (no ident): another caller is starting it
        if thread is None or not (thread.ident is None or thread.is_alive()):
            start = threading.Thread(target=_retry, name="debounce-marks", daemon=True)
            _state["thread"] = start
    if dropped in (1, 10, 100) or (dropped and dropped % 1000 == 0):
        logger.warning(
            "debounce: %d failed window mark(s) dropped (more than %d kept)", dropped, MAX_PENDING
        )
    if start is not None:
        try:
            start.start()
        except BaseException:  # not started: the next mark kept starts one
            with _lock:
                if _state["thread"] is start:
                    _state["thread"] = None
            raise


def pending() -> int:
    """How many marks wait to be sent again (in this process)."""
    return len(_pending)


def _retry() -> None:
    delay = FIRST_DELAY
    stop = threading.Event()  # never set: a sleep that is not time.sleep-patched in tests
    while True:
        stop.wait(delay)
        with _lock:
            if not _pending:
                _state["thread"] = None
                return
        if flush():
            delay = FIRST_DELAY
        else:
            delay = min(delay * 2, MAX_DELAY)


def flush() -> bool:
    """Send kept marks in order until one fails; True if all were sent."""
    sent = 0
    while True:
        with _lock:
            if not _pending:
                break
            mark = _pending[0]
        try:
            result = mark.mark.send(mark.store)
        except Exception as exc:
            if worth_keeping(exc):
                return False  # still down: keep it (and the rest), try again later
            logger.warning("debounce: dropped a %s mark Redis refused: %s", mark.mark.name, exc)
        else:
            if mark.then is not None:
                try:
                    mark.then(result)
                except Exception:
                    logger.exception(
                        "debounce: handling the reply of a kept %s mark failed", mark.mark.name
                    )
        with _lock:
            if _pending and _pending[0] is mark:
                _pending.popleft()
        sent += 1
    if sent:
        logger.info("debounce: sent %d window mark(s) kept during a Redis outage", sent)
    return True
