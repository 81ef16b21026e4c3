"""RabbitMQ quorum queues: a window's message dropped past the queue's delivery limit.

A quorum queue counts each message's returns (``x-delivery-count``: absent on a first
delivery by ``basic.consume``, 0 on one by ``basic.get``, then one more per return) and
drops a message returned past ``x-delivery-limit``. Seen on RabbitMQ 3.10.8 with a
limit of 2: three deliveries (counted 0 or absent, 1, 2), then none; a ``basic.reject``
with requeue and a consumer whose connection closed both count.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Reject
from helpers import debounced, make_app, running_worker, stop_process, wait_until
from kombu import Connection, Exchange, Queue
from quorum_app import build
from rabbitmq_node import RabbitNode
from reads import state_of

from celery_debounce.worker.deliveries import DeliveryLimitReached, delivery_limit, dropped_delivery

pytestmark = pytest.mark.rabbitmq

LIMIT = 2
TESTS = Path(__file__).parents[1]


@pytest.fixture
def rabbit(rabbitmq_server: RabbitNode) -> Any:
    yield rabbitmq_server
    if not rabbitmq_server.accepts_amqp():
        rabbitmq_server.start()


def quorum_queue(name: str, limit: int = LIMIT) -> Queue:
    return Queue(
        name,
        Exchange(name),
        routing_key=name,
        queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": limit},
    )


def quorum_app(redis_server: str, rabbit: RabbitNode, **conf: Any) -> tuple[Celery, str]:
    qname = f"qq-{uuid.uuid4().hex[:10]}"
    app = make_app(
        redis_server,
        broker_url=rabbit.url,
        task_default_queue=qname,
        task_queues=[quorum_queue(qname)],
        broker_heartbeat=2,
        **conf,
    )
    return app, qname


def _get(queue: Any, timeout: float) -> Any:
    """The next message of ``queue`` (unacked), or None after ``timeout`` seconds."""
    try:
        return wait_until(lambda: queue.get(no_ack=False), timeout, interval=0.05)
    except AssertionError:
        return None


def test_the_broker_counts_deliveries_and_drops_the_one_past_the_limit(
    rabbit: RabbitNode,
) -> None:
    """What the fix relies on, on this RabbitMQ: the delivery counted ``limit`` is the
    last one, whether the message was rejected with requeue or its consumer went away."""
    qname = f"qq-{uuid.uuid4().hex[:10]}"
    queue = quorum_queue(qname)
    with Connection(rabbit.url) as conn:
        bound = queue(conn.channel())
        bound.declare()
        producer = conn.Producer(conn.channel())
        for how in ("requeue", "gone"):
            producer.publish({"how": how}, exchange=queue.exchange, routing_key=qname)
            counts = []
            while len(counts) <= LIMIT + 1:
                with Connection(rabbit.url) as other:
                    source = queue(other.channel()) if how == "gone" else bound
                    message = _get(source, 10 if len(counts) <= LIMIT else 2)
                    if message is None:
                        break
                    counts.append(message.headers.get("x-delivery-count"))
                    if how == "requeue":
                        message.reject(requeue=True)
                # leaving the block closes ``other`` with the message unacked: it goes back
            assert counts == list(range(LIMIT + 1)), how
            assert bound.queue_declare(passive=True).message_count == 0


def test_delivery_limit_is_read_from_the_apps_queue_arguments(
    redis_server: str,
    rabbit: RabbitNode,
) -> None:
    app, qname = quorum_app(redis_server, rabbit)
    info = {"exchange": qname, "routing_key": qname}
    assert delivery_limit(app, info) == LIMIT
    assert delivery_limit(app, {"exchange": "", "routing_key": qname}) == LIMIT
    assert delivery_limit(app, {"exchange": "other", "routing_key": qname}) is None
    assert delivery_limit(app, None) is None

    def request(count: int | None) -> Any:
        return SimpleNamespace(delivery_info=info, **{"x-delivery-count": count})

    assert dropped_delivery(app, request(LIMIT - 1)) is None
    assert "x-delivery-limit 2" in str(dropped_delivery(app, request(LIMIT)))
    assert dropped_delivery(app, request(None)) is None  # a classic queue counts nothing


def test_a_window_requeued_on_its_last_delivery_resolves_its_ids_and_frees_its_key(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
) -> None:
    """Rule "every id resolves": a debounced task that always raises
    ``Reject(requeue=True)`` on a quorum queue with ``x-delivery-limit`` 2 runs three
    times; RabbitMQ then drops its message. On that last delivery the worker finishes
    the window as FAILURE (``DeliveryLimitReached``) instead of putting it back: the
    window's id and a fixed-id alias raise it, and the exclusive key is free (the next
    window of the key runs)."""
    app, qname = quorum_app(redis_server, rabbit)
    deliveries: list[Any] = []

    @debounced(
        app,
        bind=True,
        acks_late=True,
        debounce="100ms",
        debounce_key="{0}",
        debounce_max_wait="2s",
        debounce_exclusive=True,
    )
    def reject(self: Any, key: str, ok: bool = False) -> str:
        deliveries.append(self.request.get("x-delivery-count"))
        if ok:
            return key
        raise Reject("never today", requeue=True)

    with running_worker(app):
        first = reject.delay("k")
        alias = reject.apply_async(("k",), task_id=f"alias-{qname}")
        for result in (first, app.AsyncResult(alias.id)):
            with pytest.raises(DeliveryLimitReached):
                result.get(timeout=30)
        assert deliveries == [None, 1, 2]  # a first delivery by basic.consume has no count
        # the result is stored before the window's record is finished
        wait_until(lambda: state_of(app, first.id) == "finished", timeout=10)
        # Redis only: no store read returns a result state, nor the run that owns a key
        record = redis_client.hgetall(f"debounce:{{0}}:win:{first.id}")
        assert record.get(b"rs") == b"FAILURE", record
        assert not redis_client.exists(f"debounce:{{0}}:run:{record[b'i'].decode()}")
        assert reject.delay("k", ok=True).get(timeout=30) == "k"


def worker_env(redis_server: str, rabbit: RabbitNode, queue: str, **more: str) -> dict[str, str]:
    """tests/quorum_app.py's environment; tests/ and its tree first on the path (the
    mutation check runs a mutated copy)."""
    path = os.pathsep.join(
        filter(None, [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    )
    return dict(
        os.environ,
        QUORUM_REDIS=redis_server,
        QUORUM_BROKER=rabbit.url,
        QUORUM_QUEUE=queue,
        QUORUM_LIMIT=str(LIMIT),
        PYTHONPATH=path,
        **more,
    )


def worker_process(env: dict[str, str], log: Path, pool: str) -> subprocess.Popen[bytes]:
    """``celery -A quorum_app worker`` (one process or child, embedded dispatcher)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "quorum_app",
                "worker",
                "--pool",
                pool,
                "--concurrency",
                "1",
                "--loglevel",
                "INFO",
                "-n",
                f"quorum{time.time_ns()}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=TESTS,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_a_pool_child_lost_on_the_last_delivery_resolves_its_window(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
    tmp_path: Path,
) -> None:
    """The same with a prefork child that dies mid-run on every delivery
    (``acks_late``, ``task_reject_on_worker_lost``: the worker's main process puts the
    message back each time): on the last delivery the main process finishes the window
    as FAILURE (``DeliveryLimitReached``) instead of ending the claim for a delivery
    that never comes."""
    qname = f"qq-{uuid.uuid4().hex[:10]}"
    key = f"lost-{qname}"
    app = build(redis_server, rabbit.url, qname, LIMIT)
    call = app.tasks["quorum.lost"].delay(key)
    env = worker_env(redis_server, rabbit, qname)
    log = tmp_path / "worker.log"
    worker = worker_process(env, log, "prefork")
    try:
        with pytest.raises(DeliveryLimitReached):
            app.AsyncResult(call.id).get(timeout=90)
    finally:
        stop_process(worker)
    # Redis only: the run log the worker processes write
    counts = [r.decode().split()[0] for r in redis_client.lrange(f"runs:{key}", 0, -1)]
    assert counts == ["None", "1", "2"], log.read_text()
    wait_until(lambda: state_of(app, call.id) == "finished", timeout=10)
    # Redis only: no store read returns a result state, nor the run that owns a key
    record = redis_client.hgetall(f"debounce:{{0}}:win:{call.id}")
    assert record[b"rs"] == b"FAILURE"
    assert not redis_client.exists(f"debounce:{{0}}:run:{record[b'i'].decode()}")


def test_the_whole_worker_killed_on_the_last_delivery_resolves_its_window(
    redis_server: str,
    redis_client: redis.Redis,
    rabbit: RabbitNode,
    tmp_path: Path,
) -> None:
    """The whole worker SIGKILLed mid-run on each delivery (``acks_late``), each next
    worker started after the dead run's claim lease (2 s) passed, so each redelivery
    takes the claim over instead of being skipped: after the third, RabbitMQ drops the
    message. That claim was marked the last delivery (claim.lua's ``lv``): when it
    lapses, take.lua hands the window to the expiry sweep, which finishes it as
    ``REVOKED`` and a dispatcher stores that for its id (before: ``stale``, its id
    ``PENDING`` until ``debounce_record_ttl``)."""
    qname = f"qq-{uuid.uuid4().hex[:10]}"
    key = f"hangs-{qname}"
    app = build(redis_server, rabbit.url, qname, LIMIT)
    call = app.tasks["quorum.hangs"].delay(key)
    env = worker_env(redis_server, rabbit, qname, QUORUM_CLAIM_LEASE="2")
    for n in range(1, LIMIT + 2):
        worker = worker_process(env, tmp_path / f"worker{n}.log", "solo")
        try:
            # Redis only: the run log the worker processes write
            wait_until(lambda n=n: redis_client.llen(f"runs:{key}") == n, 60)
        finally:
            worker.kill()
            worker.wait(10)
        time.sleep(3)  # past the dead run's claim lease
    # Redis only: the run log the worker processes write
    counts = [r.decode().split()[0] for r in redis_client.lrange(f"runs:{key}", 0, -1)]
    assert counts == ["None", "1", "2"]
    worker = worker_process(env, tmp_path / "last.log", "solo")  # its dispatcher lapses claims
    try:
        app.AsyncResult(call.id).get(timeout=60, propagate=False)
        assert app.AsyncResult(call.id).state == "REVOKED"
        wait_until(lambda: state_of(app, call.id) == "finished", timeout=10)
        # Redis only: no store read returns a finished window's result state
        assert redis_client.hget(f"debounce:{{0}}:win:{call.id}", "rs") == b"REVOKED"
    finally:
        stop_process(worker)
