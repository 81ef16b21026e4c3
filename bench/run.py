"""``python -m bench``: start a local redis-server, run every benchmark, print the table."""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.harness import Row, table
from celery_debounce.local_redis import LocalRedis

#: name -> (description, runner(ctx) -> rows)
BENCHES: dict[str, tuple[str, Callable[[dict[str, Any]], list[Row]]]] = {}


def bench(name: str, description: str) -> Callable[[Callable[[dict[str, Any]], list[Row]]],
                                                    Callable[[dict[str, Any]], list[Row]]]:
    def register(fn: Callable[[dict[str, Any]], list[Row]]) -> Callable[[dict[str, Any]], list[Row]]:
        BENCHES[name] = (description, fn)
        return fn

    return register


@bench("producer", "1-3: hot key, cold keys, bulk vs plain .delay() and bare EVALSHA")
def _producer(ctx: dict[str, Any]) -> list[Row]:
    from bench.throughput import producer_rates

    n = 1000 if ctx["quick"] else 3000
    return producer_rates(ctx["app"], ctx["url"], ctx["rounds"], n)


@bench("dispatch", "4: dispatcher publishing a backlog vs plain apply_async")
def _dispatch(ctx: dict[str, Any]) -> list[Row]:
    from bench.throughput import dispatch_rate

    backlog = 5000 if ctx["quick"] else 20000
    return dispatch_rate(ctx["app"], ctx["url"], 3 if ctx["quick"] else ctx["rounds"], backlog)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run, smaller sizes")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per figure")
    parser.add_argument("--only", default="", help=f"comma list of: {', '.join(BENCHES)}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    selected = [b.strip() for b in args.only.split(",") if b.strip()] or list(BENCHES)
    unknown = [b for b in selected if b not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHES)}")
    rounds = args.rounds or (3 if args.quick else 5)
    rows: list[Row] = []
    started = time.time()
    with LocalRedis() as server:
        from bench.apps import make_app

        ctx = {"url": server.url, "quick": args.quick, "rounds": rounds,
               "app": make_app(server.url), "server": server}
        for name in selected:
            description, fn = BENCHES[name]
            if not args.json:
                print(f"running {name}: {description}", file=sys.stderr, flush=True)
            new = fn(ctx)
            rows.extend(new)
            if not args.json:
                print(table(new), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps({
            "quick": args.quick, "rounds": rounds, "seconds": round(time.time() - started, 1),
            "python": platform.python_version(), "rows": [r.as_json() for r in rows],
        }, indent=2))
    else:
        print()
        print(table(rows))
        print(f"\n{'quick' if args.quick else 'full'} run, {rounds} rounds, "
              f"{time.time() - started:.0f}s")
    missed = [r for r in rows if r.passed is False]
    return 1 if missed else 0
