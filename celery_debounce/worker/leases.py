"""Claim leases: the claims of the runs this process runs, renewed from one daemon thread.

A claim has a lease (``debounce_claim_lease``): each process that runs tasks (a prefork
child, a solo, threads or gevent worker) renews the claims of the runs it is running
from one daemon thread, one pipelined round trip per third of the lease
(:class:`_Renewer`), so a claim whose worker died goes stale within one lease and
``take.lua`` releases it.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ..store.api import WorkerStore
from ..store.domain import ShardRef

logger = logging.getLogger("celery_debounce.worker")


class _Renewer:
    """The claims this process runs, renewed by one daemon thread every third of the
    claim lease: one pipelined round trip per store and period, however many runs.

    Started at the first claim in a process (after a prefork fork: the parent's thread
    is not in the child). A run that holds the GIL (a C extension that does not release
    it), or under gevent a greenlet that never yields, stops the renewal: past one lease
    its claim is stale and a redelivery may run it again (docs/configuration.md).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: per store, per shard: the ids of the runs held there (how many times each)
        self.held: dict[WorkerStore, dict[ShardRef, dict[str, int]]] = {}
        self.pid = os.getpid()
        self.thread: threading.Thread | None = None
        self.kick = threading.Event()  # a new shard: renew by its period, not later

    def hold(self, store: WorkerStore, shard: ShardRef, task_id: str) -> None:
        with self.lock:
            if self.pid != os.getpid():  # a forked child
                self.held.clear()
                self.pid, self.thread, self.kick = os.getpid(), None, threading.Event()
            shards = self.held.setdefault(store, {})
            if shard not in shards:
                self.kick.set()
            ids = shards.setdefault(shard, {})
            ids[task_id] = ids.get(task_id, 0) + 1
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(
                    target=self._run, name="debounce-claims", daemon=True, args=(self.kick,)
                )
                self.thread.start()

    def drop(self, store: WorkerStore, shard: ShardRef, task_id: str) -> None:
        with self.lock:
            ids = self.held.get(store, {}).get(shard)
            if not ids or task_id not in ids:
                return
            ids[task_id] -= 1
            if ids[task_id] <= 0:
                del ids[task_id]
            # an emptied shard stays (one per shard and store): the next run's hold then
            # finds it and does not wake the renewal thread, once per run

    def snapshot(self) -> list[tuple[WorkerStore, dict[ShardRef, list[str]]]]:
        with self.lock:
            out = []
            for store, shards in self.held.items():
                held = {shard: list(ids) for shard, ids in shards.items() if ids}
                if held:
                    out.append((store, held))
            return out

    def renew_now(
        self, only: set[WorkerStore] | None = None
    ) -> dict[WorkerStore, Exception | None]:
        """Renew the claims held (of the stores in ``only``): each store's error, or
        None if its renewal reached Redis."""
        done: dict[WorkerStore, Exception | None] = {}
        for store, held in self.snapshot():
            if only is not None and store not in only:
                continue
            try:
                store.renew_claims(held)
            except Exception as exc:
                done[store] = exc
            else:
                done[store] = None
        return done

    def _run(self, kick: threading.Event) -> None:
        """Renew every third of the shortest lease held; a new shard (a kick) can
        bring the next renewal closer, never push it back (runs that start often would
        otherwise postpone it forever).

        A store whose renewal failed is tried again after :data:`RETRY_FIRST_S`, a wait
        that doubles up to :data:`RETRY_MAX_S` and never exceeds a quarter of what is left of
        its lease (counted from the start of its last renewal that reached Redis): its
        claims are lost only when no attempt reaches Redis for a whole lease."""
        next_at: float | None = None
        retry_at: dict[WorkerStore, float] = {}  # a store whose renewal failed: when again
        failures: dict[WorkerStore, int] = {}
        renewed: dict[WorkerStore, float] = {}  # start of its last renewal that went through
        while True:
            with self.lock:  # every store seen (held now or not): a new claim's first
                # renewal is at most one period after it, with no wake-up per run
                periods = [store.settings.claim_lease_ms for store in self.held]
            period = min(periods, default=MIN_PERIOD_MS * 3) / 3000
            now = time.monotonic()
            if next_at is None or next_at > now + period:
                next_at = now + period
            kick.wait(max(0.0, min([next_at, *retry_at.values()]) - now))
            kick.clear()
            started = time.monotonic()
            if started >= next_at:
                next_at = None
                due = set(retry_at)
                done = self.renew_now()
            else:
                due = {store for store, at in retry_at.items() if at <= started}
                if not due:
                    continue
                done = self.renew_now(due)
            for store in due - set(done):  # nothing held there any more
                del retry_at[store], failures[store]
            for store, exc in done.items():
                if exc is None:
                    renewed[store] = started
                    retry_at.pop(store, None)
                    if failures.pop(store, 0):
                        logger.info("debounce: claims renewed again")
                    continue
                tries = failures[store] = failures.get(store, 0) + 1
                logger.log(
                    logging.WARNING if tries == 1 else logging.DEBUG,
                    "debounce: could not renew claims (attempt %d; tried again "
                    "within the lease): %s",
                    tries,
                    exc,
                )
                lease = store.settings.claim_lease_ms / 1000
                # never renewed yet: its claims were made within the last period
                left = renewed.get(store, started - lease / 3) + lease - time.monotonic()
                wait = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** min(tries - 1, 8))
                retry_at[store] = time.monotonic() + (min(wait, left / 4) if left > 0 else wait)


#: Shortest renewal period (ms), whatever the lease (settings refuse leases below 1 s).
MIN_PERIOD_MS = 1000
#: First and longest wait (s) before a failed renewal is tried again (each failed
#: attempt also takes up to ``debounce_redis_timeout``).
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 0.5

_renewer = _Renewer()
