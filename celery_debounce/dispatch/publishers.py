"""Publishing one take's windows as Celery messages, and sorting each into an outcome.

Two publishers behind one protocol (:class:`Publisher`), chosen once per dispatcher
(:func:`publisher_for`): :class:`PoolPublisher` publishes on the app's producer pool,
where the publish returning is the broker's answer (the Redis transport; each reply
of a batch is read, :class:`_ExactBatch`); :class:`AmqpPublisher` publishes on a
confirming channel of its own (:mod:`celery_debounce.dispatch.confirms`) and reads the
broker's confirms. Both publish a take's fresh windows as one batch and the windows
taken again one by one, and give each window an :class:`~.outcomes.Outcome`; what
happens next is :data:`~.outcomes.ACTIONS`'.

A window's record holds the Celery protocol-2 body as the producer serialized it
(see :mod:`celery_debounce.producer.message`). It is published as it is, with headers built
here; a payload is never deserialized.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from json import loads as _json_loads
from typing import Any, NamedTuple, Protocol

from celery import Celery
from kombu.exceptions import InconsistencyError

from ..errors import DebounceConfigError
from ..headers import WindowMessage
from ..redact import redact
from ..store import (
    CONNECTION_ERRORS,
    TakenWindow,
    is_error_reply,
    pipeline_failed_at,
    reply_code,
)
from ..store.api import BaseStore
from ..stored_call import DEFAULT_CONTENT_TYPE
from .confirms import ConfirmingPublisher, uses_confirms
from .outcomes import MAX_TRIES, Outcome, Outcomes

__all__ = [
    "AmqpPublisher",
    "MessageSender",
    "PoolPublisher",
    "Publisher",
    "SharedFault",
    "publisher_for",
]

logger = logging.getLogger("celery_debounce.dispatcher")

#: Redis error codes that describe the broker, never one message: the next unrelated
#: message would get the same answer (a shared fault is an outage: docs/design.md,
#: "Dispatcher loop"). Never counted against a window.
BROKER_WIDE_CODES = frozenset(
    {
        "OOM",  # maxmemory with noeviction (a backlog filled the broker)
        "READONLY",  # a replica: the broker's own failover demoted this node
        "MISCONF",  # stop-writes-on-bgsave-error: its last save failed
        "LOADING",  # loading its dataset after a restart
        "NOAUTH",
        "WRONGPASS",  # the connection is not authenticated
        "MASTERDOWN",  # a replica whose link to its master is down
        "NOREPLICAS",  # min-replicas-to-write not met
        "BUSY",  # a script or function runs too long
    }
)
#: Codes that may depend on the message's key (an ACL key pattern, a cluster slot): a
#: shared fault unless shown to be this message's, i.e. another window of the same
#: pass was published.
KEY_DEPENDENT_CODES = frozenset({"NOPERM", "CLUSTERDOWN", "TRYAGAIN"})

#: A shared fault (the broker as a whole) and a key-dependent one (see above).
BROKER, KEY = "broker", "key"


class SharedFault(NamedTuple):
    """The fault of the broker as a whole that stopped the pass, and its back-off (s)."""

    reason: str
    delay: float


#: Notes a shared fault with the dispatcher (its back-off); returns the pass's fault.
NoteFault = Callable[[BaseException | str], SharedFault]


class UnreadableWindow(Exception):
    """A window record that cannot be turned into a message."""


class BrokerUnavailable(Exception):
    """The broker as a whole failed (not one message): nothing after it is sent."""


class MaybeShared(Exception):
    """An error that may be the broker's or this message's (NOPERM, CLUSTERDOWN,
    TRYAGAIN): counted against the window only if another window of the pass was
    published."""


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
        isinstance(parsed, list)
        and len(parsed) == 3
        and isinstance(parsed[0], list)
        and isinstance(parsed[1], dict)
        and isinstance(parsed[2], dict)
    ):
        raise ValueError(
            "body is not a Celery protocol-2 body [args, kwargs, embed] (a record "
            "written by celery_debounce 0.1, or by something else)"
        )
    return parsed[0], parsed[1]


class MessageSender:
    """Builds one window's message from its record and publishes it on a producer;
    tells a fault of the broker as a whole from one message's."""

    def __init__(self, app: Celery, store: BaseStore) -> None:
        self.store = store
        self.settings = store.settings
        self.messages = WindowMessage(app)
        try:
            self._send_message = app.amqp.send_task_message
        except ValueError:  # kombu cannot read the broker URL; its error quotes a part of it
            raise DebounceConfigError(
                redact(
                    f"broker_url {app.conf.broker_url!r} cannot be read (a password holding "
                    "';', '/', '@' or ':' must be percent-encoded)"
                )
            ) from None
        #: task id -> ms until its message expires, for the windows published with one
        self.expiry: dict[str, int] = {}
        self._errors: tuple[type[BaseException], ...] | None = None

    def send(
        self, producer: Any, window: TakenWindow, mandatory: bool = False, retry: bool = True
    ) -> None:
        """Publish ``window``'s message; raises :class:`UnreadableWindow`,
        :class:`BrokerUnavailable`, :class:`MaybeShared`, or this message's error.
        ``retry``: kombu may reconnect and publish again (the app's retry policy)."""
        try:
            arguments = None
            if window.content_type == DEFAULT_CONTENT_TYPE:
                arguments = check_json_body(window.payload)
            message, options = self.messages.build(
                window.task_name,
                window.task_id,
                window.shard,
                window.calls,
                window.content_type,
                window.payload,
                window.options_json,
                tag=self.store.tag(window.shard),
                arguments=arguments,
                ident=window.ident if self.settings.wait_replicas else None,
            )
            left = options.get("expiration")  # expires: the broker may drop it unseen
            if left is not None:
                self.expiry[window.task_id] = math.ceil(float(left) * 1000)
        except Exception as exc:
            raise UnreadableWindow(f"{type(exc).__name__}: {exc}") from exc
        if mandatory:
            options["mandatory"] = True  # an unroutable message comes back (basic.return)
        if not retry:
            options["retry"] = False
        try:
            self._send_message(producer, window.task_name, message, **options)
        except Exception as exc:
            kind = self.fault_kind(producer, exc)
            if kind == BROKER:
                raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc
            if kind == KEY:
                raise MaybeShared(f"{type(exc).__name__}: {exc}") from exc
            raise

    def take_expiry(self) -> dict[str, int]:
        """The expiries noted since the last call (then forgotten)."""
        expiry, self.expiry = self.expiry, {}
        return expiry

    def fault_kind(self, producer: Any, exc: BaseException) -> str | None:
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
        errors = self._errors
        if errors is None:
            conn = producer.connection
            errors = (  # kombu's Redis transport also lists KeyError (a missing queue)
                # and InconsistencyError (no route for the exchange): those are one
                # message's fault, counted against its window
                *(
                    e
                    for e in getattr(conn, "connection_errors", ())
                    if not issubclass(e, (LookupError, InconsistencyError))
                ),
                OSError,
                *CONNECTION_ERRORS,
            )
            self._errors = errors
        seen: BaseException | None = exc
        for _ in range(10):
            if seen is None:
                return False
            if isinstance(seen, errors):
                return True
            seen = seen.__cause__ or seen.__context__
        return False


class Publisher(Protocol):
    """Publishes one take's windows; says what each came to."""

    sender: MessageSender

    def publish(self, windows: list[TakenWindow], lease_end: float) -> Outcomes:
        """Publish ``windows`` (none started at or after ``lease_end``, monotonic)."""

    def close(self) -> None:
        """Drop what it holds open (the next publish opens it again)."""


def publisher_for(app: Celery, store: BaseStore, note_fault: NoteFault) -> Publisher:
    """An :class:`AmqpPublisher` on an AMQP broker (py-amqp), else a :class:`PoolPublisher`."""
    sender = MessageSender(app, store)  # first: refuses a broker URL kombu cannot read
    if uses_confirms(app):
        return AmqpPublisher(app, sender, note_fault)
    return PoolPublisher(app, sender, note_fault)


def _batch(producer: Any, size: int) -> Any:
    """kombu's ``producer.batch`` sized so it flushes once, or a no-op where unsupported."""
    batch = getattr(producer, "batch", None)
    if batch is None or not producer.supports_batch_publish:
        return nullcontext()
    return batch(max_size=4 * size + 16)


class _Publishing:
    """What both publishers share: a take's fresh windows go as one batch, those taken
    again (``tries`` > 1) one by one, so a message that failed a batch is singled out
    on its next attempt; no publish starts after ``lease_end``; one message's error
    does not stop the others, a shared fault stops everything after it."""

    #: every message published ``mandatory`` (an unroutable one comes back)
    mandatory = False
    #: kombu's publish retry (reconnect and send again) is left on
    retry = True

    def __init__(self, app: Celery, sender: MessageSender, note_fault: NoteFault) -> None:
        self.app = app
        self.sender = sender
        self.note_fault = note_fault
        self.lease_ms = sender.settings.dispatch_lease_ms

    def publish(self, windows: list[TakenWindow], lease_end: float) -> Outcomes:
        out = Outcomes()
        fresh = [w for w in windows if w.tries == 1]
        retried = [w for w in windows if w.tries > 1]
        with self._producer() as producer:
            for group, batched in ((fresh, True), (retried, False)):
                if not group:
                    continue
                if out.has(Outcome.UNSENT) or producer is None:  # the broker failed
                    out.add_all(group, Outcome.UNSENT)
                    continue
                self._publish_group(producer, group, batched, lease_end, out)
        out.expiry = self.sender.take_expiry()
        return out

    def close(self) -> None:
        pass

    # -- what the two publishers do differently ------------------------------------
    def _producer(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _open_group(
        self,
        producer: Any,
        group: list[TakenWindow],
        batched: bool,
    ) -> tuple[AbstractContextManager[Any], _ExactBatch | None]:
        """The context ``group`` is published in, and the reader of its replies."""
        return (_batch(producer, len(group)) if batched else nullcontext()), None

    def _sent(
        self,
        window: TakenWindow,
        batched: bool,
        ok: list[TakenWindow],
        out: Outcomes,
        lease_end: float,
    ) -> None:
        """``window``'s publish returned (an error raised here is the message's)."""
        ok.append(window)

    def _answered(
        self, batched: bool, ok: list[TakenWindow], out: Outcomes, lease_end: float
    ) -> None:
        """The group is published: read what the broker answered."""

    def _usable(self) -> bool:
        """False once nothing more can go out on this producer."""
        return True

    def _lost(self) -> None:
        """A publish failed on the connection (the group's answers read): drop it."""

    # -- one group -------------------------------------------------------------------
    def _publish_group(
        self,
        producer: Any,
        group: list[TakenWindow],
        batched: bool,
        lease_end: float,
        out: Outcomes,
    ) -> None:
        ok: list[TakenWindow] = []
        lost = False
        try:
            context, exact = self._open_group(producer, group, batched)
            with context:
                for i, window in enumerate(group):
                    if time.monotonic() >= lease_end:
                        self._late(window, out)
                        continue
                    start = exact.position() if exact is not None else -1
                    try:
                        self.sender.send(producer, window, self.mandatory, self.retry)
                        self._sent(window, batched, ok, out, lease_end)
                    except UnreadableWindow as exc:
                        out.add(window, Outcome.BAD, str(exc))
                    except BrokerUnavailable as exc:
                        fault = self.note_fault(str(exc))
                        logger.warning(
                            "debounce: broker unavailable, %d window(s) not published, "
                            "not counted against them; will retry in %.1fs: %s",
                            len(group) - i,
                            fault.delay,
                            exc,
                        )
                        out.add_all(group[i:], Outcome.UNSENT)
                        lost = True
                        break
                    except MaybeShared as exc:  # this message's, or every one's?
                        out.add(window, Outcome.SUSPECT, str(exc))
                    except Exception as exc:  # this message: count it, go on
                        logger.warning(
                            "debounce: publishing %s[%s] key=%r failed (attempt %d of %d): %r",
                            window.task_name,
                            window.task_id,
                            window.key,
                            window.failures + 1,
                            MAX_TRIES,
                            exc,
                        )
                        out.add(window, Outcome.FAILED, f"{type(exc).__name__}: {exc}")
                        if not self._usable():
                            # the broker closed the channel: nothing more goes out on
                            # it; the rest waits for the next pass
                            out.add_all(group[i + 1 :], Outcome.UNSENT)
                            break
                    else:
                        if exact is not None:
                            exact.record(window, start)
                if exact is not None:
                    replies = exact.flush()
                    if replies is not None:
                        self._sort_replies(producer, exact.spans, replies, ok, out)
            self._answered(batched, ok, out, lease_end)
            if lost:
                self._lost()
        except Exception as exc:  # the batched publish failed as a whole
            self._batch_failed(producer, exc, ok, out)
            ok = []
        out.add_all(ok, Outcome.SENT)

    def _late(self, window: TakenWindow, out: Outcomes) -> None:
        """``window`` is not sent: half its lease passed; it is published after the
        lease expires."""
        logger.warning(
            "debounce: %s[%s] key=%r not published: half its %dms "
            "lease passed (slow broker?); it is published after the "
            "lease expires",
            window.task_name,
            window.task_id,
            window.key,
            self.lease_ms,
        )
        out.add(window, Outcome.LATE)

    def _batch_failed(
        self, producer: Any, exc: Exception, ok: list[TakenWindow], out: Outcomes
    ) -> None:
        """A batched publish failed as a whole: none of ``ok`` is confirmed. Uncertain
        where the pipeline's other commands ran, unsent otherwise."""
        shared = self.sender.fault_kind(producer, exc) == BROKER
        noted = self.note_fault(exc) if shared else None
        logger.warning(
            "debounce: publishing a batch of %d failed, none is confirmed; will retry: %r (%s)",
            len(ok),
            exc,
            f"the broker as a whole: {noted.reason}" if noted else "this batch",
            exc_info=False,
        )
        if is_error_reply(exc) and not (shared and pipeline_failed_at(exc) == 1):
            # the pipeline's other commands ran: some messages may be there
            out.add_all(ok, Outcome.UNCERTAIN)
        else:  # unreachable, or the broker refused from the first command on
            out.add_all(ok, Outcome.UNSENT)

    def _sort_replies(
        self,
        producer: Any,
        spans: list[tuple[TakenWindow, int, int]],
        replies: list[Any],
        ok: list[TakenWindow],
        out: Outcomes,
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
            kind = self.sender.fault_kind(producer, first)
            if kind == BROKER:
                self.note_fault(first)
                out.add(window, Outcome.UNSENT)
            elif kind == KEY:
                out.add(window, Outcome.SUSPECT, reason)
            else:
                logger.warning(
                    "debounce: publishing %s[%s] key=%r failed (attempt %d of %d): %s",
                    window.task_name,
                    window.task_id,
                    window.key,
                    window.failures + 1,
                    MAX_TRIES,
                    reason,
                )
                out.add(window, Outcome.FAILED, reason)


class PoolPublisher(_Publishing):
    """Publishes on the app's producer pool: the publish returning is the broker's
    answer (the Redis transport), and a batch's replies are read one by one."""

    @contextmanager
    def _producer(self) -> Iterator[Any]:
        with self.app.producer_or_acquire() as producer:
            yield producer

    def _open_group(
        self,
        producer: Any,
        group: list[TakenWindow],
        batched: bool,
    ) -> tuple[AbstractContextManager[Any], _ExactBatch | None]:
        exact = _ExactBatch(producer) if batched else None
        return (_batch(producer, len(group)) if batched else nullcontext()), exact


class AmqpPublisher(_Publishing):
    """Publishes on an AMQP broker: on a confirming channel of its own (the app's
    producers never enter confirm mode), every message ``mandatory``; a window is sent
    once the broker confirmed its message (:meth:`_confirmed`)."""

    mandatory = True
    #: kombu's retry would reconnect and publish again on a channel of its own, out of
    #: confirm mode and out of our numbering: a failed publish is ours to retry
    retry = False

    def __init__(self, app: Celery, sender: MessageSender, note_fault: NoteFault) -> None:
        super().__init__(app, sender, note_fault)
        self.confirms = ConfirmingPublisher(app)
        #: this group's messages by publish number, until the broker answered
        self._confirming: dict[int, TakenWindow] = {}

    def close(self) -> None:
        self.confirms.close()

    @contextmanager
    def _producer(self) -> Iterator[Any]:
        """Our confirming channel's producer, None when it cannot connect."""
        try:
            producer = self.confirms.producer()
        except Exception as exc:  # cannot connect: nothing is sent, every window waits
            self.note_fault(exc)
            logger.warning(
                "debounce: broker unavailable, windows not published, will retry: %s: %s",
                type(exc).__name__,
                exc,
            )
            producer = None
        yield producer

    def _open_group(
        self,
        producer: Any,
        group: list[TakenWindow],
        batched: bool,
    ) -> tuple[AbstractContextManager[Any], _ExactBatch | None]:
        self._confirming = {}
        return super()._open_group(producer, group, batched)

    def _sent(
        self,
        window: TakenWindow,
        batched: bool,
        ok: list[TakenWindow],
        out: Outcomes,
        lease_end: float,
    ) -> None:
        self._confirming[self.confirms.sent()] = window
        if not batched:  # one by one: its answer before the next
            self._confirmed(lease_end, batched, ok, out)

    def _answered(
        self, batched: bool, ok: list[TakenWindow], out: Outcomes, lease_end: float
    ) -> None:
        if self._confirming:
            self._confirmed(lease_end, batched, ok, out)

    def _usable(self) -> bool:
        return self.confirms.usable()

    def _lost(self) -> None:
        self.confirms.discard()  # whatever its socket shows: the next pass opens a new one

    def _confirmed(
        self, lease_end: float, batched: bool, ok: list[TakenWindow], out: Outcomes
    ) -> None:
        """Wait for the broker's confirms of the messages published (then forgotten)
        and sort them.

        Acked: sent. Nacked: the broker refused to take the message (a queue at its
        length limit with ``reject-publish``, an internal error): REFUSED. No answer
        (the connection or channel failed, or the deadline passed): UNCERTAIN, as a
        Redis batch answered in part; a window published on its own whose channel the
        broker closed is FAILED, and so is one whose message came back unroutable.
        """
        confirming = self._confirming
        # wait up to half the lease from the take, and at least a second
        deadline = max(lease_end, time.monotonic() + 1.0)
        result = self.confirms.wait(sorted(confirming), deadline)
        for seq in sorted(confirming):
            window = confirming[seq]
            unroutable = self.confirms.returned(window.task_id)
            if seq in result.acked and unroutable is not None:
                # confirmed, but no queue took it (basic.return): this message's fault
                logger.warning(
                    "debounce: publishing %s[%s] key=%r failed (attempt %d of %d): %s",
                    window.task_name,
                    window.task_id,
                    window.key,
                    window.tries,
                    MAX_TRIES,
                    unroutable,
                )
                out.add(window, Outcome.FAILED, unroutable)
                self.confirms.forget_declared()  # a queue deleted since it was declared
            elif seq in result.acked:
                ok.append(window)
            elif seq in result.nacked:
                out.add(window, Outcome.REFUSED)
            elif not batched and _channel_closed(result.error):
                out.add(window, Outcome.FAILED, f"{type(result.error).__name__}: {result.error}")
            else:
                out.add(window, Outcome.UNCERTAIN)
        if result.nacked:
            logger.warning(
                "debounce: the broker refused (nack) %d message(s); their windows are retried: %s",
                len(result.nacked),
                ", ".join(confirming[s].task_id for s in sorted(result.nacked)[:5]),
            )
        if result.unconfirmed and not _channel_closed(result.error):
            # no answer at all (connection lost, or blocked by a resource alarm)
            self.note_fault(f"no confirm: {result.error!r}")
        if result.unconfirmed:
            logger.warning(
                "debounce: %d message(s) not confirmed by the broker (%r); their windows "
                "are not acked and are published again after the lease unless a worker "
                "claims them",
                len(result.unconfirmed),
                result.error,
            )
        confirming.clear()


def _channel_closed(exc: BaseException | None) -> bool:
    """True when the broker closed the channel over a message (an AMQP channel error)."""
    from amqp.exceptions import ChannelError

    return isinstance(exc, ChannelError)


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
        if not (
            self.usable
            and self.spans
            and session is not None
            and isinstance(getattr(session, "_buffered", None), int)
            and self.spans[-1][2] == self.position()
        ):
            return None
        replies = list(session.pipeline.execute(raise_on_error=False))
        session._buffered = 0  # kombu's own flush finds nothing left to send
        return replies
