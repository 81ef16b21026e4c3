"""Dispatch throughput on RabbitMQ: streamed publisher confirms against no confirms
and against kombu's per-message ``confirm_publish``.

    python -m bench.rabbit_confirms                  # 5 interleaved rounds of 5,000 windows
    python -m bench.rabbit_confirms --rounds 3 --backlog 2000

Starts its own redis-server and a private rabbitmq-server node (tests/rabbitmq_node.py;
Debian's package, see scripts/ensure-rabbitmq.sh). Each round opens ``backlog`` due
windows (1 ms windows, ``enqueue_many``) and times ``Dispatcher.dispatch_once()``
until all are published (``debounce_dispatch_batch`` 500), then checks that the queue
holds exactly ``backlog`` messages. Modes, interleaved within each round:

* ``confirms``: what the dispatcher does on an AMQP broker (confirms.py): a confirming
  channel of its own, a batch published, then the broker's acks read;
* ``none``: the same dispatcher publishing without confirms on the app's producer
  pool (what it did before; a window could be acked for a message RabbitMQ dropped);
* ``per-message``: no dispatcher-side confirms, but the app's broker connection with
  ``broker_transport_options={"confirm_publish": True}`` (py-amqp waits for each ack);
* ``apply_async``: plain ``apply_async`` of as many messages (no windows), for scale.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from bench.throughput import fill_due
from celery_debounce import DebouncedTask, Dispatcher
from celery_debounce.dispatch.publishers import PoolPublisher
from celery_debounce.testing.servers import LocalRedis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from rabbitmq_node import RabbitNode

MODES = ("confirms", "none", "per-message", "apply_async")


def make(redis_url: str, rabbit: RabbitNode, queue: str, per_message: bool) -> Celery:
    app = Celery("rabbit_bench", set_as_current=False)
    app.conf.update(
        broker_url=rabbit.url,
        debounce_redis_url=f"{redis_url}/0",
        debounce_dispatcher=False,
        task_default_queue=queue,
        task_ignore_result=True,
        broker_transport_options={"confirm_publish": True} if per_message else {},
    )

    @app.task(
        base=DebouncedTask,
        name="bench.debounced",
        shared=False,
        debounce="1h",
        debounce_max_wait="2h",
    )
    def debounced(user: str, n: int = 0) -> None:
        pass

    @app.task(name="bench.plain", shared=False)
    def plain(user: str, n: int = 0) -> None:
        pass

    return app


def depth(app: Celery, queue: str) -> int:
    with app.connection_for_write() as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


def drop(app: Celery, queue: str) -> None:
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)


def one(mode: str, redis_url: str, rabbit: RabbitNode, backlog: int) -> float:
    import redis

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    app = make(redis_url, rabbit, queue, per_message=(mode == "per-message"))
    try:
        if mode == "apply_async":
            plain = app.tasks["bench.plain"]
            plain.apply_async(("warm",), {"n": 1})  # connect and declare first
            start = time.perf_counter()
            for i in range(backlog):
                plain.apply_async((f"d{i}",), {"n": 1})
            rate = backlog / (time.perf_counter() - start)
            expected = backlog + 1
        else:
            redis.Redis.from_url(f"{redis_url}/0").flushdb()
            fill_due(app, backlog)
            dispatcher = Dispatcher(app, name="bench")
            if mode != "confirms":  # publish on the app's producer pool
                dispatcher.close()
                dispatcher.publisher = PoolPublisher(
                    app, dispatcher.publisher.sender, dispatcher._shared_fault
                )
            start = time.perf_counter()
            published = 0
            while published < backlog:
                done, _ = dispatcher.dispatch_once()
                published += done
                if not done:
                    break
            rate = published / (time.perf_counter() - start)
            dispatcher.close()
            expected = backlog
        held = depth(app, queue)
        if held != expected:
            raise RuntimeError(f"{mode}: the queue holds {held}, expected {expected}")
        return rate
    finally:
        drop(app, queue)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backlog", type=int, default=5000)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {m: [] for m in MODES}
    with LocalRedis() as server, RabbitNode() as rabbit:
        for r in range(args.rounds):
            for mode in MODES:
                results[mode].append(one(mode, server.url, rabbit, args.backlog))
            print(
                f"round {r + 1}: " + ", ".join(f"{m} {results[m][-1]:,.0f}" for m in MODES),
                flush=True,
            )
    base = statistics.median(results["none"])
    print(f"\n{'mode':<14} {'median':>8} {'min':>8} {'max':>8}  msgs/s   vs none")
    for mode in MODES:
        values = results[mode]
        med: Any = statistics.median(values)
        print(
            f"{mode:<14} {med:>8,.0f} {min(values):>8,.0f} {max(values):>8,.0f}"
            f"           {med / base:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
