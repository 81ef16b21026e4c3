"""``python -m bench``: start a local redis-server, run every benchmark, print the table."""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.harness import Row, table
from celery_debounce.testing.servers import LocalRedis

Runner = Callable[[dict[str, Any]], list[Row]]

#: name -> (description, runner(ctx) -> rows)
BENCHES: dict[str, tuple[str, Runner]] = {}


def bench(name: str, description: str) -> Callable[[Runner], Runner]:
    def register(fn: Runner) -> Runner:
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
    return dispatch_rate(ctx["app"], ctx["url"], 3, backlog)


@bench("lateness", "5: deadline -> broker with the worker-embedded dispatcher vs countdown")
def _lateness(ctx: dict[str, Any]) -> list[Row]:
    from contextlib import ExitStack

    from bench.lateness import countdown_lateness, debounce_lateness, summary
    from bench.worker import celery_worker, dispatcher_process

    app, url = ctx["app"], ctx["url"]
    rounds, seconds = (1, 4.0) if ctx["quick"] else (2, 8.0)
    rate = 500

    def measure(
        countdown: bool, separate: bool = False, **worker: Any
    ) -> tuple[list[dict[str, float]], ...]:
        pub, start, eta = [], [], []
        with ExitStack() as stack:
            if separate:
                stack.enter_context(dispatcher_process(url))
                worker["debounce_dispatcher"] = "false"
            stack.enter_context(celery_worker(url, **worker))
            for _ in range(rounds):
                got = debounce_lateness(app, url, rate, seconds)
                pub.append(summary(got["published"]))
                start.append(summary(got["started"]))
                if countdown:
                    eta.append(summary(countdown_lateness(app, url, rate, seconds)))
        return pub, start, eta

    # A: default prefork worker (1 process), Python's default 5 ms GIL switch interval
    pub, start, eta = measure(True)
    # B: same worker, GIL switch interval 0.5 ms in the worker's main process
    pub_b, _, _ = measure(False, switch=0.0005)
    # C: a thread-pool worker (4 threads), for task-start figures
    _, start_c, eta_c = measure(True, pool="threads", concurrency=4)
    # D: prefork worker without the embedded dispatcher + `celery debounce dispatch`
    _, start_d, _ = measure(False, separate=True)

    def med(rows: list[dict[str, float]], q: str) -> float:
        return statistics.median([r[q] for r in rows])

    out = []
    for q, limit in (("p50", 5.0), ("p99", 25.0)):
        row = Row(
            "5",
            f"deadline -> broker {q}, {rate}/s, prefork worker",
            "ms",
            [p[q] for p in pub],
            f"countdown ETA -> start {q}",
            med(eta, q),
            target=f"<= {limit:g} ms",
        )
        row.passed = row.median <= limit
        out.append(row)
    for q, limit in (("p50", 5.0), ("p99", 25.0)):
        row = Row(
            "5",
            f"  same, worker GIL switch interval 0.5 ms, {q}",
            "ms",
            [p[q] for p in pub_b],
            target=f"<= {limit:g} ms",
        )
        row.passed = row.median <= limit
        out.append(row)
    for label, starts, etas in (
        ("prefork worker", start, eta),
        ("threads worker", start_c, eta_c),
        ("prefork worker + dispatcher process", start_d, eta),
    ):
        for q in ("p50", "p99"):
            row = Row(
                "5",
                f"deadline -> task start {q}, {label}",
                "ms",
                [s_[q] for s_ in starts],
                f"countdown ETA -> start {q}",
                med(etas, q),
            )
            row.ratio = row.median / row.baseline_value if row.baseline_value else None
            out.append(row)
    out[0].note = (
        f"{int(sum(p['n'] for p in pub))} windows, worst {max(p['max'] for p in pub):.0f} ms. "
        "'broker' time is the ack's Redis time after the batch was flushed (an upper bound)"
    )
    return out


@bench("start", "5b: deadline -> task start: dispatcher thread, child process, own process")
def _start(ctx: dict[str, Any]) -> list[Row]:
    from bench.start import rows, start_latency

    rounds, seconds = (1, 4.0) if ctx["quick"] else (3, 6.0)
    return rows(start_latency(ctx["app"], ctx["url"], rounds, seconds))


@bench("runs", "11: a worker's runs/s debounced (and exclusive) vs plain; start at 200/s")
def _runs(ctx: dict[str, Any]) -> list[Row]:
    from bench.runs import start_lateness, worker_run_rates
    from bench.worker import celery_worker

    app, url = ctx["app"], ctx["url"]
    n = 1000 if ctx["quick"] else 3000
    rounds = min(ctx["rounds"], 5)
    with celery_worker(url):
        rows = worker_run_rates(app, url, rounds, n)
        rows += start_lateness(app, url, rounds, 4.0 if ctx["quick"] else 8.0)
    return rows


@bench("memory", "6: Redis bytes per open window; bytes left after history expired")
def _memory(ctx: dict[str, Any]) -> list[Row]:
    from bench.memory import bytes_after_history, bytes_per_open_window

    count = 20_000 if ctx["quick"] else 100_000
    m = bytes_per_open_window(ctx["app"], ctx["url"], count)
    limit = 300 + m["payload"]
    row = Row(
        "6",
        f"bytes per open window, INFO memory over {count:,}",
        "bytes",
        [m["info_per_window"]],
        target=f"<= {limit:.0f} (300 + payload)",
    )
    row.passed = m["info_per_window"] <= limit
    row.note = (
        f"MEMORY USAGE: record {m['record_per_window']:.0f} B + due-set share "
        f"{m['due_per_window']:.0f} B; payload {m['payload']:.0f} B"
    )
    row2 = Row(
        "6",
        "MEMORY USAGE record + due share",
        "bytes",
        [m["record_per_window"] + m["due_per_window"]],
        target=f"<= {limit:.0f}",
    )
    row2.passed = row2.median <= limit
    done = 2_000 if ctx["quick"] else 10_000
    h = bytes_after_history(ctx["app"], ctx["url"], done)
    row3 = Row(
        "6",
        f"bytes per finished window after history TTL ({done:,} run)",
        "bytes",
        [h["per_window"]],
        target="~0 (< 1), no keys left",
    )
    row3.passed = h["per_window"] < 1 and h["keys_left"] == 0
    row3.note = f"{h['keys_left']} window keys left in Redis"
    return [row, row2, row3]


@bench("scale", "7: call latency and dispatch lateness, 1,000 vs 1,000,000 open windows")
def _scale(ctx: dict[str, Any]) -> list[Row]:
    import redis

    from bench.lateness import debounce_lateness, summary
    from bench.scale import call_latencies, grow_to, p99
    from bench.worker import celery_worker

    app, url = ctx["app"], ctx["url"]
    big = 100_000 if ctx["quick"] else 1_000_000
    calls, seconds = (2000, 3.0) if ctx["quick"] else (4000, 10.0)
    windows = redis.Redis.from_url(f"{url}/0")
    windows.flushall()
    small_lat: list[float] = []
    small_late: list[dict[str, float]] = []
    with celery_worker(url):
        grow_to(app, url, 1000)
        small_lat.append(p99(call_latencies(app, calls)))
        small_late.append(summary(debounce_lateness(app, url, 300, seconds)["published"]))
        grow_to(app, url, big)
        big_lat = [p99(call_latencies(app, calls))]
        big_late = [summary(debounce_lateness(app, url, 300, seconds)["published"])]
        windows.flushdb()
        grow_to(app, url, 1000)
        small_lat.append(p99(call_latencies(app, calls)))
        small_late.append(summary(debounce_lateness(app, url, 300, seconds)["published"]))
    windows.flushall()
    rows = []

    def scaled(op: str, samples: list[float], base: list[float]) -> Row:
        row = Row(
            "7",
            op,
            "ms",
            samples,
            "same with 1,000 open (better of 2)",
            min(base),
            target="<= 1.25x (or +1 ms)",
        )
        row.extra["baseline_samples"] = list(base)
        row.note = "1,000 open, before/after: " + ", ".join(f"{b:.2f}" for b in base)
        row.ratio = row.median / row.baseline_value if row.baseline_value else None
        row.passed = row.ratio is not None and (
            row.ratio <= 1.25 or row.median - (row.baseline_value or 0) <= 1.0
        )
        return row

    rows.append(scaled(f"call latency p99, {big:,} open", big_lat, small_lat))
    rows.append(
        scaled(
            f"dispatch lateness p50, {big:,} open",
            [b["p50"] for b in big_late],
            [s_["p50"] for s_ in small_late],
        )
    )
    rows.append(
        scaled(
            f"dispatch lateness p99, {big:,} open",
            [b["p99"] for b in big_late],
            [s_["p99"] for s_ in small_late],
        )
    )
    rows[0].note += "; +1 ms allowed: Redis TIME is in ms"
    return rows


@bench("bullmq", "9: .delay() and the Node producer vs BullMQ's debounce-mode add (npm: bullmq@6)")
def _bullmq(ctx: dict[str, Any]) -> list[Row]:
    from bench.bullmq import side_by_side

    n = 1000 if ctx["quick"] else 4000
    return side_by_side(ctx["app"], ctx["url"], ctx["rounds"], n)


@bench("threads", "10: .delay() from 1, 4 and 16 threads vs plain .delay() with the same")
def _threads(ctx: dict[str, Any]) -> list[Row]:
    from bench.threads import concurrent_rates

    calls = 1600 if ctx["quick"] else 4800
    return concurrent_rates(ctx["app"], ctx["url"], min(ctx["rounds"], 5), calls)


@bench("postgres", "12: .delay() with the windows in PostgreSQL vs plain .delay(); 4 dispatchers")
def _postgres(ctx: dict[str, Any]) -> list[Row]:
    from bench.postgres import churns, drain_rates, lateness, postgres_rates, storage

    n = 1000 if ctx["quick"] else 2000
    rows = postgres_rates(ctx["url"], ctx["rounds"], n)
    rows += drain_rates(ctx["url"], min(ctx["rounds"], 3), 2000 if ctx["quick"] else 5000)
    rows += lateness(ctx["url"], 500, 4.0 if ctx["quick"] else 8.0)
    rows += storage(ctx["url"], 20_000 if ctx["quick"] else 100_000)
    return rows + (churns(20_000, 100_000) if ctx["quick"] else churns(100_000, 1_000_000))


@bench("rss", "8: producer RSS over many .delay() calls")
def _rss(ctx: dict[str, Any]) -> list[Row]:
    from bench.scale import producer_rss

    calls = 100_000 if ctx["quick"] else 1_000_000
    samples = producer_rss(ctx["url"], calls)
    warm = samples[1][1]  # after 10% of the calls
    growth = (samples[-1][1] - warm) / 2**20
    row = Row(
        "8", f"producer RSS growth, 10% -> {calls:,} calls", "MiB", [growth], target="<= 1 MiB"
    )
    row.passed = growth <= 1.0
    row.note = "RSS MiB: " + ", ".join(f"{n // 1000}k={r / 2**20:.1f}" for n, r in samples[::4])
    redis_client = __import__("redis").Redis.from_url(f"{ctx['url']}/0")
    redis_client.flushall()
    return [row]


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
    rounds = args.rounds or (3 if args.quick else 7)
    rows: list[Row] = []
    started = time.time()
    with LocalRedis() as server:
        from bench.apps import make_app

        ctx = {
            "url": server.url,
            "quick": args.quick,
            "rounds": rounds,
            "app": make_app(server.url),
            "server": server,
        }
        for name in selected:
            description, fn = BENCHES[name]
            if not args.json:
                print(f"running {name}: {description}", file=sys.stderr, flush=True)
            new = fn(ctx)
            rows.extend(new)
            if not args.json:
                print(table(new), file=sys.stderr, flush=True)
    if args.json:
        print(
            json.dumps(
                {
                    "quick": args.quick,
                    "rounds": rounds,
                    "seconds": round(time.time() - started, 1),
                    "python": platform.python_version(),
                    "rows": [r.as_json() for r in rows],
                },
                indent=2,
            )
        )
    else:
        print()
        print(table(rows))
        print(
            f"\n{'quick' if args.quick else 'full'} run, {rounds} rounds, "
            f"{time.time() - started:.0f}s"
        )
    missed = [r for r in rows if r.passed is False]
    return 1 if missed else 0
