"""Load test: N producer processes x M calls over K keys, 2 dispatchers, a real worker.

    python loadtest/run.py                          # 8 x 10,000 calls over 1,000 keys
    python loadtest/run.py --store postgres         # the windows in PostgreSQL
    python loadtest/run.py --store pgbouncer        # ... through PgBouncer (transaction mode)
    python loadtest/run.py --producers 4            # lighter: 4 x 10,000
    python loadtest/run.py --rate 200               # each producer at most 200 calls/s
    python loadtest/run.py --calls 2000             # scaled down

Starts its own redis-server (LocalRedis: the broker, the record of runs and, with
``--store redis``, the windows) unless --redis-url is given (it FLUSHES that server);
``--store postgres`` starts a private PostgreSQL (LocalPostgres) and migrates it,
``--store pgbouncer`` puts PgBouncer in transaction mode in front of it (the dispatchers
LISTEN on a direct connection, ``debounce_postgres_listen_url``). Producers call the gate
directly (``prepare_call`` + ``gate.enter``, what ``touch.delay`` does) to keep the
store's time of every call (``GateResult.now_ms``). Each window's deadline and ceiling
follow from its calls' times (the first call + max wait; the last + the debounce, capped);
the dispatchers note when each message was with the broker (``after_task_publish``) and
the task when its run started; one machine, one clock. Checks, for every call: its window
ran (never lost), at most once, and its run started after the store saw the call; and for
every window that it reached the broker by its ceiling + ``--slack`` (invariant 3). All
four are the verdict (exit 1 if one fails). Duplicates are awaited one dispatch lease
(``--lease``, 5 s here) + 2 s after the last run. Reports where the time went (dispatch
latency, broker queue wait, worker throughput) and how long the dispatcher and worker
processes waited for a CPU. Then waits for the history TTL and checks that the store
holds no window any more.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
DEBOUNCE_MS = 200
MAX_WAIT_MS = 1000


def produce(
    env: dict[str, str], seed: int, calls: int, keys: int, rate: float
) -> list[tuple[str, int]]:
    """Make ``calls`` calls; returns (window id, the store's time in ms) per call."""
    os.environ.update(env)
    sys.path.insert(0, str(HERE))
    from app import app, touch

    from celery_debounce.producer.call import prepare_call
    from celery_debounce.producer.gate import enter
    from celery_debounce.settings import settings_for
    from celery_debounce.store import store_for

    settings, backend = settings_for(app), store_for(app)
    spec = touch._debounce_defaults.spec
    assert spec is not None
    signature = touch.debounce_signature()
    rng = random.Random(seed)
    out = []
    start = time.monotonic()
    for seq in range(calls):
        if rate:
            ahead = start + seq / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        key = f"key{rng.randrange(keys)}"
        call = prepare_call(
            settings, touch.name, spec, (key, seq), None, {}, signature, touch.serializer
        )
        result = enter(backend, call)
        out.append((result.task_id, result.now_ms))
    return out


def package_keys(client: redis.Redis) -> list[str]:
    """The package's Redis keys but the dispatchers' liveness key (kept while they run)."""
    found = (k.decode() for k in client.scan_iter(match="debounce:*", count=1000))
    return sorted(k for k in found if not k.endswith(":alive"))


def left_in_store(store_url: str | None, client: redis.Redis) -> int:
    """Keys of the package (Redis) or window rows (PostgreSQL) the store still holds."""
    if store_url is None:
        return len(package_keys(client))
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM debounce_open) + (SELECT count(*) FROM debounce_taken)"
        ).fetchone()
    return int(row[0]) if row else 0


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def cpu_times(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for a CPU) of a process tree,
    summed over its threads (/proc/<pid>/task/<tid>/schedstat)."""
    ran = waited = 0
    for p in process_tree(pid):
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/schedstat") as f:
                    fields = f.read().split()
                ran += int(fields[0])
                waited += int(fields[1])
        except OSError:
            pass
    return ran / 1e9, waited / 1e9


def pct(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"p50 {statistics.median(xs):.0f}  p99 {xs[int(len(xs) * 0.99)]:.0f}  max {xs[-1]:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=10_000, help="calls per producer")
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument(
        "--rate", type=float, default=0, help="calls/s per producer (default 0: as fast as it can)"
    )
    parser.add_argument(
        "--slack",
        type=int,
        default=250,
        help="X in 'reached the broker later than max_wait_at + X ms'",
    )
    parser.add_argument("--history-ttl", type=float, default=5.0)
    parser.add_argument(
        "--lease",
        type=float,
        default=5.0,
        help="dispatch lease (s); after the last run the test waits this "
        "long + 2 s for duplicates (a lease that expired re-publishes)",
    )
    parser.add_argument("--redis-url", help="use this server (flushed) instead of starting one")
    parser.add_argument(
        "--store",
        choices=("redis", "postgres", "pgbouncer"),
        default="redis",
        help="where the windows live: Redis, a private PostgreSQL, or that PostgreSQL "
        "through PgBouncer in transaction mode",
    )
    opts = parser.parse_args()

    sys.path.insert(0, str(HERE.parent))
    from celery_debounce.testing.servers import LocalRedis

    servers: list[Any] = []
    url = opts.redis_url
    if url is None:
        servers.append(LocalRedis().start())
        url = servers[-1].url
    store_url = listen_url = direct_url = None
    if opts.store != "redis":
        from celery_debounce.testing.pgbouncer import LocalPgBouncer
        from celery_debounce.testing.postgres import LocalPostgres

        servers.append(LocalPostgres().start())
        direct_url = store_url = servers[-1].url()
        if opts.store == "pgbouncer":
            listen_url = direct_url
            servers.append(LocalPgBouncer(servers[-1]).start())
            store_url = servers[-1].url()
    env = dict(
        LOAD_REDIS=url,
        LOAD_STORE_URL=store_url or "",
        LOAD_LISTEN_URL=listen_url or "",
        LOAD_HISTORY_TTL=str(opts.history_ttl),
        LOAD_LEASE=str(opts.lease),
        PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    )
    env = {k: v for k, v in env.items() if v}
    full_env = dict(os.environ, **env)
    procs: list[subprocess.Popen[bytes]] = []
    logs = HERE / "logs"
    logs.mkdir(exist_ok=True)
    try:
        windows = redis.Redis.from_url(f"{url}/0")
        runs = redis.Redis.from_url(f"{url}/3")
        windows.flushall()
        celery = [sys.executable, "-m", "celery", "-A", "app"]
        if direct_url is not None:
            migrate_env = dict(full_env, LOAD_STORE_URL=direct_url)
            subprocess.run([*celery, "debounce", "migrate"], cwd=HERE, env=migrate_env, check=True)
        baseline = left_in_store(direct_url, windows)
        with (
            (logs / "worker.log").open("wb") as w_log,
            (logs / "dispatcher.log").open("wb") as d_log,
        ):
            # process 1: a worker (prefork, 2 children) + its embedded dispatcher;
            # process 2: a standalone dispatcher
            procs.append(
                subprocess.Popen(
                    [
                        *celery,
                        "worker",
                        "--pool",
                        "prefork",
                        "-c",
                        "2",
                        "--loglevel",
                        "WARNING",
                        "--without-gossip",
                        "--without-mingle",
                        "--without-heartbeat",
                    ],
                    cwd=HERE,
                    env=full_env,
                    stdout=w_log,
                    stderr=subprocess.STDOUT,
                )
            )
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "from app import app\nfrom celery_debounce import "
                        "Dispatcher\nDispatcher(app, name='standalone').run()",
                    ],
                    cwd=HERE,
                    env=full_env,
                    stdout=d_log,
                    stderr=subprocess.STDOUT,
                )
            )
        time.sleep(3)
        worker_pid, dispatcher_pid = procs[0].pid, procs[1].pid
        total = opts.producers * opts.calls
        rate = f", at most {opts.rate:g} calls/s each" if opts.rate else ""
        print(
            f"{opts.producers} producers x {opts.calls} calls over {opts.keys} keys{rate} "
            f"(debounce 200ms, max wait {MAX_WAIT_MS}ms), 2 dispatchers, worker prefork -c 2, "
            f"windows in {opts.store}"
        )
        cpu0 = {"dispatcher": cpu_times(dispatcher_pid), "worker": cpu_times(worker_pid)}
        t0 = time.time()
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(opts.producers) as pool:
            batches = pool.starmap(
                produce, [(env, i, opts.calls, opts.keys, opts.rate) for i in range(opts.producers)]
            )
        produce_s = time.time() - t0
        cpu_produce = {"dispatcher": cpu_times(dispatcher_pid), "worker": cpu_times(worker_pid)}
        calls = [c for b in batches for c in b]
        ids = {c[0] for c in calls}
        print(f"calls: {total} in {produce_s:.1f}s ({total / produce_s:,.0f} calls/s)")
        deadline = time.time() + 900
        while time.time() < deadline:
            if runs.hlen("load:runs") >= len(ids):
                break
            time.sleep(0.5)
        drain_s = time.time() - t0
        # A duplicate comes from a lease that expired (a publish not confirmed): wait
        # past one lease after the last run so that any of them has shown up.
        time.sleep(opts.lease + 2)
        cpu1 = {"dispatcher": cpu_times(dispatcher_pid), "worker": cpu_times(worker_pid)}
        counts = {k.decode(): int(v) for k, v in runs.hgetall("load:runs").items()}
        published_at = {k.decode(): int(v) for k, v in runs.hgetall("load:published").items()}
        claimed_at = {k.decode(): int(v) for k, v in runs.hgetall("load:claimed").items()}
        # per window: (deadline, ceiling), from its calls' times in the store
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for window, at in calls:
            first[window] = min(first.get(window, at), at)
            last[window] = max(last.get(window, at), at)
        due = {
            w: (min(last[w] + DEBOUNCE_MS, first[w] + MAX_WAIT_MS), first[w] + MAX_WAIT_MS)
            for w in first
        }
        never = [c for c in calls if c[0] not in counts]
        dupes = {i: n for i, n in counts.items() if n > 1}
        early = [c for c in calls if c[0] in claimed_at and claimed_at[c[0]] < c[1]]
        print(f"windows opened: {len(ids)}  (calls coalesced per window: {total / len(ids):.1f})")
        print(
            f"runs: {sum(counts.values())}  windows run: {len(counts)}  "
            f"duplicate runs: {sum(n - 1 for n in dupes.values())}"
        )
        print(f"calls whose window never ran: {len(never)}")
        print(f"calls whose run started before the store saw the call: {len(early)}")
        print(
            f"all calls drained in {drain_s:.1f}s (then waited {opts.lease + 2:g}s, "
            f"a {opts.lease:g}s lease + 2s, for duplicates)"
        )

        # a window whose publish was not seen (none here) counts by its run's start, later
        reached = {w: published_at.get(w, claimed_at.get(w)) for w in due}
        timed = [(*due[w], pa, claimed_at.get(w)) for w, pa in reached.items() if pa]
        forced = sum(1 for dl, mw, _, _ in timed if dl >= mw)
        over = sum(1 for _, mw, pa, _ in timed if pa > mw + opts.slack)
        print(
            f"windows whose message reached the broker later than max_wait_at + "
            f"{opts.slack}ms: {over} of {len(timed)} ({forced} were forced by max wait)"
        )
        print(
            "  broker time - max_wait_at (ms), windows forced by max wait: "
            + pct([pa - mw for dl, mw, pa, _ in timed if dl >= mw])
        )
        print(
            f"dispatch latency, deadline -> handed to the broker (ms): "
            f"{pct([pa - dl for dl, _, pa, _ in timed])}"
        )
        print(
            f"broker queue wait, published -> run started (ms): "
            f"{pct([ca - pa for _, _, pa, ca in timed if ca])}"
        )
        claims = sorted(claimed_at.values())
        if len(claims) > 1:
            span = (claims[-1] - claims[0]) / 1000
            print(
                f"worker throughput: {len(claims)} runs in {span:.1f}s "
                f"({len(claims) / max(span, 0.001):,.0f} runs/s)"
            )
        for name in ("dispatcher", "worker"):
            ran_p = cpu_produce[name][0] - cpu0[name][0]
            wait_p = cpu_produce[name][1] - cpu0[name][1]
            ran = cpu1[name][0] - cpu0[name][0]
            wait = cpu1[name][1] - cpu0[name][1]
            label = (
                "standalone dispatcher process"
                if name == "dispatcher"
                else "worker (parent + 2 children, embedded dispatcher)"
            )
            print(
                f"{label}: on a CPU {ran:.1f}s, runnable but waiting for a CPU {wait:.1f}s "
                f"(while producing: {ran_p:.1f}s / {wait_p:.1f}s in {produce_s:.1f}s)"
            )
        # invariants 2, 3 and 4: nothing lost, nothing early, nothing late, nothing twice
        ok = not never and not early and not dupes and not over
        t1 = time.time()
        while (
            time.time() < t1 + opts.history_ttl + 30
            and left_in_store(direct_url, windows) > baseline
        ):
            time.sleep(0.5)
        left = left_in_store(direct_url, windows)
        what = "package keys" if direct_url is None else "window rows"
        print(
            f"{what} after history TTL: {left} (baseline {baseline}) after {time.time() - t1:.1f}s"
        )
        if left != baseline and direct_url is None:
            print("  left: " + ", ".join(package_keys(windows)[:10]))
        ok = ok and left == baseline
        if not ok:
            failed = [
                what
                for what, bad in (
                    ("calls lost", never),
                    ("runs before their call", early),
                    ("duplicate runs", dupes),
                    (f"windows past max_wait_at + {opts.slack}ms", over),
                    (f"{what} left", left != baseline),
                )
                if bad
            ]
            print("FAILED: " + ", ".join(failed))
        else:
            print("OK")
        return 0 if ok else 1
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for server in reversed(servers):
            server.cleanup()


if __name__ == "__main__":
    sys.exit(main())
