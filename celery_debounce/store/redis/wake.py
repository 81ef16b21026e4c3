"""The wake channel a dispatcher sleeps on."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from ...errors import DebounceBackendError
from .translate import translate_errors

if TYPE_CHECKING:  # pragma: no cover
    from .. import WindowStore


class WakeListener:
    """A dispatcher's subscription to the wake channel (gate.lua and flush.lua publish
    on it when a deadline earlier than every other appears)."""

    def __init__(self, store: WindowStore) -> None:
        self.store = store
        self._pubsub: Any = None

    def subscribe(self) -> None:
        """Subscribe and wait until Redis confirms it (no-op when subscribed)."""
        if self._pubsub is not None:
            return
        if self.store.sharded_wake:
            self._subscribe_sharded()
            return
        settings = self.store.settings
        with translate_errors("wake subscription"):
            pubsub = self.store.client.pubsub()
            pubsub.subscribe(self.store.layout.wake_channel)
            deadline = time.monotonic() + max(settings.redis_timeout_s, 1.0)
            while time.monotonic() < deadline:
                message = pubsub.get_message(timeout=0.2)
                if message is not None and message["type"] == "subscribe":
                    self._pubsub = pubsub
                    return
        pubsub.close()
        raise DebounceBackendError("debounce Redis did not confirm the wake subscription")

    def _subscribe_sharded(self) -> None:
        """SSUBSCRIBE to every shard's ``<tag>:wake`` on the master serving it (cluster).

        One connection per master holding shards (redis-py's ``ClusterPubSub``). A
        master that fails, or a slot that moves (the server ends the subscription with
        ``sunsubscribe``), ends the wait; the dispatcher subscribes again on the new owner.
        """
        settings = self.store.settings
        channels = [self.store.layout.shard_wake_channel(s) for s in range(settings.shards)]
        with translate_errors("wake subscription"):
            pubsub: Any = self.store.client.pubsub()
            try:
                pubsub.ssubscribe(*channels)
                confirmed: set[Any] = set()
                deadline = time.monotonic() + max(settings.redis_timeout_s, 1.0)
                while time.monotonic() < deadline and len(confirmed) < len(channels):
                    message = pubsub.get_sharded_message(timeout=0.05)
                    if message is not None and message["type"] == "ssubscribe":
                        confirmed.add(message["channel"])
            except BaseException:
                pubsub.close()
                raise
        if len(confirmed) < len(channels):
            pubsub.close()
            raise DebounceBackendError("debounce Redis did not confirm the wake subscription")
        self._pubsub = pubsub

    def _next(self, timeout: float) -> Any:
        if self.store.sharded_wake:
            # round robin over the masters' connections, a short wait on each
            message = self._pubsub.get_sharded_message(timeout=min(timeout, 0.02))
            if message is not None and message["type"] == "sunsubscribe":
                self.close()  # the slot moved: subscribe again on its new owner
                return {"type": "message"}
            return message
        return self._pubsub.get_message(timeout=timeout)

    @property
    def subscribed(self) -> bool:
        return self._pubsub is not None

    def wait(self, seconds: float, stop: threading.Event) -> None:
        """Sleep up to ``seconds`` or until a wake-up arrives or ``stop`` is set."""
        if seconds <= 0:
            return
        deadline = time.monotonic() + seconds
        self.subscribe()
        switches = self.store.master_switches
        with translate_errors("wake subscription"):
            while not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                if self.store.master_switches != switches:  # Sentinel moved the master:
                    self.close()  # subscribe there (the old one may live on)
                    return
                message = self._next(min(remaining, 0.5))
                if message is not None and message["type"] in ("message", "smessage"):
                    while self._pubsub is not None and self._next(0) is not None:
                        pass
                    return

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except Exception:  # noqa: S110 - closing a broken connection
                pass
            self._pubsub = None
