"""What one `celery debounce top` refresh costs Redis, with 1,000 and 1,000,000 open windows.

    python scripts/top_cost.py [--windows 1000000] [--refreshes 200]

Starts its own redis-server, opens the windows with ``enqueue_many`` (the same
gate.lua writes a producer makes), with counters, hot keys and a dispatcher
record in place (one dispatcher pass over 1,000 due windows), then runs
``read_snapshot`` (what each refresh of ``top`` and each scrape of the store
gauges reads) N times and prints, from ``INFO commandstats``, the commands per
refresh, their total time inside Redis, and the wall time per refresh.
docs/monitoring.md quotes its output.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(app: Any, client: Any, refreshes: int) -> tuple[dict[str, tuple[int, int]], float]:
    from celery_debounce.ops.admin import read_snapshot
    from celery_debounce.store import store_for

    backend = store_for(app)
    read_snapshot(backend)
    client.config_resetstat()
    start = time.perf_counter()
    for _ in range(refreshes):
        read_snapshot(backend)
    wall = (time.perf_counter() - start) / refreshes
    stats = client.info("commandstats")
    per = {
        name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for name, v in stats.items()
        if not name.startswith(("cmdstat_config", "cmdstat_info"))
    }
    return per, wall


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=1_000_000)
    parser.add_argument("--refreshes", type=int, default=200)
    args = parser.parse_args()

    import redis
    from celery import Celery

    from celery_debounce import DebouncedTask, Dispatcher, enqueue_many
    from celery_debounce.testing.servers import LocalRedis

    with LocalRedis() as server:
        app = Celery("topcost", set_as_current=False)
        app.conf.update(broker_url=f"{server.url}/1", debounce_redis_url=f"{server.url}/0")

        @app.task(
            base=DebouncedTask,
            shared=False,
            name="app.tasks.index",
            debounce="1h",
            debounce_max_wait="2h",
            debounce_key="user:{0}",
        )
        def index(user: int) -> None:
            pass

        client = redis.Redis.from_url(f"{server.url}/0")
        # 1,000 windows due at once, taken by one dispatcher pass: counters, hot keys and
        # the dispatcher record exist as in production (messages go to the broker DB).
        enqueue_many(
            index, [((f"due{i}",), {}) for i in range(1000)], debounce="1ms", debounce_max_wait="1s"
        )
        time.sleep(0.05)
        Dispatcher(app, name="cost").dispatch_once()
        rows = []
        done = 0
        for target in sorted({1000, args.windows}):
            start = time.perf_counter()
            for first in range(done, target, 50_000):
                last = min(target, first + 50_000)
                enqueue_many(index, [((i,), {}) for i in range(first, last)], chunk_size=2000)
            done = target
            opened = time.perf_counter() - start
            per, wall = measure(app, client, args.refreshes)
            calls = sum(c for c, _ in per.values()) / args.refreshes
            usec = sum(u for _, u in per.values()) / args.refreshes
            rows.append((target, calls, usec, wall * 1000, per, opened))
        print(f"used_memory: {client.info('memory')['used_memory_human']}")
        print(
            "| open windows | commands per refresh | time in Redis per refresh | "
            "wall time per refresh |"
        )
        print("|---|---|---|---|")
        for target, calls, usec, wall_ms, _, _ in rows:
            print(f"| {target:,} | {calls:g} | {usec:.0f} µs | {wall_ms:.2f} ms |")
        print()
        for target, _, _, _, per, opened in rows:
            detail = ", ".join(
                f"{name} {c // args.refreshes}x {u / c:.1f}µs"
                for name, (c, u) in sorted(per.items())
            )
            print(f"{target:,} windows (opened in {opened:.0f}s): {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
