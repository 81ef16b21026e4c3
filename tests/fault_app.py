"""The app the fault tests run in subprocesses (workers, a dispatcher that gets killed).

Configured from the environment: FAULT_REDIS (windows DB 0, broker DB 1),
FAULT_BROKER (default FAULT_REDIS DB 1), FAULT_RESULTS (a result backend URL; none
by default), FAULT_ACKS_LATE, FAULT_REJECT_ON_WORKER_LOST, FAULT_CLAIM_LEASE,
FAULT_VISIBILITY, FAULT_TIME_LIMIT, FAULT_WAIT_REPLICAS, FAULT_STORE (a postgresql:// URL:
the windows in PostgreSQL). Every run appends its task id to the
Redis list ``runs:<key>`` in DB 0 (outside the package's ``debounce:*`` keys).

    python fault_app.py take [--publish]   take due windows, print their ids, then hang
                                           (publishing them first with --publish) until killed
"""

from __future__ import annotations

import os
import sys
import time

import redis
from celery import Celery
from celery.exceptions import Ignore

from celery_debounce import DebouncedTask


def build(
    redis_url: str,
    broker_url: str | None = None,
    lease: float = 1.0,
    visibility: float = 2.0,
    claim_lease: float = 2.0,
    **conf: object,
) -> Celery:
    """The fault-test app; the same task names in the test process and in subprocesses.

    ``visibility`` is the broker's visibility timeout (an unacked ``acks_late`` message
    is delivered again after it); ``claim_lease`` the workers' claim lease (a killed
    worker's claim goes stale after it); ``conf`` overrides any other setting."""
    app = Celery("fault_app", set_as_current=False)
    app.conf.update(
        broker_url=broker_url or f"{redis_url}/1",
        task_ignore_result=True,  # runs are recorded in runs:<key> instead
        debounce_redis_url=f"{redis_url}/0",
        debounce_poll_interval=0.2,
        debounce_dispatch_lease=lease,
        debounce_claim_lease=claim_lease,
        debounce_redis_timeout=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": visibility,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
        worker_prefetch_multiplier=1,
        task_acks_late=True,
        worker_hijack_root_logger=False,
    )
    app.conf.update(conf)

    @app.task(
        base=DebouncedTask,
        name="faults.record",
        bind=True,
        shared=False,
        debounce="200ms",
        debounce_key="k:{0}",
        debounce_max_wait="2s",
    )
    def record(self: DebouncedTask, key: str, n: int = 0) -> str:
        """Append this run's id to runs:<key>; block while ``block:<key>`` exists (or
        ``block:<key>:<n>`` for the n-th run of that key)."""
        client = redis.Redis.from_url(f"{redis_url}/0", socket_timeout=2, socket_connect_timeout=2)
        nth = client.rpush(f"runs:{key}", self.request.id)
        while client.exists(f"block:{key}", f"block:{key}:{nth}"):
            time.sleep(0.05)
        client.close()
        return key

    @app.task(
        base=DebouncedTask,
        name="faults.ignored",
        bind=True,
        shared=False,
        debounce="100ms",
        debounce_key="i:{0}",
        debounce_max_wait="2s",
    )
    def ignored(self: DebouncedTask, key: str) -> None:
        """Record the run, then end it as IGNORED (``raise Ignore()``)."""
        client = redis.Redis.from_url(f"{redis_url}/0", socket_timeout=2, socket_connect_timeout=2)
        client.rpush(f"runs:{key}", self.request.id)
        client.close()
        raise Ignore()

    @app.task(
        base=DebouncedTask,
        name="faults.exclusive",
        bind=True,
        shared=False,
        debounce="200ms",
        debounce_key="x:{0}",
        debounce_max_wait="1s",
        debounce_exclusive=True,
    )
    def exclusive(self: DebouncedTask, key: str, seconds: float = 0.0, n: int = 0) -> int:
        """Record the run's start and end (Redis time, as "start <id> <ms>" and "end <id>
        <ms>" in runs:<key>), sleeping ``seconds`` in between, or until ``stop:<key>``
        exists."""
        client = redis.Redis.from_url(f"{redis_url}/0", socket_timeout=2, socket_connect_timeout=2)

        def now_ms() -> int:
            secs, micros = client.time()
            return int(secs) * 1000 + int(micros) // 1000

        client.rpush(f"runs:{key}", f"start {self.request.id} {now_ms()}")
        until = time.monotonic() + seconds
        while time.monotonic() < until and not client.exists(f"stop:{key}"):
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))
        client.rpush(f"runs:{key}", f"end {self.request.id} {now_ms()}")
        client.close()
        return n

    @app.task(
        base=DebouncedTask,
        name="faults.lost",
        bind=True,
        shared=False,
        ignore_result=False,
        debounce="200ms",
        debounce_key="l:{0}",
        debounce_max_wait="2s",
    )
    def lost(self: DebouncedTask, key: str, n: int = 0) -> str:
        """Append "<id> <pid>" to runs:<key> (the pool child's pid, for a test to kill),
        then block while ``block:<key>:<nth>`` exists; its result is stored."""
        client = redis.Redis.from_url(f"{redis_url}/0", socket_timeout=2, socket_connect_timeout=2)
        nth = client.rpush(f"runs:{key}", f"{self.request.id} {os.getpid()}")
        while client.exists(f"block:{key}:{nth}"):
            time.sleep(0.05)
        client.close()
        return key

    class DiesAfterStoring(DebouncedTask):  # type: ignore[misc]
        def after_return(self, *args: object, **kwargs: object) -> None:
            """Celery stored the result; the process dies before task_postrun."""
            os._exit(1)

    @app.task(
        base=DiesAfterStoring,
        name="faults.stored_then_lost",
        bind=True,
        shared=False,
        ignore_result=False,
        debounce="200ms",
        debounce_key="s:{0}",
        debounce_max_wait="2s",
    )
    def stored_then_lost(self: DebouncedTask, key: str) -> str:
        client = redis.Redis.from_url(f"{redis_url}/0", socket_timeout=2, socket_connect_timeout=2)
        client.rpush(f"runs:{key}", f"{self.request.id} {os.getpid()}")
        client.close()
        return key

    return app


#: FAULT_STORE (a postgresql:// URL): the windows in PostgreSQL; Redis stays the broker
#: and keeps the runs:<key> lists
_store = os.environ.get("FAULT_STORE") or None
app = build(
    os.environ.get("FAULT_REDIS", "redis://127.0.0.1:6379"),
    os.environ.get("FAULT_BROKER"),
    float(os.environ.get("FAULT_LEASE", "1")),
    visibility=float(os.environ.get("FAULT_VISIBILITY", "2")),
    claim_lease=float(os.environ.get("FAULT_CLAIM_LEASE", "2")),
    task_acks_late=os.environ.get("FAULT_ACKS_LATE", "1") == "1",
    debounce_dispatcher_process=os.environ.get("FAULT_DISPATCHER_PROCESS", "0") == "1",
    task_reject_on_worker_lost=os.environ.get("FAULT_REJECT_ON_WORKER_LOST") == "1",
    result_backend=os.environ.get("FAULT_RESULTS") or None,
    task_time_limit=float(os.environ["FAULT_TIME_LIMIT"])
    if os.environ.get("FAULT_TIME_LIMIT")
    else None,
    debounce_redis_wait_replicas=int(os.environ.get("FAULT_WAIT_REPLICAS", "0")),
    **({"debounce_store_url": _store, "debounce_redis_url": None} if _store else {}),
)


def take_and_hang(publish: bool) -> None:
    from celery_debounce.dispatch.dispatcher import Dispatcher

    dispatcher = Dispatcher(app, name="doomed")
    taken = dispatcher.store.take(0, 100)
    if publish:
        with app.producer_or_acquire() as producer:
            for window in taken.windows:
                dispatcher.publisher.sender.send(producer, window)
    print("TAKEN", *[w.task_id for w in taken.windows], flush=True)
    time.sleep(600)  # ack.lua never runs: the test SIGKILLs us here


if __name__ == "__main__" and sys.argv[1:2] == ["take"]:
    take_and_hang("--publish" in sys.argv)
