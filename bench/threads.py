"""Concurrent producers: calls/s of ``.delay()`` from 1, 4 and 16 threads of one process.

``python -m bench.threads`` starts a fresh redis-server and, in interleaved rounds,
runs the same number of threads making hot-key debounced calls, new-key debounced
calls and plain ``.delay()`` calls (the broker on the same server), and reports the
total calls/s of each with the ratio to plain ``.delay()`` at the same thread count.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from bench.harness import Row, compare, table

_ids = itertools.count()


def threaded_rate(threads: int, per_thread: int, call: Callable[[], Any]) -> float:
    """Total calls/s of ``threads`` threads each making ``per_thread`` calls."""
    start_line = threading.Barrier(threads + 1)

    def work() -> None:
        start_line.wait()
        for _ in range(per_thread):
            call()

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for thread in pool:
        thread.start()
    start_line.wait()
    started = time.perf_counter()
    for thread in pool:
        thread.join()
    return threads * per_thread / (time.perf_counter() - started)


def concurrent_rates(
    app: Any, url: str, rounds: int, calls: int, counts: tuple[int, ...] = (1, 4, 16)
) -> list[Row]:
    debounced = app.tasks["bench.debounced"]
    plain = app.tasks["bench.plain"]
    broker = redis.Redis.from_url(app.conf.broker_url)
    windows = redis.Redis.from_url(f"{url}/0")
    subjects: dict[str, Callable[[], Any]] = {
        "plain": lambda: plain.delay("u1", n=1),
        "hot": lambda: debounced.delay("hot", n=1),
        "new": lambda: debounced.delay(f"t{next(_ids)}", n=1),
    }
    debounced.delay("hot", n=1)
    rows: list[Row] = []
    for count in counts:
        per = max(1, calls // count)
        out: dict[str, list[float]] = {name: [] for name in subjects}
        for _ in range(rounds):
            for name, call in subjects.items():
                broker.flushdb()
                out[name].append(threaded_rate(count, per, call))
        for name, label in (("hot", "hot key"), ("new", "new key per call")):
            row = compare(
                "10",
                f"{label} .delay(), {count} thread(s)",
                out[name],
                f"plain .delay(), {count} thread(s)",
                out["plain"],
                None,
            )
            row.note = (
                f"per-thread rate {statistics.median(out[name]) / count:,.0f}; "
                f"plain {statistics.median(out['plain']) / count:,.0f}"
            )
            rows.append(row)
    windows.flushdb()
    broker.flushdb()
    return rows


def combiner_ab(
    app: Any, rounds: int, calls: int, counts: tuple[int, ...] = (1, 4, 16)
) -> list[Row]:
    """Hot-key calls/s with the gate's auto-pipelining (``store._Combiner``) on and
    off, interleaved, same process (the A/B behind keeping it)."""
    from celery_debounce.store import store_for

    debounced = app.tasks["bench.debounced"]
    debounced.delay("hot", n=1)
    store = store_for(app)
    combiner = store.transport._combiner
    rows = []
    for count in counts:
        out: dict[str, list[float]] = {"on": [], "off": []}
        for i in range(rounds):
            for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
                store.transport._combiner = combiner if mode == "on" else None
                out[mode].append(
                    threaded_rate(
                        count, max(1, calls // count), lambda: debounced.delay("hot", n=1)
                    )
                )
        store.transport._combiner = combiner
        per = [a / b for a, b in zip(out["on"], out["off"], strict=True)]
        row = compare(
            "10",
            f"hot key, {count} thread(s), pipelining on",
            out["on"],
            "same, pipelining off",
            out["off"],
            None,
        )
        row.note = f"median of per-round ratios {statistics.median(per):.2f}"
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.threads", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3200, help="calls per round, all threads")
    parser.add_argument(
        "--pipelining-ab",
        action="store_true",
        help="instead: hot key with the gate's auto-pipelining on vs off",
    )
    args = parser.parse_args(argv)
    from bench.apps import make_app
    from celery_debounce.testing.servers import LocalRedis

    with LocalRedis() as server:
        app = make_app(server.url)
        if args.pipelining_ab:
            print(table(combiner_ab(app, args.rounds, args.calls)))
        else:
            print(table(concurrent_rates(app, server.url, args.rounds, args.calls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
