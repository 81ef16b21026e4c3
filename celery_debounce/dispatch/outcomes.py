"""What a dispatcher does with each window it took, once the broker has answered.

Every window of a take comes to one :class:`Outcome` (the publishers in
:mod:`celery_debounce.dispatch.publishers` sort them), and :data:`ACTIONS` says what that
outcome calls for: ack it, release it (after how long, counted against it or
not), quarantine it, or leave it leased. :class:`WindowActions` applies them to the
store in batch, in the order docs/design.md ("Dispatcher loop") gives: expiries,
ack, releases, then quarantines (after the ack, so a Redis error there cannot
release windows already sent).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from enum import Enum
from types import MappingProxyType
from typing import Any

from celery import Celery, states

from ..aliases import resolve_aliases
from ..errors import DebounceBackendError, DebounceOutcomeUnknown, WindowQuarantined
from ..signals import (
    leading_run,
    publish_failed,
    publish_refused,
    window_closed_by_cap,
    window_dispatched,
    window_forced_by_max_wait,
    window_held,
    window_quarantined,
)
from ..store import Shard, TakenWindow
from ..store.api import DispatcherStore
from ..store.domain import Released

__all__ = ["ACTIONS", "MAX_TRIES", "Action", "Outcome", "Outcomes", "WindowActions"]

logger = logging.getLogger("celery_debounce.dispatcher")

#: Publish attempts (the record's ``tries``) before a window whose message fails
#: is quarantined with the reason. Failures of the broker as a whole do not count.
MAX_TRIES = 5


class Outcome(Enum):
    """What one window's publish came to."""

    #: the broker has the message (on AMQP: confirmed it)
    SENT = "sent"
    #: not attempted or not sent: the broker as a whole failed (a shared fault, a
    #: channel the broker closed mid-batch, a batch refused from its first command on)
    UNSENT = "unsent"
    #: AMQP: the broker nacked the message (a queue at its length limit, ...)
    REFUSED = "refused"
    #: the message may be in the broker: a batch answered in part, no confirm
    UNCERTAIN = "uncertain"
    #: this message's fault (kombu or the broker refused it, unroutable)
    FAILED = "failed"
    #: refused with an error that may be the broker's or the message's (NOPERM,
    #: CLUSTERDOWN, TRYAGAIN): settled per take into FAILED or HELD (:meth:`Outcomes.settle`)
    SUSPECT = "suspect"
    #: a suspect of a take that published nothing: not counted, a back-off of its own
    HELD = "held"
    #: its record cannot be turned into a message
    BAD = "bad"
    #: not published: half its lease had passed since the take (slow broker)
    LATE = "late"


class Action(Enum):
    """What a window's outcome calls for (delays in ms; ``lease``: the dispatch lease)."""

    ACK = "ack: queued"
    RETRY = (
        "release after min(lease, 250 ms x 2^(fl + 1)), counted against it (fl + 1); "
        "quarantine at fl + 1 = MAX_TRIES"
    )
    SOON = (
        "release after min(lease, 1 s), or after the pass's back-off when a shared "
        "fault stopped it; not counted"
    )
    LEASE = "release after a full lease, so a worker claims a message that did arrive"
    BACK_OFF = "release after min(lease, 250 ms x 2^tries); not counted"
    QUARANTINE = "quarantine with the reason"
    KEEP = "nothing: it stays leased and whoever takes it next publishes it"


#: The rule, outcome -> action: its one owner (SUSPECT is settled first).
ACTIONS: Mapping[Outcome, Action] = MappingProxyType(
    {
        Outcome.SENT: Action.ACK,
        Outcome.UNSENT: Action.SOON,
        Outcome.REFUSED: Action.SOON,
        Outcome.UNCERTAIN: Action.LEASE,
        Outcome.FAILED: Action.RETRY,
        Outcome.HELD: Action.BACK_OFF,
        Outcome.BAD: Action.QUARANTINE,
        Outcome.LATE: Action.KEEP,
    }
)

#: ``publish_failed``'s ``kind`` per outcome (signals.py); REFUSED sends ``publish_refused``
FAILURE_KINDS: Mapping[Outcome, str] = MappingProxyType(
    {
        Outcome.FAILED: "message",
        Outcome.UNSENT: "broker",
        Outcome.UNCERTAIN: "uncertain",
        Outcome.HELD: "suspect",
    }
)


def release_after(action: Action, window: TakenWindow, lease: int, soon: int) -> int:
    """How long (ms) a window released by ``action`` stays leased."""
    if action is Action.SOON:
        return soon
    if action is Action.LEASE:
        return lease
    backoff: int
    if action is Action.RETRY:
        backoff = 250 * 2 ** min(window.failures + 1, 10)
        return min(lease, backoff)
    if action is Action.BACK_OFF:  # its own back-off, not counted
        backoff = 250 * 2 ** min(window.tries, 10)
        return min(lease, backoff)
    raise ValueError(f"{action} releases nothing")


class Outcomes:
    """Each window of one take with its outcome (and reason), in the order sorted.

    ``expiry``: task id -> ms until its message expires, for the windows published
    with one (recorded for those sent, before their ack).
    """

    def __init__(self) -> None:
        self._by: dict[Outcome, list[tuple[TakenWindow, str]]] = {}
        self.expiry: dict[str, int] = {}

    def add(self, window: TakenWindow, outcome: Outcome, reason: str = "") -> None:
        self._by.setdefault(outcome, []).append((window, reason))

    def add_all(self, windows: Iterable[TakenWindow], outcome: Outcome) -> None:
        for window in windows:
            self.add(window, outcome)

    def has(self, outcome: Outcome) -> bool:
        return bool(self._by.get(outcome))

    def reasons(self, outcome: Outcome) -> list[tuple[TakenWindow, str]]:
        return list(self._by.get(outcome, ()))

    def windows(self, outcome: Outcome) -> list[TakenWindow]:
        return [w for w, _ in self._by.get(outcome, ())]

    def settle(self) -> None:
        """Suspects become FAILED when the broker took another window of the take (the
        refusal is their own), else HELD (the broker's or theirs: not counted)."""
        suspects = self._by.pop(Outcome.SUSPECT, [])
        if suspects:
            sent = self.has(Outcome.SENT)
            if sent:  # the broker took another window of this pass: these are their own
                self._by.setdefault(Outcome.FAILED, []).extend(suspects)
            else:  # the broker's or theirs: not counted, retried with their own back-off
                self._by.setdefault(Outcome.HELD, []).extend(suspects)
                logger.warning(
                    "debounce: %d window(s) refused and no other published in this pass, "
                    "not counted against them (the broker's fault or theirs: %s); will retry",
                    len(suspects),
                    suspects[0][1],
                )


class WindowActions:
    """Applies a take's outcomes to the store: ack, release, quarantine (:data:`ACTIONS`)."""

    def __init__(self, app: Celery, store: DispatcherStore) -> None:
        self.app = app
        self.store = store
        self.settings = store.settings

    def apply(
        self, shard: Shard, windows: list[TakenWindow], outcomes: Outcomes, backoff_s: float | None
    ) -> int:
        """Act on each window's outcome; returns how many were sent.

        ``backoff_s``: the pass's back-off when a shared fault stopped it (SOON then
        waits that long, at most a lease), else None. Quarantines run after the ack.
        """
        outcomes.settle()
        sent = outcomes.windows(Outcome.SENT)
        failed = outcomes.reasons(Outcome.FAILED)
        bad = [(w, reason, "message") for w, reason in outcomes.reasons(Outcome.BAD)]
        try:
            self._track_expiry(shard, sent, outcomes.expiry)
            if sent:
                self.store.ack(shard, [w.task_id for w in sent])
                for window in sent:
                    _announce(window)
            # only failures shown to be the window's count (fl), never the takes a
            # broker outage wasted (tries counts those too)
            for window, reason in failed:
                if window.failures + 1 >= MAX_TRIES:
                    bad.append(
                        (
                            window,
                            f"publish failed {window.failures + 1} times, last: {reason}",
                            "publish_failed",
                        )
                    )
            retry = [w for w, _ in failed if w.failures + 1 < MAX_TRIES]
            self._release(shard, outcomes, retry, backoff_s)
            for window, reason, kind in bad:
                self.quarantine(window, reason, kind)
        finally:
            _count_forced(windows)  # after window_dispatched; also for windows not published
            if publish_failed.receivers or publish_refused.receivers:
                _count_failures(outcomes)
        return len(sent)

    def _release(
        self, shard: Shard, outcomes: Outcomes, retry: list[TakenWindow], backoff_s: float | None
    ) -> None:
        """Hand back every window an outcome releases (``retry``: the FAILED ones below
        MAX_TRIES), one ``release.lua`` call per delay.

        Each window goes with its ``tries`` as taken: a lease another dispatcher took
        over is not moved; ``failed`` also counts the failure against it (fl).
        """
        lease = self.settings.dispatch_lease_ms
        # after a shared fault: the pass's jittered back-off (so dispatchers do not all
        # come back at once), else soon
        soon = min(lease, math.ceil(backoff_s * 1000) if backoff_s is not None else 1000)
        by_delay: dict[int, list[Released]] = {}
        for outcome, action in ACTIONS.items():
            if action in (Action.ACK, Action.QUARANTINE, Action.KEEP):
                continue
            for window in retry if outcome is Outcome.FAILED else outcomes.windows(outcome):
                by_delay.setdefault(release_after(action, window, lease, soon), []).append(
                    Released(window.task_id, window.tries, action is Action.RETRY)
                )
        for delay, group in by_delay.items():
            try:
                self.store.release(shard, delay, group)
            except DebounceOutcomeUnknown as exc:  # released, or taken after the lease
                logger.warning(
                    "debounce: %d window(s) may not have been handed back "
                    "(taken again after their lease if not): %s",
                    len(group),
                    exc,
                )

    def _track_expiry(self, shard: Shard, sent: list[TakenWindow], expiry: dict[str, int]) -> None:
        """Record when the messages just sent expire (expiring.lua), before their ack."""
        tracked = [
            (w.task_id, expiry[w.task_id])
            for w in sent
            if w.task_id in expiry and expiry[w.task_id] < self.settings.record_ttl_ms
        ]
        if not tracked:  # (an expiry past the record's TTL: the record goes first)
            return
        try:
            self.store.expiring(shard, tracked)
        except DebounceBackendError as exc:
            logger.warning(
                "debounce: could not record when %d message(s) expire (their "
                "windows stay queued if the broker drops them unseen): %s",
                len(tracked),
                exc,
            )

    def quarantine(self, window: TakenWindow, reason: str, kind: str = "message") -> None:
        logger.error(
            "debounce: quarantined %s[%s] key=%r: cannot publish its message: %s",
            window.task_name,
            window.task_id,
            window.key,
            reason,
        )
        try:
            self.quarantine_id(window.shard, window.task_id, reason)
        except DebounceBackendError as exc:  # stays leased: taken again after the lease
            logger.warning("debounce: could not quarantine %s: %s", window.task_id, exc)
            return
        if window_quarantined.receivers:
            window_quarantined.send(
                sender=window.task_name,
                task_id=window.task_id,
                key=window.key,
                kind=kind,
                reason=reason,
            )

    def quarantine_id(self, shard: Shard, task_id: str, reason: str) -> None:
        """Set the record aside, then fail the window's id and every id that joined
        it, so no caller waits forever on a window that will not run."""
        aliases = self.store.quarantine(shard, task_id, reason)
        if aliases is None:
            return
        exc = WindowQuarantined(f"debounce window {task_id} was quarantined: {reason}")
        try:
            self.app.backend.mark_as_failure(task_id, exc)
        except Exception as error:  # no result backend, or it is down: logged, as cancel does
            logger.warning(
                "debounce: quarantined %s but could not store its failure: %r", task_id, error
            )
        resolve_aliases(self.app, task_id, aliases, states.FAILURE, exc)


def _announce(window: TakenWindow) -> None:
    """Log a published window; send ``window_dispatched``."""
    log = logger.warning if window.tries > 1 else logger.info
    log(
        "debounce: dispatched %s[%s] key=%r calls=%d late=%dms%s",
        window.task_name,
        window.task_id,
        window.key,
        window.calls,
        window.lateness_ms,
        f" (attempt {window.tries}: an earlier publish was not confirmed)"
        if window.tries > 1
        else "",
    )
    if window_dispatched.receivers:
        window_dispatched.send(sender=window.task_name, **_fields(window))


def _fields(window: TakenWindow) -> dict[str, Any]:
    return {
        "task_id": window.task_id,
        "key": window.key,
        "calls": window.calls,
        "lateness": window.lateness_ms / 1000,
    }


def _count_forced(windows: list[TakenWindow]) -> None:
    """``window_forced_by_max_wait`` (and ``window_closed_by_cap``) once per window,
    when it is first taken.

    Counted where ``take.lua`` counts ``f|<task>`` (``m|<task>``) in the stats (the
    first take, ``tries == 1``), whether or not that publish succeeds, so the signal
    and ``celery debounce stats`` agree.
    """
    if window_closed_by_cap.receivers:
        for window in windows:
            if window.tries == 1 and window.capped:
                window_closed_by_cap.send(sender=window.task_name, **_fields(window))
    if window_held.receivers:  # h|<task>, hm|<task> in the stats
        for window in windows:
            if window.held_ms:
                window_held.send(
                    sender=window.task_name, **_fields(window), held=window.held_ms / 1000
                )
    if leading_run.receivers:  # e|<task> in the stats
        for window in windows:
            if window.tries == 1 and window.leading:
                leading_run.send(sender=window.task_name, **_fields(window))
    if not window_forced_by_max_wait.receivers:
        return
    for window in windows:
        if window.tries == 1 and window.forced_by_max_wait:
            window_forced_by_max_wait.send(
                sender=window.task_name,
                max_wait_at=window.ceiling_ms / 1000,
                **_fields(window),
            )


def _count_failures(outcomes: Outcomes) -> None:
    """``publish_failed`` per window a take could not publish (by kind, see signals.py)
    and ``publish_refused`` per nacked message; only called when someone listens."""
    for outcome, kind in FAILURE_KINDS.items():
        for window, reason in outcomes.reasons(outcome):
            publish_failed.send(
                sender=window.task_name,
                task_id=window.task_id,
                key=window.key,
                kind=kind,
                reason=reason if outcome is Outcome.FAILED else "",
            )
    for window in outcomes.windows(Outcome.REFUSED):
        publish_refused.send(sender=window.task_name, task_id=window.task_id, key=window.key)
