"""The dispatcher: take due windows from Redis and publish them as Celery messages."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import redis
from celery import Celery
from celery.canvas import maybe_signature
from kombu import serialization
from kombu.exceptions import EncodeError

from .backend import Backend, as_text, backend_for, translate_errors
from .errors import DebounceBackendError
from .gate import DEFAULT_CONTENT_TYPE
from .keys import split_ident
from .signals import window_dispatched, window_forced_by_max_wait

logger = logging.getLogger("celery_debounce.dispatcher")

#: Header that marks a published window; its value is the window's shard.
SHARD_HEADER = "debounce_shard"

#: How many idents ``<tag>:hot`` keeps (take.lua: calls absorbed per ident, for ``top``).
HOT_KEYS_KEPT = 100


@dataclass(frozen=True)
class TakenWindow:
    """A window taken out of the due set, ready to publish."""

    shard: int
    task_id: str
    ident: str
    first_seen_ms: int
    deadline_ms: int
    max_wait_ms: int
    calls: int
    content_type: str
    payload: bytes
    options_json: str
    tries: int
    taken_ms: int

    @property
    def task_name(self) -> str:
        return split_ident(self.ident)[0]

    @property
    def key(self) -> str:
        return split_ident(self.ident)[1]

    @property
    def lateness_ms(self) -> int:
        return max(0, self.taken_ms - self.deadline_ms)

    @property
    def forced_by_max_wait(self) -> bool:
        """The max wait, not a quiet period, set this window's deadline."""
        return self.deadline_ms >= self.max_wait_ms


@dataclass(frozen=True)
class TakeResult:
    now_ms: int
    next_in_ms: int  # -1: nothing pending
    windows: list[TakenWindow]
    #: (key, Redis error) of entries take.lua set aside: a key of the wrong type
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: (task id, reason) of taken records whose fields cannot be read
    unreadable: list[tuple[str, str]] = field(default_factory=list)



def take_due(backend: Backend, shard: int, limit: int, observer: str = "") -> TakeResult:
    """Atomically take up to ``limit`` due windows (and expired leases) of ``shard``.

    With ``observer`` (the dispatcher's name), a pass that takes windows also records
    the name and time in ``<tag>:dispatchers`` and calls per ident in ``<tag>:hot``.
    """
    settings = backend.settings
    tag = settings.tag(shard)
    reply = backend.run(
        "take",
        [f"{tag}:due", f"{tag}:leased", f"{tag}:stats"],
        [tag, limit, settings.dispatch_lease_ms, settings.record_ttl_ms,
         settings.history_ttl_ms, observer, HOT_KEYS_KEPT],
    )
    now_ms = int(reply[0])
    result = TakeResult(now_ms, int(reply[1]), [])
    for row in reply[2:]:
        if len(row) == 2:  # a key of the wrong type, set aside by take.lua
            result.skipped.append((as_text(row[0]), as_text(row[1])))
            continue
        try:
            result.windows.append(_taken(shard, now_ms, row))
        except (TypeError, ValueError, UnicodeDecodeError) as exc:  # fields missing or garbled
            tid = as_text(row[0]) if row[0] is not None else "?"
            result.unreadable.append((tid, f"unreadable record: {type(exc).__name__}: {exc}"))
    return result


def _taken(shard: int, now_ms: int, row: list[Any]) -> TakenWindow:
    tid, ident, fs, dl, mw, n, ct, payload, opts, tries = row
    split_ident(as_text(ident))  # raises on a malformed ident
    return TakenWindow(
        shard=shard,
        task_id=as_text(tid),
        ident=as_text(ident),
        first_seen_ms=int(fs),
        deadline_ms=int(dl),
        max_wait_ms=int(fs) + int(mw),  # the record holds the max wait
        calls=int(n),
        content_type=as_text(ct) if ct is not None else DEFAULT_CONTENT_TYPE,
        payload=payload if isinstance(payload, bytes) else as_text(payload).encode(),
        options_json=as_text(opts) if opts is not None else "{}",
        tries=int(tries or 1),
        taken_ms=now_ms,
    )


def _announce(window: TakenWindow) -> None:
    """Log a published window; send ``window_dispatched`` (and ``..._forced_by_max_wait``)."""
    log = logger.warning if window.tries > 1 else logger.info
    log(
        "debounce: dispatched %s[%s] key=%r calls=%d late=%dms%s",
        window.task_name, window.task_id, window.key, window.calls, window.lateness_ms,
        f" (attempt {window.tries}: an earlier publish was not confirmed)"
        if window.tries > 1 else "",
    )
    if not (window_dispatched.receivers or window_forced_by_max_wait.receivers):
        return
    fields = {"task_id": window.task_id, "key": window.key, "calls": window.calls,
              "lateness": window.lateness_ms / 1000}
    window_dispatched.send(sender=window.task_name, **fields)
    if window.forced_by_max_wait and window.tries == 1:
        window_forced_by_max_wait.send(
            sender=window.task_name, max_wait_at=window.max_wait_ms / 1000, **fields
        )


def _batch(producer: Any, size: int) -> Any:
    """kombu's ``producer.batch`` sized so it flushes once, or a no-op where unsupported."""
    batch = getattr(producer, "batch", None)
    if batch is None or not producer.supports_batch_publish:
        return nullcontext()
    return batch(max_size=4 * size + 16)


class UnreadableWindow(Exception):
    """A window record that cannot be turned into a message."""


class Dispatcher:
    """Publishes due windows. Any number may run at once; each window is taken once.

    ``run()`` loops until ``stop()``; ``dispatch_once()`` does a single pass
    (used by tests and by the beat scheduler).
    """

    def __init__(self, app: Celery, name: str = "dispatcher") -> None:
        self.app = app
        self.name = name
        self.backend = backend_for(app)
        self.settings = self.backend.settings
        self.accept = serialization.prepare_accept_content(app.conf.accept_content)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pubsub: Any = None

    # -- one pass -----------------------------------------------------------
    def dispatch_once(self) -> tuple[int, int]:
        """Publish every due window once. Returns (windows published, ms until next due).

        A full batch is followed by another take at once. The time until the next
        deadline is counted from each take, so publishing a batch does not push the
        next wake-up past a deadline that came due meanwhile.
        """
        published = 0
        next_at = time.monotonic() + self.settings.poll_interval_ms / 1000
        for shard in range(self.settings.shards):
            while True:
                took_at = time.monotonic()
                taken = take_due(self.backend, shard, self.settings.dispatch_batch, self.name)
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
        if not windows:
            return 0
        tag = self.settings.tag(shard)
        sent: list[TakenWindow] = []
        failed: list[TakenWindow] = []
        # Past half its lease a window may be taken again by another dispatcher: publishing
        # it then would send it twice. Leave it leased; whoever takes it next publishes it.
        lease_end = took_at + self.settings.dispatch_lease_ms / 2000
        with self.app.producer_or_acquire() as producer:
            try:
                # One pipeline for the whole batch where kombu supports it (>= 5.7):
                # the messages reach the broker together when the block exits.
                with _batch(producer, len(windows)):
                    for window in windows:
                        if failed:
                            failed.append(window)
                            continue
                        if time.monotonic() >= lease_end:
                            logger.warning(
                                "debounce: %s[%s] key=%r not published: half its %dms lease "
                                "passed (slow broker?); it is published after the lease expires",
                                window.task_name, window.task_id, window.key,
                                self.settings.dispatch_lease_ms,
                            )
                            continue
                        try:
                            self._send(producer, window)
                        except UnreadableWindow as exc:
                            self._quarantine(window, str(exc))
                        except Exception as exc:  # broker refused: keep the window, retry later
                            logger.warning(
                                "debounce: publishing %s[%s] key=%r failed, will retry: %r",
                                window.task_name, window.task_id, window.key, exc,
                            )
                            failed.append(window)
                        else:
                            sent.append(window)
            except Exception as exc:  # the batched publish failed: none is confirmed
                logger.warning("debounce: publishing a batch of %d failed, will retry: %r",
                               len(sent), exc)
                failed = sent + failed
                sent = []
        if sent:
            self.backend.run(
                "ack", [f"{tag}:leased", f"{tag}:active"], [tag, *(w.task_id for w in sent)]
            )
            for window in sent:
                _announce(window)
        if failed:
            delay = min(self.settings.dispatch_lease_ms, 1000)
            # (id, tries) pairs: a lease another dispatcher took over is not moved
            pairs = [x for w in failed for x in (w.task_id, w.tries)]
            self.backend.run("release", [f"{tag}:leased"], [delay, tag, *pairs])
        return len(sent)

    def _send(self, producer: Any, window: TakenWindow) -> None:
        try:
            args, kwargs, options = self._message(window)
        except Exception as exc:
            raise UnreadableWindow(f"{type(exc).__name__}: {exc}") from exc
        try:
            self.app.send_task(
                window.task_name,
                args=args,
                kwargs=kwargs,
                task_id=window.task_id,
                producer=producer,
                retry=False,
                **options,
            )
        except (TypeError, ValueError, EncodeError) as exc:  # the message, not the broker
            raise UnreadableWindow(f"{type(exc).__name__}: {exc}") from exc

    def _message(self, window: TakenWindow) -> tuple[Any, Any, dict[str, Any]]:
        """Decode a window's record into send_task's args, kwargs and options."""
        args, kwargs = serialization.loads(
            window.payload, window.content_type, "utf-8", accept=self.accept
        )
        options = json.loads(window.options_json)
        if not isinstance(options, dict):
            raise ValueError("options are not a JSON object")
        headers = dict(options.pop("headers", None) or {})
        headers[SHARD_HEADER] = window.shard
        options["headers"] = headers
        if "expires" in options:
            options["expires"] = datetime.now(timezone.utc) + timedelta(seconds=options["expires"])
        if "expires_at" in options:
            options["expires"] = datetime.fromisoformat(options.pop("expires_at"))
        for name in ("link", "link_error"):
            if name in options:
                value = options[name]
                items = value if isinstance(value, list) else [value]
                options[name] = [maybe_signature(s, app=self.app) for s in items]
        options.pop("task_id", None)
        # Publish with the serializer the payload was stored with: send_task would use
        # the app's default where the task is not registered here (any standalone
        # dispatcher, and every dispatcher on Celery < 5.4).
        serializer = serialization.registry.type_to_name.get(window.content_type)
        if serializer is not None:
            options.setdefault("serializer", serializer)
        return args, kwargs, options

    def _quarantine(self, window: TakenWindow, reason: str) -> None:
        logger.error(
            "debounce: quarantined %s[%s] key=%r: cannot build its message: %s",
            window.task_name, window.task_id, window.key, reason,
        )
        self._quarantine_id(window.shard, window.task_id, reason)

    def _quarantine_id(self, shard: int, task_id: str, reason: str) -> None:
        tag = self.settings.tag(shard)
        self.backend.run(
            "quarantine", [f"{tag}:leased", f"{tag}:quarantine"], [tag, task_id, reason]
        )

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
            except (DebounceBackendError, redis.RedisError) as exc:
                logger.warning("debounce: dispatcher %s: Redis error, retrying in %.1fs: %s",
                               self.name, backoff, exc)
                self._close_pubsub()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception:
                logger.exception("debounce: dispatcher %s: unexpected error", self.name)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self._close_pubsub()

    def _subscribe(self) -> None:
        """Subscribe to the wake channel and wait until Redis confirms it."""
        if self._pubsub is not None:
            return
        with translate_errors("wake subscription"):
            pubsub = self.backend.client.pubsub()
            pubsub.subscribe(self.settings.wake_channel)
            deadline = time.monotonic() + max(self.settings.redis_timeout_s, 1.0)
            while time.monotonic() < deadline:
                message = pubsub.get_message(timeout=0.2)
                if message is not None and message["type"] == "subscribe":
                    self._pubsub = pubsub
                    return
        pubsub.close()
        raise DebounceBackendError("debounce Redis did not confirm the wake subscription")

    def _wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``, waking when a gate call announces an earlier deadline."""
        if seconds <= 0:
            return
        deadline = time.monotonic() + seconds
        self._subscribe()
        with translate_errors("wake subscription"):
            while not self._stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                message = self._pubsub.get_message(timeout=min(remaining, 0.5))
                if message is not None and message["type"] == "message":
                    while self._pubsub.get_message(timeout=0) is not None:
                        pass
                    return

    def _close_pubsub(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except Exception:  # noqa: S110 - closing a broken connection
                pass
            self._pubsub = None

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
