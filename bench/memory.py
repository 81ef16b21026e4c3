"""Benchmark 6: Redis bytes per open window, and per finished window once its history expired."""

from __future__ import annotations

import itertools
import random
import time
from typing import Any

import redis
from celery import Celery

from celery_debounce import enqueue_many

_ids = itertools.count()


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def open_windows(app: Celery, count: int, prefix: str, chunk: int = 5000, **options: Any) -> None:
    debounced = app.tasks["bench.debounced"]
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        enqueue_many(
            debounced, [((f"{prefix}{start + i}",), {"n": 1}) for i in range(n)], **options
        )


def bytes_per_open_window(app: Celery, url: str, count: int) -> dict[str, float]:
    client = redis.Redis.from_url(f"{url}/0")
    client.flushall()
    before = used_memory(client)
    open_windows(app, count, "user-")  # 1 h windows: all stay open
    after = used_memory(client)
    keys = [k for k in client.scan_iter(match="debounce:*:open:*", count=1000)]
    if len(keys) != count:
        raise RuntimeError(f"expected {count} open windows, found {len(keys)}")
    sample = random.Random(1).sample(keys, min(2000, len(keys)))
    with client.pipeline(transaction=False) as pipe:
        for key in sample:
            pipe.memory_usage(key, samples=0)
            pipe.hstrlen(key, "p")
        replies = pipe.execute()
    record = sum(replies[0::2]) / len(sample)
    payload = sum(replies[1::2]) / len(sample)
    due = client.memory_usage("debounce:{0}:due", samples=0) or 0
    client.flushall()
    return {
        "info_per_window": (after - before) / count,
        "record_per_window": record,
        "due_per_window": due / count,
        "payload": payload,
    }


def bytes_after_history(app: Celery, url: str, count: int) -> dict[str, float]:
    """Run ``count`` windows through a real worker with a 1 s history TTL; what is left?"""
    from bench.worker import celery_worker

    client = redis.Redis.from_url(f"{url}/0")
    client.flushall()
    with celery_worker(url, concurrency=2, debounce_history_ttl="1"):
        time.sleep(1.5)  # the probe window's history expires too
        for key in client.scan_iter(match="*"):
            client.exists(key)  # expire what is due
        before = used_memory(client)
        open_windows(app, count, "done-", debounce="1ms", debounce_max_wait="1ms")
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if (
                not client.zcard("debounce:{0}:active")
                and not client.zcard("debounce:{0}:due")
                and not client.zcard("debounce:{0}:leased")
            ):
                break
            time.sleep(0.25)
        else:
            raise RuntimeError("windows did not finish")
    time.sleep(1.5)
    left = 0
    for key in client.scan_iter(match="*"):
        left += int(client.exists(key))  # touching an expired key deletes it
    after = used_memory(client)
    client.flushall()
    return {"per_window": (after - before) / count, "keys_left": left}


if __name__ == "__main__":  # python -m bench.memory [windows]: bytes per open window only
    import sys

    from bench.apps import make_app
    from celery_debounce.testing.servers import LocalRedis

    windows = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with LocalRedis() as server:
        figures = bytes_per_open_window(make_app(server.url), server.url, windows)
    print(
        f"{windows:,} open windows: "
        + ", ".join(f"{name} {value:.1f} B" for name, value in figures.items())
    )
