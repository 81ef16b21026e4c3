"""The app tests/dispatch/test_quorum_queues.py runs in a worker subprocess: windows in Redis DB 0,
results in DB 2, messages in a RabbitMQ quorum queue with a delivery limit.

Configured from the environment: QUORUM_REDIS, QUORUM_BROKER (an AMQP URL),
QUORUM_QUEUE, QUORUM_LIMIT, QUORUM_CLAIM_LEASE (seconds). Each task appends
"<x-delivery-count> <pid>" to the Redis list ``runs:<key>`` (DB 0); then
``quorum.lost``'s pool child dies (``os._exit``) mid-run, on every delivery
(``acks_late`` with ``reject_on_worker_lost``: the worker puts the message back each
time), and ``quorum.hangs`` sleeps until its whole worker is killed.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery
from kombu import Exchange, Queue

from celery_debounce import DebouncedTask


def build(redis_url: str, broker_url: str, queue: str, limit: int) -> Celery:
    app = Celery("quorum_app", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        result_backend=f"{redis_url}/2",
        debounce_redis_url=f"{redis_url}/0",
        debounce_poll_interval=0.2,
        debounce_claim_lease=float(os.environ.get("QUORUM_CLAIM_LEASE", "60")),
        task_default_queue=queue,
        task_queues=[
            Queue(
                queue,
                Exchange(queue),
                routing_key=queue,
                queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": limit},
            )
        ],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_heartbeat=2,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(
        base=DebouncedTask,
        name="quorum.lost",
        bind=True,
        shared=False,
        debounce="100ms",
        debounce_key="{0}",
        debounce_max_wait="2s",
        debounce_exclusive=True,
    )
    def lost(self: DebouncedTask, key: str) -> str:
        client = redis.Redis.from_url(f"{redis_url}/0", socket_timeout=2)
        client.rpush(f"runs:{key}", f"{self.request.get('x-delivery-count')} {os.getpid()}")
        os._exit(1)

    @app.task(
        base=DebouncedTask,
        name="quorum.hangs",
        bind=True,
        shared=False,
        debounce="100ms",
        debounce_key="{0}",
        debounce_max_wait="2s",
    )
    def hangs(self: DebouncedTask, key: str) -> str:
        client = redis.Redis.from_url(f"{redis_url}/0", socket_timeout=2)
        client.rpush(f"runs:{key}", f"{self.request.get('x-delivery-count')} {os.getpid()}")
        time.sleep(600)  # until the test kills the whole worker
        return key

    return app


app = build(
    os.environ.get("QUORUM_REDIS", "redis://127.0.0.1:6379"),
    os.environ.get("QUORUM_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
    os.environ.get("QUORUM_QUEUE", "quorum"),
    int(os.environ.get("QUORUM_LIMIT", "2")),
)
