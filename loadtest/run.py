"""Load test: N producer processes x M calls over K keys, 2 dispatchers, a real worker.

    python loadtest/run.py                 # 8 x 10,000 calls over 1,000 keys
    python loadtest/run.py --calls 2000    # scaled down

Starts its own redis-server (LocalRedis) unless --redis-url is given (it FLUSHES
that server). Checks, for every call: its window ran (never lost), the run
started after the call began, and no later than the window's first call + max
wait + dispatch latency (reported). Then waits for the history TTL and checks
that the package's keyspace is back to its baseline.
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

import redis

HERE = Path(__file__).resolve().parent
MAX_WAIT_MS = 1000


def produce(redis_url: str, seed: int, calls: int, keys: int) -> list[tuple[str, float, float]]:
    os.environ["LOAD_REDIS"] = redis_url
    sys.path.insert(0, str(HERE))
    from app import touch

    rng = random.Random(seed)
    out = []
    for seq in range(calls):
        key = f"key{rng.randrange(keys)}"
        start = time.time() * 1000
        tid = touch.delay(key, seq).id
        out.append((tid, start, time.time() * 1000))
    return out


def package_keys(client: redis.Redis) -> int:
    return sum(1 for _ in client.scan_iter(match="debounce:*", count=1000))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=10_000, help="calls per producer")
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--history-ttl", type=float, default=5.0)
    parser.add_argument("--redis-url", help="use this server (flushed) instead of starting one")
    opts = parser.parse_args()

    sys.path.insert(0, str(HERE.parent))
    from celery_debounce.local_redis import LocalRedis

    server = None
    url = opts.redis_url
    if url is None:
        server = LocalRedis().start()
        url = server.url
    env = dict(os.environ, LOAD_REDIS=url, LOAD_HISTORY_TTL=str(opts.history_ttl),
               PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    procs: list[subprocess.Popen[bytes]] = []
    logs = HERE / "logs"
    logs.mkdir(exist_ok=True)
    try:
        windows = redis.Redis.from_url(f"{url}/0")
        runs = redis.Redis.from_url(f"{url}/3")
        windows.flushall()
        baseline_keys = package_keys(windows)
        baseline_mem = windows.info("memory")["used_memory"]
        celery = [sys.executable, "-m", "celery", "-A", "app"]
        with (logs / "worker.log").open("wb") as w_log, \
                (logs / "dispatcher.log").open("wb") as d_log:
            # worker 1: solo pool + its embedded dispatcher; process 2: a dispatcher only
            procs.append(subprocess.Popen(
                [*celery, "worker", "--pool", "prefork", "-c", "2", "--loglevel", "WARNING",
                 "--without-gossip", "--without-mingle", "--without-heartbeat"],
                cwd=HERE, env=env, stdout=w_log, stderr=subprocess.STDOUT))
            procs.append(subprocess.Popen(
                [sys.executable, "-c", "from app import app\nfrom celery_debounce import "
                 "Dispatcher\nDispatcher(app, name='standalone').run()"],
                cwd=HERE, env=env, stdout=d_log, stderr=subprocess.STDOUT))
        time.sleep(3)
        total = opts.producers * opts.calls
        print(f"{opts.producers} producers x {opts.calls} calls over {opts.keys} keys "
              f"(debounce 200ms, max wait {MAX_WAIT_MS}ms), 2 dispatchers, worker prefork -c 2")
        t0 = time.time()
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(opts.producers) as pool:
            batches = pool.starmap(produce, [(url, i, opts.calls, opts.keys)
                                             for i in range(opts.producers)])
        produce_s = time.time() - t0
        calls = [c for b in batches for c in b]
        ids = {c[0] for c in calls}
        print(f"calls: {total} in {produce_s:.1f}s ({total / produce_s:,.0f} calls/s)")
        deadline = time.time() + 600
        while time.time() < deadline:
            if runs.hlen("load:runs") >= len(ids):
                break
            time.sleep(0.5)
        time.sleep(2)  # let late duplicates, if any, show up
        drain_s = time.time() - t0
        counts = {k.decode(): int(v) for k, v in runs.hgetall("load:runs").items()}
        starts = {k.decode(): float(v) for k, v in runs.hgetall("load:start").items()}
        never = [c for c in calls if c[0] not in counts]
        dupes = {i: n for i, n in counts.items() if n > 1}
        early = [c for c in calls if c[0] in starts and starts[c[0]] < c[1]]
        first_call: dict[str, float] = {}
        for tid, start, _ in calls:
            first_call[tid] = min(first_call.get(tid, start), start)
        late = sorted(starts[t] - (first_call[t] + MAX_WAIT_MS) for t in ids if t in starts)
        times = {k.decode(): [int(x) for x in v.split(b",")]
                 for k, v in runs.hgetall("load:times").items()}
        published = [t for t in times.values() if t[3]]
        taken_late = sorted(ta - dl for dl, _, ta, _ in published)
        publish_late = sorted(pa - dl for dl, _, _, pa in published)
        past_ceiling = sum(1 for _, mw, ta, _ in published if ta > mw)
        queue_wait = sorted(starts[i] - times[i][3] for i in times if times[i][3] and i in starts)
        print(f"windows opened: {len(ids)}  (calls coalesced per window: {total / len(ids):.1f})")
        print(f"runs: {sum(counts.values())}  windows run: {len(counts)}  "
              f"duplicate runs: {sum(n - 1 for n in dupes.values())}")
        print(f"calls whose window never ran: {len(never)}")
        print(f"calls whose run started before the call: {len(early)}")
        print("run start - (first call + max wait), ms: "
              f"p50 {statistics.median(late):.0f}  p99 {late[int(len(late) * 0.99)]:.0f}  "
              f"max {late[-1]:.0f}  (negative: ran before the ceiling)")
        print(f"all calls drained in {drain_s:.1f}s")

        def pct(xs: list[float]) -> str:
            return (f"p50 {statistics.median(xs):.0f}  p99 {xs[int(len(xs) * 0.99)]:.0f}  "
                    f"max {xs[-1]:.0f}")

        print(f"dispatch latency, deadline -> taken (ms): {pct(taken_late)}")
        print(f"dispatch latency, deadline -> handed to the broker (ms): {pct(publish_late)}")
        print(f"windows taken after their max-wait ceiling: {past_ceiling} "
              "(those are the ones dispatch latency made late)")
        print(f"broker queue wait, published -> run start (ms): {pct(queue_wait)}")
        ok = not never and not early and not dupes
        t1 = time.time()
        while time.time() < t1 + opts.history_ttl + 30 and package_keys(windows) > baseline_keys:
            time.sleep(0.5)
        left = package_keys(windows)
        mem = windows.info("memory")["used_memory"]
        print(f"package keys after history TTL: {left} (baseline {baseline_keys}) after "
              f"{time.time() - t1:.1f}s; used_memory {mem:,} B (baseline {baseline_mem:,} B)")
        ok = ok and left == baseline_keys
        print("OK" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    sys.exit(main())
