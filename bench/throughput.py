"""Benchmarks 1-4: calls/s of the producer paths and the dispatcher's publish rate."""

from __future__ import annotations

import itertools
import time
from typing import Any

import redis
from celery import Celery

from bench.harness import Row, compare, interleaved
from celery_debounce import Dispatcher, enqueue_many
from celery_debounce.store import store_for

#: A small 3-key script like the gate: the ceiling for "one call = one round trip".
CEILING_LUA = """
local t = redis.call('TIME')
local n = redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('ZADD', KEYS[2], t[1], ARGV[1])
redis.call('SET', KEYS[3], ARGV[2])
return {n, t[1]}
"""

_ids = itertools.count()


def _clear_broker(app: Celery) -> None:
    redis.Redis.from_url(app.conf.broker_url).flushdb()


def _plain_delay(app: Celery) -> Any:
    plain = app.tasks["bench.plain"]

    def run(n: int) -> None:
        for _ in range(n):
            plain.delay("u1", n=1)

    return run


def producer_rates(app: Celery, url: str, rounds: int, n: int) -> list[Row]:
    debounced = app.tasks["bench.debounced"]
    windows = redis.Redis.from_url(f"{url}/0")
    client = store_for(app).client  # same client settings as the gate uses
    sha = client.script_load(CEILING_LUA)

    def hot(n: int) -> None:
        for _ in range(n):
            debounced.delay("hot", n=1)

    def cold(n: int) -> None:
        for _ in range(n):
            debounced.delay(f"c{next(_ids)}", n=1)

    def evalsha(n: int) -> None:
        for _ in range(n):
            client.evalsha(sha, 3, "ceil:h", "ceil:z", "ceil:s", "m", "v")

    def bulk(n: int) -> None:
        enqueue_many(debounced, [((f"b{next(_ids)}",), {"n": 1}) for _ in range(n)])

    def bulk_hot(n: int) -> None:
        enqueue_many(debounced, [(("hotbulk",), {"n": 1}) for _ in range(n)])

    debounced.delay("hot", n=1)  # open the hot window
    r = interleaved(
        rounds,
        n,
        {"plain": _plain_delay(app), "hot": hot, "evalsha": evalsha, "cold": cold},
        before=lambda: _clear_broker(app),
    )
    rb = interleaved(
        rounds,
        n * 5,
        {"plain": _plain_delay(app), "bulk": bulk, "bulk_hot": bulk_hot},
        before=lambda: _clear_broker(app),
    )
    windows.flushdb()
    return [
        compare("1", "hot key .delay() (absorbed)", r["hot"], "plain .delay()", r["plain"], 3),
        compare(
            "1",
            "hot key .delay() vs EVALSHA ceiling",
            r["hot"],
            "bare EVALSHA 3 keys",
            r["evalsha"],
            0.9,
        ),
        compare(
            "2", "cold keys .delay() (opens a window)", r["cold"], "plain .delay()", r["plain"], 2
        ),
        compare(
            "3", "enqueue_many, new key per call", rb["bulk"], "plain .delay()", rb["plain"], 10
        ),
        compare(
            "3", "enqueue_many, one hot key", rb["bulk_hot"], "plain .delay()", rb["plain"], 10
        ),
    ]


def fill_due(app: Celery, count: int) -> None:
    """``count`` windows that are due now (1 ms windows), opened in bulk."""
    debounced = app.tasks["bench.debounced"]
    for start in range(0, count, 5000):
        enqueue_many(
            debounced,
            [((f"d{next(_ids)}",), {"n": 1}) for _ in range(min(5000, count - start))],
            debounce="1ms",
            debounce_max_wait="1ms",
        )
    time.sleep(0.01)


def dispatch_rate(app: Celery, url: str, rounds: int, backlog: int) -> list[Row]:
    plain = app.tasks["bench.plain"]
    windows = redis.Redis.from_url(f"{url}/0")
    broker = redis.Redis.from_url(app.conf.broker_url)
    dispatcher = Dispatcher(app, name="bench")
    ours: list[float] = []
    base: list[float] = []
    for _ in range(rounds):
        _clear_broker(app)
        start = time.perf_counter()
        for i in range(backlog):
            plain.apply_async((f"d{i}",), {"n": 1})
        base.append(backlog / (time.perf_counter() - start))
        _clear_broker(app)
        windows.flushdb()
        fill_due(app, backlog)
        start = time.perf_counter()
        published = 0
        while published < backlog:
            done, _ = dispatcher.dispatch_once()
            published += done
            if not done:
                break
        ours.append(published / (time.perf_counter() - start))
        queued = broker.llen("celery")
        if queued != backlog or published != backlog:
            raise RuntimeError(f"dispatch published {published}, broker holds {queued}")
    windows.flushdb()
    _clear_broker(app)
    return [
        compare(
            "4",
            f"dispatch backlog of {backlog:,} due windows",
            ours,
            "plain apply_async one by one",
            base,
            2,
            unit="msgs/s",
        )
    ]
