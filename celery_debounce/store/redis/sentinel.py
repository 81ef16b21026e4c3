"""Redis Sentinel: the master's client and the ``+switch-master`` watcher.

Which master, and how to reach the sentinels, is read from the settings by
:mod:`celery_debounce.sentinel_settings`.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from ...sentinel_settings import SentinelConfig

_logger = logging.getLogger("celery_debounce.store")

#: The channel on which every sentinel announces a new master.
SWITCH_CHANNEL = "+switch-master"


def sentinel_client(config: SentinelConfig, timeout_s: float, retry: Retry) -> redis.Redis:
    """A client of the current master: each new connection asks the sentinels where it is,
    and a connection to a demoted master (READONLY) is dropped and re-resolved."""
    # The sentinels get the master's timeouts and no retry of their own (unless
    # sentinel_kwargs says otherwise): finding the master already tries each sentinel
    # in turn, and redis-py's default retry (3, backing off to 10 s) made a call with
    # no sentinel reachable fail only after 25 s.
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 0),
        **dict(config.sentinel_kwargs or ()),
    }
    manager = Sentinel(
        list(config.sentinels),
        min_other_sentinels=config.min_other_sentinels,
        sentinel_kwargs=sentinel_kwargs,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )
    client: redis.Redis = manager.master_for(
        config.master_name,
        db=config.db,
        username=config.username,
        password=config.password,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=retry,
    )
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    SwitchWatcher(config, sentinel_kwargs, pool).start()
    return client


class SwitchWatcher:
    """Moves a client's pool to the new master as soon as a sentinel announces it.

    redis-py asks the sentinels where the master is only when a connection
    connects, and Sentinel demotes the old master seconds after a failover (it
    waits to see it report its old role). Pooled connections opened before the
    switch would go on writing to the old master until then, and its demotion
    discards those writes (measured: docs/guarantees.md, "Failover"). One daemon
    thread per sentinel listens on its ``+switch-master`` and then re-reads the
    master's address, which drops the pool's idle connections; a connection in use
    is dropped when it is released. Each switch (counted once, whichever sentinels
    announce it) bumps :attr:`switches` (the dispatcher re-subscribes its wake
    channel). The threads end when the pool is garbage-collected.

    Every sentinel, not one: a sentinel that hangs with its connection open (a host
    gone without a reset, a process stopped, a minority partition) never announces
    the switch the others make. Each subscription is pinged after
    :attr:`KEEPALIVE` seconds of silence and dropped (then made again, backing off)
    when the answer does not come within the sentinels' socket timeout. The sentinel
    that announced the switch is asked first for the new address (a sentinel left
    in a minority may still name the old master).
    """

    #: Longest wait between two looks at whether the pool still exists (seconds).
    TICK = 1.0
    #: Silence (seconds) after which a subscription is pinged.
    KEEPALIVE = 2.0

    def __init__(
        self, config: SentinelConfig, sentinel_kwargs: dict[str, Any], pool: SentinelConnectionPool
    ) -> None:
        self.config = config
        self.sentinel_kwargs = sentinel_kwargs
        self._pool = weakref.ref(pool)
        pool.debounce_switch_watcher = self  # type: ignore[attr-defined]
        self.switches = 0
        self._lock = threading.RLock()  # _refresh runs in every listener thread
        self._announced: str | None = None  # the last new master announced
        self._timeout = float(sentinel_kwargs.get("socket_timeout") or 2.0)
        #: the last re-read of the master's address failed: every listener tries again
        self._unsure = False

    def start(self) -> None:
        for host, port in self.config.sentinels:
            threading.Thread(
                target=self._listen,
                args=(host, port),
                daemon=True,
                name=f"debounce-sentinel-{self.config.master_name}-{host}:{port}",
            ).start()

    def _listen(self, host: str, port: int) -> None:
        delay = 0.1
        while self._pool() is not None:
            client = redis.Redis(host=host, port=port, **self.sentinel_kwargs)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(SWITCH_CHANNEL)
                self._refresh()  # a switch announced while this was not subscribed
                delay = 0.1
                heard, pinged = time.monotonic(), 0.0
                while self._pool() is not None:
                    if self._unsure:  # a re-read failed (no sentinel answered): again
                        self._refresh()
                    message = pubsub.get_message(timeout=self.TICK)
                    now = time.monotonic()
                    if message is not None:
                        heard, pinged = now, 0.0
                        if message.get("type") == "message":
                            self._on_message(message["data"], (host, port))
                    elif pinged and now - pinged > self._timeout:
                        raise redis.TimeoutError(
                            f"no answer to a keepalive PING within {self._timeout:g}s"
                        )
                    elif not pinged and now - heard >= self.KEEPALIVE:
                        pubsub.ping()
                        pinged = now
            except (redis.RedisError, OSError) as exc:
                _logger.debug("debounce: sentinel %s:%s: %s", host, port, exc)
                threading.Event().wait(delay)
                delay = min(delay * 2, 5.0)
            finally:
                pubsub.close()
                client.close()

    def _on_message(self, data: Any, sentinel: tuple[str, int] | None = None) -> None:
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        parts = text.split(" ")
        if parts[0] != self.config.master_name:
            return
        new = " ".join(parts[3:5])
        with self._lock:
            if new and new == self._announced:
                return  # the same switch, announced by another sentinel
            self._announced = new
            _logger.warning("debounce: Sentinel switched master %s", text)
            if sentinel is not None:
                self._ask_first(sentinel)
            if not self._refresh():
                # counted whatever the pool's address was: a connection opened
                # meanwhile may have found the new master already, a wake
                # subscription opened before it has not
                self.switches += 1

    def _ask_first(self, sentinel: tuple[str, int]) -> None:
        """Put ``sentinel`` (it announced the switch) first in the order redis-py asks."""
        pool = self._pool()
        manager = getattr(pool, "sentinel_manager", None)
        clients = getattr(manager, "sentinels", None)
        if not clients:
            return
        for i, client in enumerate(clients):
            kwargs = client.connection_pool.connection_kwargs
            if (kwargs.get("host"), kwargs.get("port")) == sentinel:
                clients[0], clients[i] = clients[i], clients[0]
                return

    def _refresh(self) -> bool:
        """Re-read the master's address; True (and a switch counted) if it moved."""
        pool = self._pool()
        if pool is None:
            return False
        with self._lock:
            before = pool.master_address
            try:
                after = pool.get_master_address()  # drops idle connections if it moved
            except (redis.ConnectionError, redis.TimeoutError):  # no sentinel answered
                self._unsure = True
                return False
            self._unsure = False
            if before is not None and after != before:
                self.switches += 1
                return True
            return False


def master_switches(pool: object) -> int:
    """How many master switches the pool's watcher has seen (0 without Sentinel)."""
    watcher = getattr(pool, "debounce_switch_watcher", None)
    return watcher.switches if watcher is not None else 0
