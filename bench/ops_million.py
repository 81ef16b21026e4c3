"""Operator commands against 1,000,000 open windows (docs/operations.md, "Scale").

Usage: python bench/ops_million.py [redis://127.0.0.1:6399]   (FLUSHES that server)

Creates the windows with gate.lua itself, pipelined (the same writes a producer
makes), then times each operation through the real ``celery`` command (wall
time of the whole process, start-up included) and through the Python API
(in-process), and reads Redis's SLOWLOG for the longest single script run.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

from celery_debounce.store.idents import window_ident

URL = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6399"
N = int(os.environ.get("OPS_BENCH_WINDOWS", "1000000"))
TASKS = [("app.tasks.index", 0.989), ("app.tasks.report", 0.01), ("app.tasks.rare", 0.001)]

APP = f'''
from celery import Celery
app = Celery("benchapp", broker="{URL}/1", backend="{URL}/2")
app.conf.debounce_redis_url = "{URL}/0"
'''


def populate(client: redis.Redis) -> None:
    from celery_debounce.store import script_source

    gate = client.register_script(script_source("gate"))
    rng = random.Random(7)
    start = time.perf_counter()
    tag = "debounce:{0}"
    counts = {name: 0 for name, _ in TASKS}
    with client.pipeline(transaction=False) as pipe:
        for i in range(N):
            roll = rng.random()
            task = (
                TASKS[0][0]
                if roll < TASKS[0][1]
                else (TASKS[1][0] if roll < TASKS[0][1] + TASKS[1][1] else TASKS[2][0])
            )
            counts[task] += 1
            key = f"user:{i}"
            ident = window_ident(task, key)
            window_ms = rng.randint(10_000, 3_600_000)
            gate(
                keys=[f"{tag}:open:{ident}", f"{tag}:due"],
                args=[
                    str(uuid.uuid4()),
                    window_ms,
                    7_200_000,
                    0,
                    "application/json",
                    f'[["{key}"], {{}}]',
                    "{}",
                ],
                client=pipe,
            )
            if i % 2000 == 1999:
                pipe.execute()
        pipe.execute()
    took = time.perf_counter() - start
    print(f"created {N:,} windows in {took:.1f}s ({N / took:,.0f}/s); per task {counts}")
    print(f"used_memory: {client.info('memory')['used_memory_human']}")


def median_time(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    client = redis.Redis.from_url(f"{URL}/0")
    client.flushall()
    populate(client)
    workdir = Path(tempfile.mkdtemp())
    (workdir / "benchapp.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(workdir)}

    def cli(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "benchapp", "debounce", *args],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout

    sys.path.insert(0, str(workdir))
    from benchapp import app

    from celery_debounce import DebounceAdmin

    admin = DebounceAdmin(app)
    rare = admin.windows(task="app.tasks.rare", limit=1)[0]
    report = admin.windows(task="app.tasks.report", limit=1)[0]
    baseline = median_time(lambda: cli("--help"))
    print(f"\n`celery -A benchapp debounce --help` (process start-up): {baseline:.2f}s\n")
    cases = [
        ("inspect --limit 20", ("inspect", "--limit", "20"), lambda: admin.windows(limit=20)),
        (
            "inspect --task app.tasks.index --limit 20 (98.9%)",
            ("inspect", "--task", "app.tasks.index", "--limit", "20"),
            lambda: admin.windows(task="app.tasks.index", limit=20),
        ),
        (
            "inspect --task app.tasks.report --limit 20 (1%)",
            ("inspect", "--task", "app.tasks.report", "--limit", "20"),
            lambda: admin.windows(task="app.tasks.report", limit=20),
        ),
        (
            "inspect --task app.tasks.rare --limit 20 (0.1%)",
            ("inspect", "--task", "app.tasks.rare", "--limit", "20"),
            lambda: admin.windows(task="app.tasks.rare", limit=20),
        ),
        (
            "inspect --task app.tasks.rare (all ~1,000, no limit)",
            ("inspect", "--task", "app.tasks.rare", "--json"),
            lambda: admin.windows(task="app.tasks.rare"),
        ),
        (
            "inspect --match 'user:4242*' --limit 20 (12 matches)",
            ("inspect", "--match", "user:4242*", "--limit", "20"),
            lambda: admin.windows(key_glob="user:4242*", limit=20),
        ),
        (
            "inspect --id <pending id> (scan)",
            ("inspect", "--id", rare.task_id),
            lambda: admin.find(rare.task_id),
        ),
        (
            "flush --task T --key K (one HMGET + flush.lua)",
            ("flush", "--task", "app.tasks.report", "--key", report.key),
            lambda: admin.window("app.tasks.report", report.key),
        ),
        ("stats --quick", ("stats", "--quick"), lambda: admin.stats(census=False)),
        ("stats (census of every open window)", ("stats",), lambda: admin.stats()),
    ]
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", 100000)
    print("| operation | `celery ... debounce` wall time | API in-process |")
    print("|---|---|---|")
    for label, args, api in cases:
        wall = median_time(lambda args=args: cli(*args), repeat=3)
        inproc = median_time(api, repeat=3)
        print(f"| `{label}` | {wall:.2f}s | {inproc * 1000:,.0f} ms |")
    longest = max(
        (e["duration"] for e in client.slowlog_get(100000) if e["command"].startswith(b"EVALSHA")),
        default=0,
    )
    client.config_set("slowlog-log-slower-than", 10000)
    print(f"\nlongest single EVALSHA (SLOWLOG): {longest / 1000:.1f} ms")

    # The listing the CLI had before this change: whole due set + HMGET of every window.
    start = time.perf_counter()
    idents = client.zrange("debounce:{0}:due", 0, -1)
    with client.pipeline(transaction=False) as pipe:
        for i in range(0, len(idents), 500):
            for ident in idents[i : i + 500]:
                pipe.hmget(b"debounce:{0}:open:" + ident, "id", "fs", "mw", "n")
            pipe.execute()
    print(
        f"previous approach (ZRANGE 0 -1 + HMGET all), any --limit: "
        f"{time.perf_counter() - start:.2f}s"
    )


if __name__ == "__main__":
    main()
