"""The dispatcher's loop: take due windows from each shard and publish them.

A pass takes up to a batch of due windows per shard (``take.lua``), publishes them
(:mod:`celery_debounce.dispatch.publishers`: each window comes to an
:class:`~celery_debounce.dispatch.outcomes.Outcome`), then acts on what each came to
(:mod:`celery_debounce.dispatch.outcomes`: ack, release, quarantine). What spans passes is
here: the back-off after a shared fault, the Redis clock watch, the shard layouts,
the expiry sweep, the heartbeat and the wake subscription.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import warnings

from celery import Celery, states

from ..aliases import resolve_aliases
from ..errors import DebounceBackendError
from ..headers import SHARD_HEADER
from ..signals import window_quarantined
from ..store import Shard, TakenWindow, TakeResult, store_for
from ..store.api import DispatcherStore, WakeListening
from .outcomes import MAX_TRIES, WindowActions
from .publishers import BROKER_WIDE_CODES as BROKER_WIDE_CODES
from .publishers import KEY_DEPENDENT_CODES as KEY_DEPENDENT_CODES
from .publishers import Publisher, SharedFault, publisher_for
from .publishers import check_json_body as check_json_body

__all__ = ["MAX_TRIES", "SHARD_HEADER", "Dispatcher", "TakeResult", "TakenWindow"]

logger = logging.getLogger("celery_debounce.dispatcher")

#: How often (at most) a dispatcher writes and reads the shard layouts (layouts.lua);
#: also at most a quarter of debounce_history_ttl, how long a layout is remembered.
LAYOUTS_EVERY_S = 10.0
#: How often a running dispatcher writes its heartbeat (alive.lua); ``ping`` and ``top``
#: call one silent after three of these.
HEARTBEAT_S = 5.0

#: Each dispatcher looks for windows whose message expired unseen at most this often
#: per shard (one expire.lua call).
EXPIRE_EVERY_S = 1.0

#: back-off after a shared fault (s): first wait, cap; each wait is jittered (x0.5-1)
BROKER_BACKOFF_S = (0.5, 10.0)

#: A shard's Redis clock that moved this many ms more, or less, between two takes than
#: this process's monotonic clock did is logged as a clock step (docs/guarantees.md,
#: "A Redis clock step"): far above any drift or slew (NTP slews at most 0.5 ms a second)
CLOCK_STEP_MS = 1000


class Dispatcher:
    """Publishes due windows. Any number may run at once; each window is taken once.

    ``run()`` loops until ``stop()``; ``dispatch_once()`` does a single pass
    (used by tests and by the beat scheduler).
    """

    def __init__(self, app: Celery, name: str = "dispatcher") -> None:
        self.app = app
        self.name = name
        self.store: DispatcherStore = store_for(app)
        self.settings = self.store.settings
        #: the app's producer pool, or (AMQP) a confirming channel of our own
        self.publisher: Publisher = publisher_for(app, self.store, self._shared_fault)
        #: ack, release, quarantine: what each window's outcome calls for
        self.actions = WindowActions(app, self.store)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake: WakeListening | None = None
        #: the store's shard layout: its name, its legacy shards, the tags of the others
        self._plan = plan = self.store.layout
        #: legacy shards (the layout's) not yet seen empty by this dispatcher
        self._draining: list[int] = list(plan.legacy_shards)
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
        self._layout = plan.name
        self._own_tags = frozenset(
            self.store.tag(s) for s in (*range(settings.shards), *plan.legacy_shards)
        )
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
        shards: tuple[Shard, ...] = (*range(self.settings.shards), *self._draining, *self._foreign)
        for shard in shards:
            if self.broker_fault is not None:  # shared by every shard: stop the pass
                break
            while True:
                took_at = time.monotonic()
                taken = self.store.take(
                    shard, self.settings.dispatch_batch, self.name, self._lapse_upto(shard, took_at)
                )
                step = self._watch_clock(shard, taken.now_ms, took_at, time.monotonic())
                if step > 0:  # the claims of runs still going: renewed within a lease
                    moved = self._claims_moved.get(shard, (0, 0.0))[0] + step
                    self._claims_moved[shard] = (
                        moved,
                        time.monotonic() + self.settings.claim_lease_ms / 1000,
                    )
                empty = taken.next_in_ms < 0 and not (
                    taken.windows or taken.skipped or taken.unreadable
                )
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
                if (
                    got < self.settings.dispatch_batch
                    or self._stop.is_set()
                    or self.broker_fault is not None
                ):
                    break
            self._finish_expired(shard)
        if (self._took or self._foreign_busy) and (
            time.monotonic() - self._layouts_written_at >= self._layouts_every
        ):
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
                shard,
                -step / 1000,
            )
            return step
        if moved > most + CLOCK_STEP_MS:
            step = math.ceil(moved - most)
            logger.warning(
                "debounce: the clock of the windows' Redis (shard %s) went forward by about "
                "%.1f s against this dispatcher's clock (a clock step, a failover to a node "
                "whose clock is ahead, or this host was suspended): windows, max waits and "
                "quiet periods written before it end that much earlier, leases and claim "
                "leases may lapse at once (docs/guarantees.md)",
                shard,
                step / 1000,
            )
            return step
        return 0

    def _shared_fault(self, exc: BaseException | str) -> SharedFault:
        """Note a fault of the broker as a whole: the pass stops, nothing is counted
        against a window, and the next pass waits a jittered, growing back-off.
        Returns the pass's fault (the first noted) and that back-off."""
        if self.broker_fault is None:
            self._fault_streak += 1
            first, cap = BROKER_BACKOFF_S
            base = min(cap, first * 2 ** min(self._fault_streak - 1, 16))
            self._fault_delay = base * random.uniform(0.5, 1.0)  # jitter
            self.broker_fault = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        return SharedFault(self.broker_fault, self._fault_delay)

    def _publish(self, shard: Shard, windows: list[TakenWindow], took_at: float) -> int:
        """Publish one take's windows, then ack, release or quarantine each by its
        outcome (``outcomes.ACTIONS``, docs/design.md "Dispatcher loop"); returns how
        many were sent."""
        if not windows:
            return 0
        # Past half its lease a window may be taken again by another dispatcher: publishing
        # it then would send it twice. Leave it leased; whoever takes it next publishes it.
        lease_end = took_at + self.settings.dispatch_lease_ms / 2000
        outcomes = self.publisher.publish(windows, lease_end)
        backoff = self._fault_delay if self.broker_fault is not None else None
        return self.actions.apply(shard, windows, outcomes, backoff)

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
            for tag in self._plan.tags_of(name):
                if tag not in self._own_tags:
                    foreign.setdefault(tag, set()).add(name)
        if set(foreign) - set(self._foreign):
            logger.warning(
                "debounce: dispatcher %s (%s) also drains the shards other layouts left "
                "(%s: a changed debounce_shards): %s",
                self.name,
                self._layout,
                ", ".join(sorted({n for names in foreign.values() for n in names})),
                ", ".join(sorted(foreign)),
            )
        self._foreign = foreign

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
                "debounce: window %s finished as REVOKED without a run (its message's "
                "expires passed in the broker before any worker saw it, or a producer "
                "that reaches no result backend cancelled it)",
                task_id,
            )
            try:
                self.app.backend.mark_as_revoked(task_id, "expired")
            except NotImplementedError:  # no result backend: nothing to store
                pass
            except Exception as error:  # the result backend is down: again next time
                logger.warning(
                    "debounce: window %s expired but could not store REVOKED: %r", task_id, error
                )
                continue
            if aliases:
                resolve_aliases(self.app, task_id, aliases, states.REVOKED, None)
            stored.append(task_id)
        self.store.expired(shard, stored)  # until then expire.lua returns them again

    def _set_aside(self, shard: Shard, taken: TakeResult) -> None:
        """Log the entries take.lua skipped; quarantine records that cannot be read."""
        for key, error in taken.skipped:
            logger.error(
                "debounce: skipped %s: %s (not a window record: something else wrote this "
                "key; it was taken out of the due/lease set, delete it to reuse the key)",
                key,
                error,
            )
        for task_id, reason in taken.unreadable:
            logger.error("debounce: quarantined window %s: %s", task_id, reason)
            if task_id != "?":
                self.actions.quarantine_id(shard, task_id, reason)
                if window_quarantined.receivers:
                    window_quarantined.send(
                        sender="?", task_id=task_id, key="", kind="record", reason=reason
                    )

    # -- loop ---------------------------------------------------------------
    @property
    def backend(self) -> DispatcherStore:
        """:attr:`store` under its name before ``store``: deprecated, warns."""
        warnings.warn(
            "Dispatcher.backend is deprecated: use Dispatcher.store",
            DeprecationWarning,
            stacklevel=2,
        )
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
            except DebounceBackendError as exc:  # the store raises only its typed errors
                logger.warning(
                    "debounce: dispatcher %s: window store error, retrying in %.1fs: %s",
                    self.name,
                    backoff,
                    exc,
                )
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
        except DebounceBackendError as exc:
            logger.info("debounce: dispatcher %s could not record its stop: %s", self.name, exc)

    def close(self) -> None:
        """Close the wake subscription and (AMQP) the confirming broker connection.

        ``run()`` does it when it ends; call it after ``dispatch_once()`` used alone.
        The next pass opens them again."""
        self._close_pubsub()
        self.publisher.close()

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
