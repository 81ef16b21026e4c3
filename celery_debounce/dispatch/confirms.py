"""Publisher confirms for a dispatcher whose broker speaks AMQP (RabbitMQ).

A dispatcher acks a window in Redis (``ack.lua``) only once the broker has the
message. On the Redis transport the publish itself is that answer. On AMQP
``basic.publish`` is asynchronous: the broker may drop the message later (a queue
at its ``x-max-length`` with ``overflow=reject-publish``, a node going down, an
internal error) and nothing on the publishing side raises. So a dispatcher on an
AMQP broker publishes on its own connection whose channel is in confirm mode
(``confirm.select``) and acks only the windows whose messages the broker
confirmed (``basic.ack``).

Confirms are *streamed*: a batch is published without waiting, then the
dispatcher reads the broker's acks (one ``basic.ack`` may cover many messages,
``multiple``) until every message of the batch is answered or the deadline
passes. kombu's ``confirm_publish`` transport option (``basic_publish_confirm``
in py-amqp) waits for each message in turn, one round trip per message; see
docs/performance.md for both, measured.

The app's own producers (``apply_async``, ``send_task``) are not touched: this
connection is the dispatcher's alone, opened with ``app.connection_for_write()``
and ``confirm_publish`` off (this class does the confirming).

A confirm alone does not say that a queue got the message: RabbitMQ confirms a
message no queue binds (an ``exchange``/``routing_key`` without a binding) and
drops it. So the dispatcher publishes with ``mandatory`` set, and the broker sends
such a message back (``basic.return``, before its ``basic.ack``). :meth:`returned`
names the windows whose message came back, with the reason; the dispatcher counts
that against the window (retried, then quarantined with the reason), as any
message the broker refuses for its own sake.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from celery import Celery

__all__ = ["ConfirmResult", "ConfirmingPublisher", "uses_confirms"]

logger = logging.getLogger("celery_debounce.dispatcher")


def uses_confirms(app: Celery) -> bool:
    """True when the app's broker is an AMQP 0-9-1 broker reached through py-amqp."""
    conn = app.connection_for_write()
    try:
        return bool(
            getattr(conn.transport, "driver_type", None) == "amqp"
            and getattr(conn.transport, "driver_name", None) == "py-amqp"
        )
    finally:
        conn.release()


@dataclass
class ConfirmResult:
    """What the broker said about the messages of one batch (by publish sequence number)."""

    acked: set[int] = field(default_factory=set)
    nacked: set[int] = field(default_factory=set)
    #: no answer: the deadline passed, or the channel/connection failed first
    unconfirmed: set[int] = field(default_factory=set)
    #: why some are unconfirmed (None: every message was answered)
    error: BaseException | None = None


class ConfirmingPublisher:
    """One AMQP connection and channel in confirm mode, owned by one dispatcher thread.

    Use: :meth:`producer` before a batch, :meth:`sent` after each publish that
    returned (it numbers the message as the broker does), :meth:`wait` for the
    answers. A connection that failed, or whose answers did not all arrive, is
    dropped (:meth:`discard`), so a late ``basic.ack`` is never read against the
    next batch's numbers; the next :meth:`producer` opens a new one.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._conn: Any = None
        self._channel: Any = None
        self._producer: Any = None
        self._seq = 0  # the broker numbers a channel's publishes from 1 after confirm.select
        self._acked_upto = 0  # every seq <= this is acked (a "multiple" ack)
        self._acked: set[int] = set()
        self._nacked: set[int] = set()
        #: task id -> why the broker sent its message back (basic.return)
        self._returned: dict[str, str] = {}

    # -- connection -----------------------------------------------------------
    def producer(self) -> Any:
        """A producer on the confirming channel; connects (one attempt) when needed."""
        if self._producer is not None and not self._alive():
            self.discard()
        if self._producer is None:
            conn = self.app.connection_for_write(transport_options={"confirm_publish": False})
            try:
                conn.connect()  # one attempt: a broker that is down fails this pass only
                channel = conn.channel()
                channel.confirm_select()
            except BaseException:
                conn.release()
                raise
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            channel.events["basic_return"].add(self._on_return)
            self._conn, self._channel = conn, channel
            self._producer = self.app.amqp.Producer(channel)
            self._seq = self._acked_upto = 0
            self._acked.clear()
            self._nacked.clear()
            self._returned.clear()
        return self._producer

    def _alive(self) -> bool:
        """False when the broker closed the connection or the channel since the last batch.

        Peeks at the socket without reading: only "nothing to read" means alive.
        End of file (the broker or the network closed it) or unread bytes (with
        every confirm read and heartbeats off: a ``connection.close`` or
        ``connection.blocked`` from the broker) mean: reconnect.
        """
        if self._channel is None or not getattr(self._channel, "is_open", False):
            return False
        try:
            # the channel's own connection: kombu's ``Connection.connection`` would
            # connect anew behind a channel left on the old socket
            sock = self._channel.connection.transport.sock
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True  # nothing to read: open and quiet
        except ValueError:  # a TLS socket refuses recv flags: cannot peek, trust it
            return True
        except (OSError, AttributeError):
            return False
        return False  # b"" (end of file) or bytes waiting: reconnect

    def usable(self) -> bool:
        """False once the broker closed the channel (a channel error): nothing more goes on it."""
        return self._channel is not None and bool(getattr(self._channel, "is_open", False))

    def discard(self) -> None:
        """Drop the connection (a new one is opened for the next batch)."""
        conn, self._conn, self._channel, self._producer = self._conn, None, None, None
        if conn is not None:
            try:
                conn.collect()  # close without a handshake: the socket may be dead
            except Exception:  # noqa: S110 - closing a broken connection
                pass

    close = discard

    # -- confirms ---------------------------------------------------------------
    def sent(self) -> int:
        """Number the message just published (call once per publish that returned)."""
        self._seq += 1
        return self._seq

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            self._acked_upto = max(self._acked_upto, delivery_tag)
        else:
            self._acked.add(delivery_tag)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            self._nacked.update(
                s for s in range(self._acked_upto + 1, delivery_tag + 1) if s not in self._acked
            )
            self._acked_upto = max(self._acked_upto, delivery_tag)  # answered, as nacks
        else:
            self._nacked.add(delivery_tag)

    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        """``basic.return``: a mandatory message no queue took (it is confirmed anyway)."""
        props = getattr(message, "properties", None) or {}
        headers = props.get("application_headers") or getattr(message, "headers", None) or {}
        task_id = props.get("correlation_id") or headers.get("id")
        if not task_id:
            return
        code = getattr(exc, "reply_code", None) or getattr(exc, "code", "")
        text = getattr(exc, "reply_text", None) or getattr(exc, "message", "") or str(exc)
        self._returned[str(task_id)] = (
            f"unroutable: exchange {exchange or '(default)'} routing key {routing_key!r}: "
            f"no queue is bound to it, the broker returned the message ({code} {text})"
        )

    def forget_declared(self) -> None:
        """Declare queues and exchanges again before their next publish.

        kombu declares a routed queue once per connection; a queue deleted since (by
        an operator, ``x-expires``, an auto-delete queue whose last consumer left)
        makes every message for it unroutable until the connection is replaced."""
        declared = getattr(self._conn, "declared_entities", None)
        if declared is not None:
            declared.clear()

    def returned(self, task_id: str) -> str | None:
        """Why the broker sent back the message of ``task_id`` (``basic.return``), once;
        None when it did not."""
        return self._returned.pop(task_id, None)

    def _answer(self, seq: int) -> bool | None:
        """True acked, False nacked, None not answered yet."""
        if seq in self._nacked:
            return False
        if seq in self._acked or seq <= self._acked_upto:
            return True
        return None

    def wait(self, seqs: list[int], deadline: float) -> ConfirmResult:
        """Read the broker's answers for ``seqs`` until all came or ``deadline`` (monotonic).

        Never raises for the broker's sake: a failed connection or channel, or the
        deadline, leaves the rest ``unconfirmed`` (with the reason) and drops the
        connection.
        """
        result = ConfirmResult()
        waiting = set(seqs)
        try:
            while True:
                for seq in list(waiting):
                    answer = self._answer(seq)
                    if answer is not None:
                        (result.acked if answer else result.nacked).add(seq)
                        waiting.discard(seq)
                if not waiting:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"no confirm for {len(waiting)} message(s) before the deadline"
                    )
                if self._channel is None or not self._channel.is_open:
                    raise ConnectionError("the channel was closed before every confirm came")
                try:
                    self._conn.connection.drain_events(timeout=min(left, 1.0))
                except TimeoutError:
                    continue  # nothing yet: check the deadline
        except Exception as exc:  # deadline, or the connection or channel failed
            result.unconfirmed = waiting
            result.error = exc
            self.discard()
        # numbers answered and no longer awaited can be forgotten
        self._acked.difference_update(result.acked)
        self._nacked.difference_update(result.nacked)
        return result
