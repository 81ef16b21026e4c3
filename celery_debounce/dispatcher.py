"""The dispatcher: take due windows from Redis and publish them as Celery messages.

A window's record holds the Celery protocol-2 body as the producer serialized it
(see :mod:`celery_debounce.message`). The dispatcher publishes those bytes as they
are, with headers it builds; it never deserializes a payload.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from json import loads as _json_loads
from typing import Any

from celery import Celery, states
from kombu.exceptions import InconsistencyError

from .aliases import parse_aliases, resolve_aliases
from .confirms import ConfirmingPublisher, uses_confirms
from .errors import DebounceBackendError, WindowQuarantined
from .layout import (
    DEFAULT_CONTENT_TYPE,
    SHARD_HEADER,
)
from .message import WindowMessage
from .signals import (
    leading_run,
    window_closed_by_cap,
    window_dispatched,
    window_forced_by_max_wait,
)
from .store import (
    CONNECTION_ERRORS,
    REDIS_ERROR,
    TakenWindow,
    TakeResult,
    WakeListener,
    WindowStore,
    is_error_reply,
    store_for,
)

__all__ = ["MAX_TRIES", "SHARD_HEADER", "Dispatcher", "TakeResult", "TakenWindow", "take_due"]

logger = logging.getLogger("celery_debounce.dispatcher")

#: Publish attempts (the record's ``tries``) before a window whose message fails
#: is quarantined with the reason. Failures of the broker as a whole do not count.
MAX_TRIES = 5



def take_due(store: WindowStore, shard: int, limit: int, observer: str = "") -> TakeResult:
    """:meth:`WindowStore.take <celery_debounce.store.WindowStore.take>`."""
    return store.take(shard, limit, observer)


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


def _batch(producer: Any, size: int) -> Any:
    """kombu's ``producer.batch`` sized so it flushes once, or a no-op where unsupported."""
    batch = getattr(producer, "batch", None)
    if batch is None or not producer.supports_batch_publish:
        return nullcontext()
    return batch(max_size=4 * size + 16)


def check_json_body(body: bytes) -> None:
    """Refuse a JSON body that is not ``[list, object, object]``.

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


def _channel_closed(exc: BaseException | None) -> bool:
    """True when the broker closed the channel over a message (an AMQP channel error)."""
    from amqp.exceptions import ChannelError

    return isinstance(exc, ChannelError)


class UnreadableWindow(Exception):
    """A window record that cannot be turned into a message."""


class BrokerUnavailable(Exception):
    """The broker as a whole failed (not one message): nothing after it is sent."""


class Dispatcher:
    """Publishes due windows. Any number may run at once; each window is taken once.

    ``run()`` loops until ``stop()``; ``dispatch_once()`` does a single pass
    (used by tests and by the beat scheduler).
    """

    def __init__(self, app: Celery, name: str = "dispatcher") -> None:
        self.app = app
        self.name = name
        self.store = store_for(app)
        self.backend = self.store  # the name before store.py
        self.settings = self.store.settings
        self.messages = WindowMessage(app)
        self._send_message = app.amqp.send_task_message
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake: WakeListener | None = None
        #: legacy shards (settings.legacy_shards) not yet seen empty by this dispatcher
        self._draining: list[int] = list(self.settings.legacy_shards)
        #: an AMQP broker: publish on a confirming connection of our own (confirms.py)
        self._confirms: ConfirmingPublisher | None = (
            ConfirmingPublisher(app) if uses_confirms(app) else None
        )

    # -- one pass -----------------------------------------------------------
    def dispatch_once(self) -> tuple[int, int]:
        """Publish every due window once. Returns (windows published, ms until next due).

        A full batch is followed by another take at once. The time until the next
        deadline is counted from each take, so publishing a batch does not push the
        next wake-up past a deadline that came due meanwhile.
        """
        self.store.check_server()  # read at start; again here if Redis was down then
        published = 0
        next_at = time.monotonic() + self.settings.poll_interval_ms / 1000
        for shard in (*range(self.settings.shards), *self._draining):
            while True:
                took_at = time.monotonic()
                taken = self.store.take(shard, self.settings.dispatch_batch, self.name)
                if shard >= self.settings.shards and taken.next_in_ms < 0 and not (
                        taken.windows or taken.skipped or taken.unreadable):
                    self._draining.remove(shard)  # a legacy shard left empty: done
                self._set_aside(shard, taken)
                if taken.next_in_ms >= 0:  # Redis read its clock about mid-way
                    mid = (took_at + time.monotonic()) / 2
                    next_at = min(next_at, mid + taken.next_in_ms / 1000)
                published += self._publish(shard, taken.windows, took_at)
                got = len(taken.windows) + len(taken.skipped) + len(taken.unreadable)
                if got < self.settings.dispatch_batch or self._stop.is_set():
                    break
        return published, max(0, math.ceil((next_at - time.monotonic()) * 1000))

    def _publish(self, shard: int, windows: list[TakenWindow], took_at: float) -> int:
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
        refused: list[TakenWindow] = []  # AMQP: nacked by the broker; not counted
        bad: list[tuple[TakenWindow, str]] = []  # to quarantine
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
                            try:
                                self._send(producer, window)
                                if self._confirms is not None:
                                    confirming[self._confirms.sent()] = window
                                    if not batched:  # one by one: its answer before the next
                                        self._confirmed(confirming, lease_end, batched, ok,
                                                        failed, refused, uncertain)
                                    continue
                            except UnreadableWindow as exc:
                                bad.append((window, str(exc)))
                            except BrokerUnavailable as exc:
                                logger.warning(
                                    "debounce: broker unavailable, %d window(s) not published, "
                                    "will retry: %s", len(group) - i, exc,
                                )
                                unsent.extend(group[i:])
                                break
                            except Exception as exc:  # this message: count it, go on
                                logger.warning(
                                    "debounce: publishing %s[%s] key=%r failed (attempt "
                                    "%d of %d): %r", window.task_name, window.task_id,
                                    window.key, window.tries, MAX_TRIES, exc,
                                )
                                failed.append((window, f"{type(exc).__name__}: {exc}"))
                                if self._confirms is not None and not self._confirms.usable():
                                    # the broker closed the channel: nothing more goes out
                                    # on it; the rest waits for the next pass
                                    unsent.extend(group[i + 1:])
                                    break
                            else:
                                ok.append(window)
                    if confirming:
                        self._confirmed(confirming, lease_end, batched, ok, failed, refused,
                                        uncertain)
                except Exception as exc:  # the batched publish failed as a whole
                    logger.warning(
                        "debounce: publishing a batch of %d failed, none is confirmed; "
                        "will retry: %r", len(ok), exc,
                    )
                    if is_error_reply(exc):
                        uncertain.extend(ok)
                    else:
                        unsent.extend(ok)
                    ok = []
                sent.extend(ok)
        try:
            if sent:
                self.store.ack(shard, [w.task_id for w in sent])
                for window in sent:
                    _announce(window)
            for window, reason in failed:
                if window.tries >= MAX_TRIES:
                    bad.append((window, f"publish failed {window.tries} times, last: {reason}"))
            retry = [w for w, _ in failed if w.tries < MAX_TRIES]
            self._release(shard, unsent + refused, uncertain, retry)
            for window, reason in bad:
                self._quarantine(window, reason)
        finally:
            _count_forced(windows)  # after window_dispatched; also for windows not published
        return len(sent)

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
            if seq in result.acked:
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
        if result.unconfirmed:
            logger.warning(
                "debounce: %d message(s) not confirmed by the broker (%r); their windows "
                "are not acked and are published again after the lease unless a worker "
                "claims them", len(result.unconfirmed), result.error,
            )
        confirming.clear()

    def _release(
        self, shard: int, unsent: list[TakenWindow], uncertain: list[TakenWindow],
        failed: list[TakenWindow],
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
        for window in unsent:
            by_delay.setdefault(min(lease, 1000), []).append(window)
        for window in uncertain:
            by_delay.setdefault(lease, []).append(window)
        for window in failed:
            delay = min(lease, 250 * 2 ** min(window.tries, 10))
            by_delay.setdefault(delay, []).append(window)
        for delay, group in by_delay.items():
            # (id, tries) pairs: a lease another dispatcher took over is not moved
            self.store.release(shard, delay, [(w.task_id, w.tries) for w in group])

    def _send(self, producer: Any, window: TakenWindow) -> None:
        try:
            if window.content_type == DEFAULT_CONTENT_TYPE:
                check_json_body(window.payload)
            message, options = self.messages.build(
                window.task_name, window.task_id, window.shard, window.calls,
                window.content_type, window.payload, window.options_json,
            )
        except Exception as exc:
            raise UnreadableWindow(f"{type(exc).__name__}: {exc}") from exc
        try:
            self._send_message(producer, window.task_name, message, **options)
        except Exception as exc:
            if self._broker_failure(producer, exc):
                raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc
            raise

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

    def _quarantine(self, window: TakenWindow, reason: str) -> None:
        logger.error(
            "debounce: quarantined %s[%s] key=%r: cannot publish its message: %s",
            window.task_name, window.task_id, window.key, reason,
        )
        try:
            self._quarantine_id(window.shard, window.task_id, reason)
        except DebounceBackendError as exc:  # stays leased: taken again after the lease
            logger.warning("debounce: could not quarantine %s: %s", window.task_id, exc)

    def _quarantine_id(self, shard: int, task_id: str, reason: str) -> None:
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

    def _set_aside(self, shard: int, taken: TakeResult) -> None:
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

    # -- loop ---------------------------------------------------------------
    def run(self) -> None:
        """Dispatch until :meth:`stop` is called; survives Redis and broker outages."""
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._subscribe()  # before taking: a wake sent after this take is not lost
                _, next_in = self.dispatch_once()
                backoff = 0.1
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
        self.close()

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
