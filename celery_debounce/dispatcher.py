"""The dispatcher: take due windows from Redis and publish them as Celery messages.

A window's record holds the Celery protocol-2 body as the producer serialized it
(see :mod:`celery_debounce.message`). The dispatcher publishes those bytes as they
are, with headers it builds; it never deserializes a payload.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from json import loads as _json_loads
from typing import Any

from celery import Celery, states
from kombu.exceptions import InconsistencyError

from .aliases import parse_aliases, resolve_aliases
from .confirms import ConfirmingPublisher, uses_confirms
from .errors import DebounceBackendError, DebounceConfigError, WindowQuarantined
from .layout import (
    DEFAULT_CONTENT_TYPE,
    SHARD_HEADER,
    layout_name,
    layout_tags,
)
from .message import WindowMessage
from .sentinel import redact
from .signals import (
    leading_run,
    publish_failed,
    publish_refused,
    window_closed_by_cap,
    window_dispatched,
    window_forced_by_max_wait,
    window_held,
    window_quarantined,
)
from .store import (
    CONNECTION_ERRORS,
    REDIS_ERROR,
    Shard,
    TakenWindow,
    TakeResult,
    WakeListener,
    WindowStore,
    is_error_reply,
    pipeline_failed_at,
    reply_code,
    store_for,
)

__all__ = ["MAX_TRIES", "SHARD_HEADER", "Dispatcher", "TakeResult", "TakenWindow"]

logger = logging.getLogger("celery_debounce.dispatcher")

#: Publish attempts (the record's ``tries``) before a window whose message fails
#: is quarantined with the reason. Failures of the broker as a whole do not count.
MAX_TRIES = 5

#: How often (at most) a dispatcher writes and reads the shard layouts (layouts.lua);
#: also at most a quarter of debounce_history_ttl, how long a layout is remembered.
LAYOUTS_EVERY_S = 10.0
#: How often a running dispatcher writes its heartbeat (alive.lua); ``ping`` and ``top``
#: call one silent after three of these.
HEARTBEAT_S = 5.0

#: Each dispatcher looks for windows whose message expired unseen at most this often
#: per shard (one expire.lua call).
EXPIRE_EVERY_S = 1.0

#: Redis error codes that describe the broker, never one message: the next unrelated
#: message would get the same answer (a shared fault is an outage: docs/design.md,
#: "Dispatcher loop"). Never counted against a window.
BROKER_WIDE_CODES = frozenset({
    "OOM",  # maxmemory with noeviction (a backlog filled the broker)
    "READONLY",  # a replica: the broker's own failover demoted this node
    "MISCONF",  # stop-writes-on-bgsave-error: its last save failed
    "LOADING",  # loading its dataset after a restart
    "NOAUTH", "WRONGPASS",  # the connection is not authenticated
    "MASTERDOWN",  # a replica whose link to its master is down
    "NOREPLICAS",  # min-replicas-to-write not met
    "BUSY",  # a script or function runs too long
})
#: Codes that may depend on the message's key (an ACL key pattern, a cluster slot): a
#: shared fault unless shown to be this message's, i.e. another window of the same
#: pass was published.
KEY_DEPENDENT_CODES = frozenset({"NOPERM", "CLUSTERDOWN", "TRYAGAIN"})
#: back-off after a shared fault (s): first wait, cap; each wait is jittered (x0.5-1)
BROKER_BACKOFF_S = (0.5, 10.0)

#: A shard's Redis clock that moved this many ms more, or less, between two takes than
#: this process's monotonic clock did is logged as a clock step (docs/guarantees.md,
#: "A Redis clock step"): far above any drift or slew (NTP slews at most 0.5 ms a second)
CLOCK_STEP_MS = 1000

#: A shared fault (the broker as a whole) and a key-dependent one (see above).
BROKER, KEY = "broker", "key"



def _announce(window: TakenWindow) -> None:
    """Log a published window; send ``window_dispatched``."""
    log = logger.warning if window.tries > 1 else logger.info
    log(
        "debounce: dispatched %s[%s] key=%r calls=%d late=%dms%s",
        window.task_name, window.task_id, window.key, window.calls, window.lateness_ms,
        f" (attempt {window.tries}: an earlier publish was not confirmed)"
        if window.tries > 1 else "",
    )
    if window_dispatched.receivers:
        window_dispatched.send(sender=window.task_name, **_fields(window))


def _fields(window: TakenWindow) -> dict[str, Any]:
    return {"task_id": window.task_id, "key": window.key, "calls": window.calls,
            "lateness": window.lateness_ms / 1000}


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
                window_held.send(sender=window.task_name, **_fields(window),
                                 held=window.held_ms / 1000)
    if leading_run.receivers:  # e|<task> in the stats
        for window in windows:
            if window.tries == 1 and window.leading:
                leading_run.send(sender=window.task_name, **_fields(window))
    if not window_forced_by_max_wait.receivers:
        return
    for window in windows:
        if window.tries == 1 and window.forced_by_max_wait:
            window_forced_by_max_wait.send(
                sender=window.task_name, max_wait_at=window.ceiling_ms / 1000,
                **_fields(window),
            )


def _count_failures(
    failed: list[tuple[TakenWindow, str]], unsent: list[TakenWindow],
    uncertain: list[TakenWindow], held: list[TakenWindow], refused: list[TakenWindow],
) -> None:
    """``publish_failed`` per window a pass could not publish (by kind, see signals.py)
    and ``publish_refused`` per nacked message; only called when someone listens."""
    for window, reason in failed:
        publish_failed.send(sender=window.task_name, task_id=window.task_id, key=window.key,
                            kind="message", reason=reason)
    for kind, group in (("broker", unsent), ("uncertain", uncertain), ("suspect", held)):
        for window in group:
            publish_failed.send(sender=window.task_name, task_id=window.task_id,
                                key=window.key, kind=kind, reason="")
    for window in refused:
        publish_refused.send(sender=window.task_name, task_id=window.task_id, key=window.key)


def _batch(producer: Any, size: int) -> Any:
    """kombu's ``producer.batch`` sized so it flushes once, or a no-op where unsupported."""
    batch = getattr(producer, "batch", None)
    if batch is None or not producer.supports_batch_publish:
        return nullcontext()
    return batch(max_size=4 * size + 16)


class _ExactBatch:
    """Every command's reply of kombu's Redis publish batch (kombu >= 5.7), read by the
    dispatcher instead of kombu's flush, which raises the first error only: the pipeline
    is not a transaction, so when one command fails the others ran, and only the replies
    say which messages the broker took (docs/design.md, "Dispatcher loop").

    Relies on kombu's batch internals (the active batch's session and its redis-py
    pipeline); when they are not there, or kombu flushed part of the batch on its own,
    :meth:`flush` returns None and kombu flushes as before (then a failed batch is
    uncertain as a whole).
    """

    def __init__(self, producer: Any) -> None:
        self.producer = producer
        self.spans: list[tuple[TakenWindow, int, int]] = []  # window, first command, end
        self.usable = True

    def _session(self) -> Any:
        state = getattr(getattr(self.producer, "_batch_local", None), "current", None)
        return getattr(state, "session", None) if state is not None else None

    def position(self) -> int:
        """Commands buffered so far (-1: unknown)."""
        session = self._session()
        if session is None:
            return 0  # kombu opens the session at the first publish
        stack = getattr(getattr(session, "pipeline", None), "command_stack", None)
        return len(stack) if isinstance(stack, list) else -1

    def record(self, window: TakenWindow, start: int) -> None:
        """``window`` was published: its commands are those from ``start`` on."""
        end = self.position()
        if start < 0 or end <= start:  # unknown, or kombu flushed on its own meanwhile
            self.usable = False
            return
        self.spans.append((window, start, end))

    def flush(self) -> list[Any] | None:
        """Run the buffered commands; one reply (or error) per command, or None."""
        session = self._session()
        if not (self.usable and self.spans and session is not None
                and isinstance(getattr(session, "_buffered", None), int)
                and self.spans[-1][2] == self.position()):
            return None
        replies = list(session.pipeline.execute(raise_on_error=False))
        session._buffered = 0  # kombu's own flush finds nothing left to send
        return replies


def check_json_body(body: bytes) -> tuple[list[Any], dict[str, Any]]:
    """Refuse a JSON body that is not ``[list, object, object]``; its ``(args, kwargs)``
    (what the run's ``argsrepr``/``kwargsrepr`` show, message.py).

    Celery's worker stops ("Unrecoverable error") on a body of another shape,
    such as a 0.1 record's ``[args, kwargs]``. Parsing JSON runs no code; bodies of
    other content types are never parsed here (see docs/guarantees.md).
    """
    try:
        parsed = _json_loads(body)
    except ValueError as exc:
        raise ValueError(f"body is not JSON: {exc}") from None
    if not (
        isinstance(parsed, list) and len(parsed) == 3 and isinstance(parsed[0], list)
        and isinstance(parsed[1], dict) and isinstance(parsed[2], dict)
    ):
        raise ValueError(
            "body is not a Celery protocol-2 body [args, kwargs, embed] (a record "
            "written by celery_debounce 0.1, or by something else)"
        )
    return parsed[0], parsed[1]


def _channel_closed(exc: BaseException | None) -> bool:
    """True when the broker closed the channel over a message (an AMQP channel error)."""
    from amqp.exceptions import ChannelError

    return isinstance(exc, ChannelError)


class UnreadableWindow(Exception):
    """A window record that cannot be turned into a message."""


class BrokerUnavailable(Exception):
    """The broker as a whole failed (not one message): nothing after it is sent."""


class MaybeShared(Exception):
    """An error that may be the broker's or this message's (NOPERM, CLUSTERDOWN,
    TRYAGAIN): counted against the window only if another window of the pass was
    published."""


class Dispatcher:
    """Publishes due windows. Any number may run at once; each window is taken once.

    ``run()`` loops until ``stop()``; ``dispatch_once()`` does a single pass
    (used by tests and by the beat scheduler).
    """

    def __init__(self, app: Celery, name: str = "dispatcher") -> None:
        self.app = app
        self.name = name
        self.store = store_for(app)
        self.settings = self.store.settings
        self.messages = WindowMessage(app)
        try:
            self._send_message = app.amqp.send_task_message
        except ValueError:  # kombu cannot read the broker URL; its error quotes a part of it
            raise DebounceConfigError(redact(
                f"broker_url {app.conf.broker_url!r} cannot be read (a password holding "
                "';', '/', '@' or ':' must be percent-encoded)")) from None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake: WakeListener | None = None
        #: legacy shards (settings.legacy_shards) not yet seen empty by this dispatcher
        self._draining: list[int] = list(self.settings.legacy_shards)
        #: an AMQP broker: publish on a confirming connection of our own (confirms.py)
        self._confirms: ConfirmingPublisher | None = (
            ConfirmingPublisher(app) if uses_confirms(app) else None
        )
        #: task id -> ms until its message expires, for the windows published with one
        self._expiry: dict[str, int] = {}
        #: shard -> when (monotonic) this dispatcher last finished its expired windows
        self._expired_at: dict[Shard, float] = {}
        #: shard -> (Redis ms, monotonic before, after) of its last take (_watch_clock)
        self._clock: dict[Shard, tuple[int, float, float]] = {}
        #: shard -> (ms its Redis clock stepped forward, monotonic time until which the
        #: claims written before the step may not lapse by it): see _lapse_upto
        self._claims_moved: dict[Shard, tuple[int, float]] = {}
        #: shard layouts (a changed debounce_shards): this dispatcher's, and the tags of
        #: the others it drains (tag -> the layouts naming it); see _refresh_layouts
        settings = self.settings
        self._layout = layout_name(settings.shards, settings.redis_cluster)
        self._own_tags = frozenset(
            self.store.tag(s) for s in (*range(settings.shards), *settings.legacy_shards))
        self._foreign: dict[str, set[str]] = {}
        self._foreign_busy: set[str] = set()  # foreign tags holding windows lately
        self._took = False  # own shards took windows since the layouts were last written
        self._beat_at = -math.inf  # when the last heartbeat was written (monotonic)
        self._layouts_at = self._layouts_written_at = -math.inf
        self._layouts_every = min(LAYOUTS_EVERY_S, settings.history_ttl_ms / 4000)
        #: the shared fault (the broker as a whole) that stopped this pass, if any
        self.broker_fault: str | None = None
        #: passes in a row stopped by a shared fault; sets the back-off
        self._fault_streak = 0
        #: this pass's back-off (s, jittered): windows not sent wait this long (at most a
        #: lease), and run() waits as long before the next pass
        self._fault_delay = 0.0

    # -- one pass -----------------------------------------------------------
    def dispatch_once(self) -> tuple[int, int]:
        """Publish every due window once. Returns (windows published, ms until next due).

        A full batch is followed by another take at once. The time until the next
        deadline is counted from each take, so publishing a batch does not push the
        next wake-up past a deadline that came due meanwhile. A shared fault (the
        broker as a whole, :attr:`broker_fault`) stops the pass at once, every shard
        included, and the time returned is the pass's back-off instead.
        """
        self.store.check_server()  # read at start; again here if Redis was down then
        published = 0
        self.broker_fault = None
        next_at = time.monotonic() + self.settings.poll_interval_ms / 1000
        shards: tuple[Shard, ...] = (*range(self.settings.shards), *self._draining,
                                     *self._foreign)
        for shard in shards:
            if self.broker_fault is not None:  # shared by every shard: stop the pass
                break
            while True:
                took_at = time.monotonic()
                taken = self.store.take(shard, self.settings.dispatch_batch, self.name,
                                        self._lapse_upto(shard, took_at))
                step = self._watch_clock(shard, taken.now_ms, took_at, time.monotonic())
                if step > 0:  # the claims of runs still going: renewed within a lease
                    moved = self._claims_moved.get(shard, (0, 0.0))[0] + step
                    self._claims_moved[shard] = (
                        moved, time.monotonic() + self.settings.claim_lease_ms / 1000)
                empty = taken.next_in_ms < 0 and not (
                    taken.windows or taken.skipped or taken.unreadable)
                if isinstance(shard, str):  # another layout's: kept while it holds windows
                    if not empty:
                        self._foreign_busy.add(shard)
                elif shard >= self.settings.shards:
                    if empty:
                        self._draining.remove(shard)  # a legacy shard left empty: done
                elif taken.windows:
                    self._took = True
                self._set_aside(shard, taken)
                if taken.next_in_ms >= 0:  # Redis read its clock about mid-way
                    mid = (took_at + time.monotonic()) / 2
                    next_at = min(next_at, mid + taken.next_in_ms / 1000)
                published += self._publish(shard, taken.windows, took_at)
                got = len(taken.windows) + len(taken.skipped) + len(taken.unreadable)
                if (got < self.settings.dispatch_batch or self._stop.is_set()
                        or self.broker_fault is not None):
                    break
            self._finish_expired(shard)
        if (self._took or self._foreign_busy) and (
                time.monotonic() - self._layouts_written_at >= self._layouts_every):
            self._layouts_at = -math.inf  # written now, not at the next read
        self._refresh_layouts()  # after the takes: the next pass drains what it finds
        if self.broker_fault is None:
            self._fault_streak = 0
            return published, max(0, math.ceil((next_at - time.monotonic()) * 1000))
        return published, math.ceil(self._fault_delay * 1000)

    def _lapse_upto(self, shard: Shard, at: float) -> int | None:
        """The latest claim expiry (Redis ms) the take about to be sent at ``at`` may let
        lapse: what the shard's Redis clock can read by then had it not stepped (its
        last take plus the time since, plus :data:`CLOCK_STEP_MS`), less a step forward
        seen within the last claim lease. A step forward moves every claim's expiry
        into the past; without this the take that first sees it, and the next ones until
        each worker renews (every third of a lease), would release the claims of runs
        still going (their duplicate deliveries then run again, a held exclusive window
        starts beside them). A claim whose worker died lapses when its lease really
        passes. None before this dispatcher's first take of the shard: up to now."""
        last = self._clock.get(shard)
        if last is None:
            return None
        moved, until = self._claims_moved.get(shard, (0, 0.0))
        if moved and at >= until:
            del self._claims_moved[shard]
            moved = 0
        return math.floor(last[0] + (at - last[1]) * 1000 + CLOCK_STEP_MS - moved)

    def _watch_clock(self, shard: Shard, now_ms: int, before: float, after: float) -> int:
        """Compare the Redis time a take read with the shard's last take, against this
        process's monotonic clock (``before``/``after``: around the take). A Redis clock
        step (set by hand, NTP stepping a large offset, a failover to a node whose clock
        differs) moves every stored deadline against real time: logged at WARNING with
        what it does. Returns the step in ms (negative: back), 0 when none was seen."""
        last = self._clock.get(shard)
        self._clock[shard] = (now_ms, before, after)
        if last is None:
            return 0
        moved = now_ms - last[0]
        least = (before - last[2]) * 1000  # real time between the two takes, at least
        most = (after - last[1]) * 1000  # and at most
        if moved < least - CLOCK_STEP_MS:
            step = math.floor(moved - least)
            logger.warning(
                "debounce: the clock of the windows' Redis (shard %s) went back by about "
                "%.1f s against this dispatcher's clock (a clock step, or a failover to a "
                "node whose clock is behind): every window deadline, max wait, quiet "
                "period, lease and claim lease written before it ends that much later in "
                "real time; nothing is lost or run twice (docs/guarantees.md)",
                shard, -step / 1000)
            return step
        if moved > most + CLOCK_STEP_MS:
            step = math.ceil(moved - most)
            logger.warning(
                "debounce: the clock of the windows' Redis (shard %s) went forward by about "
                "%.1f s against this dispatcher's clock (a clock step, a failover to a node "
                "whose clock is ahead, or this host was suspended): windows, max waits and "
                "quiet periods written before it end that much earlier, leases and claim "
                "leases may lapse at once (docs/guarantees.md)", shard, step / 1000)
            return step
        return 0

    def _shared_fault(self, exc: BaseException | str) -> None:
        """Note a fault of the broker as a whole: the pass stops, nothing is counted
        against a window, and the next pass waits a jittered, growing back-off."""
        if self.broker_fault is None:
            self._fault_streak += 1
            first, cap = BROKER_BACKOFF_S
            base = min(cap, first * 2 ** min(self._fault_streak - 1, 16))
            self._fault_delay = base * random.uniform(0.5, 1.0)  # jitter
            self.broker_fault = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"

    def _publish(self, shard: Shard, windows: list[TakenWindow], took_at: float) -> int:
        """Publish one take's windows; ack those sent, release or quarantine the others.

        A window that fails on its own (its message cannot be built, the broker
        refuses that message) does not fail the others: it is released with a
        back-off that grows with its ``tries`` and quarantined at ``MAX_TRIES``.
        Windows taken again (``tries > 1``) are published one by one, outside the
        batch, so a message that fails the batched pipeline is singled out on
        its next attempt. A failure of the broker as a whole (the batched pipeline,
        a lost connection) releases every window not confirmed, without counting
        against them. Quarantines run after the ack, so a Redis error there cannot
        release windows already sent. On an AMQP broker "sent" means confirmed by
        the broker (:meth:`_confirmed`): a nacked message is released like an unsent
        one, a message with no answer like an uncertain one.
        """
        if not windows:
            return 0
        sent: list[TakenWindow] = []
        failed: list[tuple[TakenWindow, str]] = []  # (window, reason): counted against it
        unsent: list[TakenWindow] = []  # not attempted or not sent: not counted
        uncertain: list[TakenWindow] = []  # a batch the broker answered in part
        suspects: list[tuple[TakenWindow, str]] = []  # MaybeShared: counted if others went
        refused: list[TakenWindow] = []  # AMQP: nacked by the broker; not counted
        bad: list[tuple[TakenWindow, str, str]] = []  # to quarantine: (window, reason, kind)
        # Past half its lease a window may be taken again by another dispatcher: publishing
        # it then would send it twice. Leave it leased; whoever takes it next publishes it.
        lease_end = took_at + self.settings.dispatch_lease_ms / 2000
        fresh = [w for w in windows if w.tries == 1]
        retried = [w for w in windows if w.tries > 1]
        with self._producer() as producer:
            for group, batched in ((fresh, True), (retried, False)):
                if not group:
                    continue
                if unsent or producer is None:  # the broker failed (for an earlier group)
                    unsent.extend(group)
                    continue
                ok: list[TakenWindow] = []
                confirming: dict[int, TakenWindow] = {}  # AMQP: publish number -> window
                exact = _ExactBatch(producer) if batched and self._confirms is None else None
                try:
                    with _batch(producer, len(group)) if batched else nullcontext():
                        for i, window in enumerate(group):
                            if time.monotonic() >= lease_end:
                                logger.warning(
                                    "debounce: %s[%s] key=%r not published: half its %dms "
                                    "lease passed (slow broker?); it is published after the "
                                    "lease expires", window.task_name, window.task_id,
                                    window.key, self.settings.dispatch_lease_ms,
                                )
                                continue
                            start = exact.position() if exact is not None else -1
                            try:
                                self._send(producer, window)
                                if self._confirms is not None:
                                    confirming[self._confirms.sent()] = window
                                    if not batched:  # one by one: its answer before the next
                                        self._confirmed(confirming, lease_end, batched, ok,
                                                        failed, refused, uncertain)
                                    continue
                            except UnreadableWindow as exc:
                                bad.append((window, str(exc), "message"))
                            except BrokerUnavailable as exc:
                                self._shared_fault(str(exc))
                                logger.warning(
                                    "debounce: broker unavailable, %d window(s) not published, "
                                    "not counted against them; will retry in %.1fs: %s",
                                    len(group) - i, self._fault_delay, exc,
                                )
                                unsent.extend(group[i:])
                                break
                            except MaybeShared as exc:  # this message's, or every one's?
                                suspects.append((window, str(exc)))
                            except Exception as exc:  # this message: count it, go on
                                logger.warning(
                                    "debounce: publishing %s[%s] key=%r failed (attempt "
                                    "%d of %d): %r", window.task_name, window.task_id,
                                    window.key, window.failures + 1, MAX_TRIES, exc,
                                )
                                failed.append((window, f"{type(exc).__name__}: {exc}"))
                                if self._confirms is not None and not self._confirms.usable():
                                    # the broker closed the channel: nothing more goes out
                                    # on it; the rest waits for the next pass
                                    unsent.extend(group[i + 1:])
                                    break
                            else:
                                ok.append(window)
                                if exact is not None:
                                    exact.record(window, start)
                        if exact is not None:
                            replies = exact.flush()
                            if replies is not None:
                                self._sort_replies(producer, exact.spans, replies, ok, failed,
                                                   suspects, unsent)
                    if confirming:
                        self._confirmed(confirming, lease_end, batched, ok, failed, refused,
                                        uncertain)
                except Exception as exc:  # the batched publish failed as a whole
                    shared = producer is not None and self._fault_kind(producer, exc) == BROKER
                    if shared:
                        self._shared_fault(exc)
                    logger.warning(
                        "debounce: publishing a batch of %d failed, none is confirmed; "
                        "will retry: %r (%s)", len(ok), exc,
                        f"the broker as a whole: {self.broker_fault}" if shared else
                        "this batch", exc_info=False,
                    )
                    if is_error_reply(exc) and not (shared and pipeline_failed_at(exc) == 1):
                        # the pipeline's other commands ran: some messages may be there
                        uncertain.extend(ok)
                    else:  # unreachable, or the broker refused from the first command on
                        unsent.extend(ok)
                    ok = []
                sent.extend(ok)
        held: list[TakenWindow] = []  # suspects without evidence: not counted
        if suspects:
            if sent:  # the broker took another window of this pass: these are their own
                failed.extend(suspects)
            else:  # the broker's or theirs: not counted, retried with their own back-off
                held.extend(w for w, _ in suspects)
                logger.warning(
                    "debounce: %d window(s) refused and no other published in this pass, "
                    "not counted against them (the broker's fault or theirs: %s); will retry",
                    len(held), suspects[0][1],
                )
        try:
            self._track_expiry(shard, sent)
            if sent:
                self.store.ack(shard, [w.task_id for w in sent])
                for window in sent:
                    _announce(window)
            # only failures shown to be the window's count (fl), never the takes a
            # broker outage wasted (tries counts those too)
            for window, reason in failed:
                if window.failures + 1 >= MAX_TRIES:
                    bad.append((window, f"publish failed {window.failures + 1} times, last: "
                                        f"{reason}", "publish_failed"))
            retry = [w for w, _ in failed if w.failures + 1 < MAX_TRIES]
            self._release(shard, unsent + refused, uncertain, retry, held)
            for window, reason, kind in bad:
                self._quarantine(window, reason, kind)
        finally:
            _count_forced(windows)  # after window_dispatched; also for windows not published
            if publish_failed.receivers or publish_refused.receivers:
                _count_failures(failed, unsent, uncertain, held, refused)
        return len(sent)

    def _sort_replies(
        self, producer: Any, spans: list[tuple[TakenWindow, int, int]], replies: list[Any],
        ok: list[TakenWindow], failed: list[tuple[TakenWindow, str]],
        suspects: list[tuple[TakenWindow, str]], unsent: list[TakenWindow],
    ) -> None:
        """Sort a batch's windows by their commands' replies (:class:`_ExactBatch`).

        A message whose first command (its ``LPUSH``) succeeded is in the broker, sent,
        whatever its later commands answered (an expiry). One whose first command was
        refused is not: a shared fault leaves it unsent, a key-dependent error makes it
        a suspect, any other error counts against it.
        """
        for window, start, _ in spans:
            first = replies[start] if start < len(replies) else None
            if not isinstance(first, Exception):
                continue
            ok.remove(window)
            reason = f"{type(first).__name__}: {first}"
            kind = self._fault_kind(producer, first)
            if kind == BROKER:
                self._shared_fault(first)
                unsent.append(window)
            elif kind == KEY:
                suspects.append((window, reason))
            else:
                logger.warning(
                    "debounce: publishing %s[%s] key=%r failed (attempt %d of %d): %s",
                    window.task_name, window.task_id, window.key, window.failures + 1,
                    MAX_TRIES, reason,
                )
                failed.append((window, reason))

    @contextmanager
    def _producer(self) -> Iterator[Any]:
        """The producer to publish on: the app's pool, or (AMQP) our confirming channel
        (None when it cannot connect)."""
        if self._confirms is None:
            with self.app.producer_or_acquire() as producer:
                yield producer
            return
        try:
            producer = self._confirms.producer()
        except Exception as exc:  # cannot connect: nothing is sent, every window waits
            self._shared_fault(exc)
            logger.warning("debounce: broker unavailable, windows not published, will "
                           "retry: %s: %s", type(exc).__name__, exc)
            producer = None
        yield producer

    def _confirmed(
        self, confirming: dict[int, TakenWindow], lease_end: float, batched: bool,
        ok: list[TakenWindow], failed: list[tuple[TakenWindow, str]],
        refused: list[TakenWindow], uncertain: list[TakenWindow],
    ) -> None:
        """Wait for the broker's confirms of ``confirming`` (then emptied) and sort them.

        Acked: sent. Nacked: the broker refused to take the message (a queue at its
        length limit with ``reject-publish``, an internal error): not sent, released
        and retried soon, not counted against the window. No answer (the connection
        or channel failed, or the deadline passed): delivery is uncertain, released
        for a full lease (as a Redis batch answered in part); a window published on
        its own whose channel the broker closed is counted against it.
        """
        assert self._confirms is not None
        # wait up to half the lease from the take, and at least a second
        deadline = max(lease_end, time.monotonic() + 1.0)
        result = self._confirms.wait(sorted(confirming), deadline)
        for seq in sorted(confirming):
            window = confirming[seq]
            unroutable = self._confirms.returned(window.task_id)
            if seq in result.acked and unroutable is not None:
                # confirmed, but no queue took it (basic.return): this message's fault
                logger.warning(
                    "debounce: publishing %s[%s] key=%r failed (attempt %d of %d): %s",
                    window.task_name, window.task_id, window.key, window.tries, MAX_TRIES,
                    unroutable,
                )
                failed.append((window, unroutable))
                self._confirms.forget_declared()  # a queue deleted since it was declared
            elif seq in result.acked:
                ok.append(window)
            elif seq in result.nacked:
                refused.append(window)
            elif not batched and _channel_closed(result.error):
                failed.append((window, f"{type(result.error).__name__}: {result.error}"))
            else:
                uncertain.append(window)
        if result.nacked:
            logger.warning(
                "debounce: the broker refused (nack) %d message(s); their windows are "
                "retried: %s", len(result.nacked),
                ", ".join(confirming[s].task_id for s in sorted(result.nacked)[:5]),
            )
        if result.unconfirmed and not _channel_closed(result.error):
            # no answer at all (connection lost, or blocked by a resource alarm)
            self._shared_fault(f"no confirm: {result.error!r}")
        if result.unconfirmed:
            logger.warning(
                "debounce: %d message(s) not confirmed by the broker (%r); their windows "
                "are not acked and are published again after the lease unless a worker "
                "claims them", len(result.unconfirmed), result.error,
            )
        confirming.clear()

    def _release(
        self, shard: Shard, unsent: list[TakenWindow], uncertain: list[TakenWindow],
        failed: list[TakenWindow], held: list[TakenWindow] | None = None,
    ) -> None:
        """Hand windows back: unsent ones after a short delay, failed ones with back-off.

        A batch the broker answered with an error ran its other commands (the
        pipeline is not a transaction): those messages reached the broker
        (kombu: "delivery is uncertain"). Its windows are released for a full
        lease, so a worker claims the messages that did arrive (a claimed window
        is never taken again) before any is sent a second time. A batch that
        could not reach the broker (connection refused or lost) is retried soon.
        """
        lease = self.settings.dispatch_lease_ms
        by_delay: dict[int, list[TakenWindow]] = {}
        counted = {id(w) for w in failed}
        # after a shared fault: the pass's jittered back-off (so dispatchers do not all
        # come back at once), else soon
        soon = min(lease, math.ceil(self._fault_delay * 1000) if self.broker_fault else 1000)
        for window in unsent:
            by_delay.setdefault(soon, []).append(window)
        for window in uncertain:
            by_delay.setdefault(lease, []).append(window)
        for window in failed:
            delay = min(lease, 250 * 2 ** min(window.failures + 1, 10))
            by_delay.setdefault(delay, []).append(window)
        for window in held or ():  # a back-off of their own, not counted
            delay = min(lease, 250 * 2 ** min(window.tries, 10))
            by_delay.setdefault(delay, []).append(window)
        for delay, group in by_delay.items():
            # (id, tries) pairs: a lease another dispatcher took over is not moved;
            # "<tries>!" also counts the failure against the window (fl)
            self.store.release(shard, delay, [
                (w.task_id, f"{w.tries}!" if id(w) in counted else w.tries) for w in group])

    def _send(self, producer: Any, window: TakenWindow) -> None:
        try:
            arguments = None
            if window.content_type == DEFAULT_CONTENT_TYPE:
                arguments = check_json_body(window.payload)
            message, options = self.messages.build(
                window.task_name, window.task_id, window.shard, window.calls,
                window.content_type, window.payload, window.options_json,
                tag=self.store.tag(window.shard), arguments=arguments,
                ident=window.ident if self.settings.wait_replicas else None,
            )
            left = options.get("expiration")  # expires: the broker may drop it unseen
            if left is not None:
                self._expiry[window.task_id] = math.ceil(float(left) * 1000)
        except Exception as exc:
            raise UnreadableWindow(f"{type(exc).__name__}: {exc}") from exc
        if self._confirms is not None:
            options["mandatory"] = True  # an unroutable message comes back (basic.return)
        try:
            self._send_message(producer, window.task_name, message, **options)
        except Exception as exc:
            kind = self._fault_kind(producer, exc)
            if kind == BROKER:
                raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc
            if kind == KEY:
                raise MaybeShared(f"{type(exc).__name__}: {exc}") from exc
            raise

    def _fault_kind(self, producer: Any, exc: BaseException) -> str | None:
        """``BROKER`` when ``exc`` would hit the next unrelated message too (a connection
        failure, an error reply about the broker: OOM, READONLY, ...), ``KEY`` when it
        may depend on the message's key (NOPERM, CLUSTERDOWN, TRYAGAIN), None when it is
        this message's (counted against its window)."""
        if self._broker_failure(producer, exc):
            return BROKER
        code = reply_code(exc)
        if code in BROKER_WIDE_CODES:
            return BROKER
        if code in KEY_DEPENDENT_CODES:
            return KEY
        return None

    def _broker_failure(self, producer: Any, exc: BaseException) -> bool:
        """True when ``exc`` (or what it wraps: kombu re-raises everything as
        ``OperationalError``) is a connection failure rather than this message's fault."""
        errors: tuple[type[BaseException], ...] | None = self.__dict__.get("_errors")
        if errors is None:
            conn = producer.connection
            errors = (  # kombu's Redis transport also lists KeyError (a missing queue)
                # and InconsistencyError (no route for the exchange): those are one
                # message's fault, counted against its window
                *(e for e in getattr(conn, "connection_errors", ())
                  if not issubclass(e, (LookupError, InconsistencyError))),
                OSError, *CONNECTION_ERRORS,
            )
            self.__dict__["_errors"] = errors
        seen: BaseException | None = exc
        for _ in range(10):
            if seen is None:
                return False
            if isinstance(seen, errors):
                return True
            seen = seen.__cause__ or seen.__context__
        return False

    def _refresh_layouts(self) -> None:
        """Every few seconds: write this dispatcher's shard layout if it took windows,
        and read every layout remembered (layouts.lua); drain the shards of the others.

        A layout is remembered for ``debounce_history_ttl`` after its dispatchers last
        took a window, and for as long as a dispatcher draining it finds windows in
        its shards. So after ``debounce_shards`` changes, the windows left under tags
        the new value does not read (a lowered count; on a cluster, any change) are
        still taken and published, by every dispatcher, until those shards are empty.
        """
        now = time.monotonic()
        if now - self._layouts_at < self._layouts_every:
            return
        self._layouts_at = now
        write = {name for tag in self._foreign_busy for name in self._foreign.get(tag, ())}
        if self._took:
            write.add(self._layout)
        try:
            _, layouts = self.store.layouts(sorted(write))
        except DebounceBackendError as exc:  # drained again at the next refresh
            logger.warning("debounce: could not read the shard layouts: %s", exc)
            return
        self._took, self._foreign_busy = False, set()
        if write:
            self._layouts_written_at = now
        foreign: dict[str, set[str]] = {}
        for name in layouts:
            if name == self._layout:
                continue
            for tag in layout_tags(self.settings.key_prefix, name):
                if tag not in self._own_tags:
                    foreign.setdefault(tag, set()).add(name)
        if set(foreign) - set(self._foreign):
            logger.warning(
                "debounce: dispatcher %s (%s) also drains the shards other layouts left "
                "(%s: a changed debounce_shards): %s", self.name, self._layout,
                ", ".join(sorted({n for names in foreign.values() for n in names})),
                ", ".join(sorted(foreign)),
            )
        self._foreign = foreign

    def _track_expiry(self, shard: Shard, sent: list[TakenWindow]) -> None:
        """Record when the messages just sent expire (expiring.lua), before their ack."""
        expiry, self._expiry = self._expiry, {}
        tracked = [(w.task_id, expiry[w.task_id]) for w in sent if w.task_id in expiry
                   and expiry[w.task_id] < self.settings.record_ttl_ms]
        if not tracked:  # (an expiry past the record's TTL: the record goes first)
            return
        try:
            self.store.expiring(shard, tracked)
        except DebounceBackendError as exc:
            logger.warning("debounce: could not record when %d message(s) expire (their "
                           "windows stay queued if the broker drops them unseen): %s",
                           len(tracked), exc)

    def _finish_expired(self, shard: Shard) -> None:
        """Finish as REVOKED the queued windows whose message expired unseen (at most
        once a second per shard): RabbitMQ discards an expired message without any
        worker signal, and a queue no worker reads keeps it; either way its callers
        would wait until the record's TTL. A claimed (running) window is never touched
        (expire.lua)."""
        now = time.monotonic()
        if now - self._expired_at.get(shard, -math.inf) < EXPIRE_EVERY_S:
            return
        self._expired_at[shard] = now
        stored: list[str] = []
        for task_id, aliases in self.store.expire(shard):
            logger.warning(
                "debounce: window %s expired before any worker ran it (its message's "
                "expires passed in the broker): finished as REVOKED", task_id,
            )
            try:
                self.app.backend.mark_as_revoked(task_id, "expired")
            except NotImplementedError:  # no result backend: nothing to store
                pass
            except Exception as error:  # the result backend is down: again next time
                logger.warning("debounce: window %s expired but could not store REVOKED: "
                               "%r", task_id, error)
                continue
            if aliases:
                resolve_aliases(self.app, task_id, parse_aliases(aliases), states.REVOKED,
                                None)
            stored.append(task_id)
        self.store.expired(shard, stored)  # until then expire.lua returns them again

    def _quarantine(self, window: TakenWindow, reason: str, kind: str = "message") -> None:
        logger.error(
            "debounce: quarantined %s[%s] key=%r: cannot publish its message: %s",
            window.task_name, window.task_id, window.key, reason,
        )
        try:
            self._quarantine_id(window.shard, window.task_id, reason)
        except DebounceBackendError as exc:  # stays leased: taken again after the lease
            logger.warning("debounce: could not quarantine %s: %s", window.task_id, exc)
            return
        if window_quarantined.receivers:
            window_quarantined.send(sender=window.task_name, task_id=window.task_id,
                                    key=window.key, kind=kind, reason=reason)

    def _quarantine_id(self, shard: Shard, task_id: str, reason: str) -> None:
        """Set the record aside, then fail the window's id and every id that joined
        it, so no caller waits forever on a window that will not run."""
        aliases = self.store.quarantine(shard, task_id, reason)
        if aliases is None:
            return
        exc = WindowQuarantined(f"debounce window {task_id} was quarantined: {reason}")
        try:
            self.app.backend.mark_as_failure(task_id, exc)
        except Exception as error:  # no result backend, or it is down: logged, as cancel does
            logger.warning("debounce: quarantined %s but could not store its failure: %r",
                           task_id, error)
        resolve_aliases(self.app, task_id, parse_aliases(aliases), states.FAILURE, exc)

    def _set_aside(self, shard: Shard, taken: TakeResult) -> None:
        """Log the entries take.lua skipped; quarantine records that cannot be read."""
        for key, error in taken.skipped:
            logger.error(
                "debounce: skipped %s: %s (not a window record: something else wrote this "
                "key; it was taken out of the due/lease set, delete it to reuse the key)",
                key, error,
            )
        for task_id, reason in taken.unreadable:
            logger.error("debounce: quarantined window %s: %s", task_id, reason)
            if task_id != "?":
                self._quarantine_id(shard, task_id, reason)
                if window_quarantined.receivers:
                    window_quarantined.send(sender="?", task_id=task_id, key="",
                                            kind="record", reason=reason)

    # -- loop ---------------------------------------------------------------
    @property
    def backend(self) -> WindowStore:
        """:attr:`store` under its name before ``store``: deprecated, warns."""
        warnings.warn("Dispatcher.backend is deprecated: use Dispatcher.store",
                      DeprecationWarning, stacklevel=2)
        return self.store

    def run(self) -> None:
        """Dispatch until :meth:`stop` is called; survives Redis and broker outages."""
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._subscribe()  # before taking: a wake sent after this take is not lost
                self._heartbeat()
                _, next_in = self.dispatch_once()
                backoff = 0.1
                if self.broker_fault is not None:  # back off: no wake-up shortens it
                    self._stop.wait(next_in / 1000)
                    continue
                self._wait(next_in / 1000)
            except (DebounceBackendError, REDIS_ERROR) as exc:
                logger.warning("debounce: dispatcher %s: Redis error, retrying in %.1fs: %s",
                               self.name, backoff, exc)
                self.store.refresh_topology()  # a cluster's failover or resharding
                self._close_pubsub()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception:
                logger.exception("debounce: dispatcher %s: unexpected error", self.name)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self._stopped()
        self.close()

    def _heartbeat(self) -> None:
        """At most every :data:`HEARTBEAT_S`: say this dispatcher runs (``ping``, ``top``)."""
        if time.monotonic() - self._beat_at >= HEARTBEAT_S:
            self.store.heartbeat(self.name)
            self._beat_at = time.monotonic()

    def _stopped(self) -> None:
        """A clean stop: ``top`` and ``ping`` show it stopped rather than silent."""
        try:
            self.store.heartbeat(self.name, alive=False)
        except (DebounceBackendError, REDIS_ERROR) as exc:
            logger.info("debounce: dispatcher %s could not record its stop: %s", self.name, exc)

    def close(self) -> None:
        """Close the wake subscription and (AMQP) the confirming broker connection.

        ``run()`` does it when it ends; call it after ``dispatch_once()`` used alone.
        The next pass opens them again."""
        self._close_pubsub()
        if self._confirms is not None:
            self._confirms.close()

    def _subscribe(self) -> None:
        """Subscribe to the wake channel and wait until Redis confirms it."""
        if self._wake is None:
            self._wake = self.store.wake_listener()
        self._wake.subscribe()

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking when a gate call announces an earlier deadline."""
        if seconds <= 0:
            return
        self._subscribe()
        assert self._wake is not None
        self._wake.wait(seconds, self._stop)

    def _close_pubsub(self) -> None:
        if self._wake is not None:
            self._wake.close()
            self._wake = None

    def start(self) -> threading.Thread:
        """Run the loop in a daemon thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name=f"debounce-{self.name}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
