"""BullMQ's debounce-mode ``add`` against ours, side by side on one redis-server.

``python -m bench.bullmq`` (or ``python -m bench --only bullmq``) installs
``bullmq@5`` and ``ioredis`` with npm into ``.bench-cache/bullmq`` (gitignored;
reused while ``package.json`` there is unchanged), starts a fresh redis-server,
and runs two sequential producers against it in interleaved rounds: ours
(``.delay()`` of ``bench.debounced``, a 1 h window) and BullMQ's
(``bench/peer/bullmq_producer.js``: ``queue.add`` with ``delay`` and
``deduplication: {id, ttl, extend: true, replace: true}``, a 1 h delay), each for
a hot key (every call joins one window) and a new key per call. The Node process
stays up between rounds, so neither side pays its start-up in a round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis

from bench.harness import Row, compare, table

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench-cache" / "bullmq"
SCRIPT = Path(__file__).resolve().parent / "peer" / "bullmq_producer.js"
PACKAGES = {"bullmq": "^5", "ioredis": "^5"}
#: DB of BullMQ's keys (ours: windows in 0, broker in 1, stats in 3)
BULLMQ_DB = 4
TARGET = 1.2
#: calls of each subject before the rounds (Node's first thousands of calls are slower)
WARM = 2000


def install(cache: Path = CACHE) -> Path:
    """npm-install the peer into ``cache`` (once); return the folder."""
    manifest = {"name": "celery-debounce-bench-peer", "private": True,
                "dependencies": PACKAGES}
    wanted = json.dumps(manifest, indent=2, sort_keys=True)
    package = cache / "package.json"
    if (package.exists() and package.read_text() == wanted
            and (cache / "node_modules" / "bullmq").is_dir()):
        return cache
    if shutil.which("npm") is None or shutil.which("node") is None:
        raise RuntimeError("the BullMQ row needs node and npm on PATH")
    cache.mkdir(parents=True, exist_ok=True)
    package.write_text(wanted)
    subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
                   cwd=cache, check=True, timeout=600)
    return cache


def bullmq_version(cache: Path = CACHE) -> str:
    data = json.loads((cache / "node_modules" / "bullmq" / "package.json").read_text())
    return str(data["version"])


class BullMQProducer:
    """The Node producer, kept running; ``run(mode, n)`` returns its seconds."""

    def __init__(self, url: str, cache: Path) -> None:
        parsed = urlparse(url)
        env = {**os.environ, "NODE_PATH": str(cache / "node_modules"),
               "BENCH_REDIS_HOST": parsed.hostname or "127.0.0.1",
               "BENCH_REDIS_PORT": str(parsed.port or 6379),
               "BENCH_REDIS_DB": str(BULLMQ_DB)}
        self.proc = subprocess.Popen(
            ["node", str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env, cwd=cache, text=True, bufsize=1)
        self._read()  # {"ready": true}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the BullMQ producer exited ({self.proc.wait()})")
        return dict(json.loads(line))

    def run(self, mode: str, n: int) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{mode} {n}\n")
        self.proc.stdin.flush()
        return float(self._read()["seconds"])

    def close(self) -> None:
        if self.proc.stdin is not None and self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def side_by_side(app: Any, url: str, rounds: int, n: int,
                 cache: Path | None = None) -> list[Row]:
    """Interleaved rounds: ours hot, BullMQ hot, ours new, BullMQ new, ... (rates)."""
    cache = install() if cache is None else cache
    debounced = app.tasks["bench.debounced"]
    fresh = iter(range(10**12))
    peer = BullMQProducer(url, cache)
    windows = redis.Redis.from_url(f"{url}/0")
    jobs = redis.Redis.from_url(f"{url}/{BULLMQ_DB}")
    try:
        def ours_hot(k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                debounced.delay("hot", n=1)
            return time.perf_counter() - start

        def ours_new(k: int) -> float:
            start = time.perf_counter()
            for _ in range(k):
                debounced.delay(f"n{next(fresh)}", n=1)
            return time.perf_counter() - start

        subjects: dict[str, Callable[[int], float]] = {
            "ours_hot": ours_hot, "bull_hot": lambda k: peer.run("hot", k),
            "ours_new": ours_new, "bull_new": lambda k: peer.run("new", k),
        }
        debounced.delay("hot", n=1)  # open the hot window (BullMQ's opened at start)
        for mode in ("hot", "new"):  # warm both (V8's JIT, script caches, allocators)
            subjects[f"ours_{mode}"](WARM)
            peer.run(mode, WARM)
        out: dict[str, list[float]] = {name: [] for name in subjects}
        for i in range(rounds):
            # alternate who goes first, so a load spike is not always on one side
            order = list(subjects) if i % 2 == 0 else [
                "bull_hot", "ours_hot", "bull_new", "ours_new"]
            for name in order:
                out[name].append(n / subjects[name](n))
        version = bullmq_version(cache)
    finally:
        peer.close()
        windows.flushdb()
        jobs.flushdb()

    def ratios(a: str, b: str) -> str:
        per = [x / y for x, y in zip(out[a], out[b], strict=True)]
        return (f"median of per-round ratios {statistics.median(per):.2f}; per round "
                + ", ".join(f"{r:.2f}" for r in per))

    label = f"BullMQ {version} debounce add"
    return [
        compare("9", "hot key .delay() vs BullMQ", out["ours_hot"], label, out["bull_hot"],
                TARGET, note=ratios("ours_hot", "bull_hot")),
        compare("9", "new key per call .delay() vs BullMQ", out["ours_new"], label,
                out["bull_new"], TARGET, note=ratios("ours_new", "bull_new")),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.bullmq", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=4000, help="calls per round")
    parser.add_argument("--json", action="store_true", help="print JSON rows")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.apps import make_app
    from celery_debounce.testing.servers import LocalRedis

    cache = install()
    with LocalRedis() as server:
        rows = side_by_side(make_app(server.url), server.url, args.rounds, args.calls, cache)
    if args.json:
        print(json.dumps([r.as_json() for r in rows], indent=2))
    else:
        print(table(rows))
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
