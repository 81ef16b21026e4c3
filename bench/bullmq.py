"""BullMQ's debounce-mode ``add`` against our producers, side by side on one redis-server.

``python -m bench.bullmq`` (or ``python -m bench --only bullmq``) installs
``bullmq@6``, ``ioredis`` and ``pg`` (for row 12g's PostgreSQL backend) with npm into
``.bench-cache/bullmq`` (gitignored; reused while ``package.json`` there is unchanged),
with our Node producer (``clients/node``, built and packed by its own ``npm pack``,
installed from the tarball, named by its content), starts a fresh redis-server, and
runs three sequential producers against it in interleaved rounds: ours in Python
(``.delay()`` of ``bench.debounced``, a 1 h window), ours in Node
(``bench/peer/node_producer.js``: ``debounce()`` of the same task, window, ceiling
and key, on one ioredis client) and BullMQ's (``bench/peer/bullmq_producer.js``:
``queue.add`` with ``delay`` and ``deduplication: {id, ttl, extend: true,
replace: true}``, a 1 h delay), each for a hot key (every call joins one window)
and a new key per call. The Node processes stay up between rounds, so no side pays
its start-up in a round; which producer goes first rotates every round.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import redis

from bench.harness import Row, compare, table

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench-cache" / "bullmq"
PEER = Path(__file__).resolve().parent / "peer"
SCRIPT = PEER / "bullmq_producer.js"
NODE_SCRIPT = PEER / "node_producer.js"
CLIENT = ROOT / "clients" / "node"
PACKAGES = {"bullmq": "^6", "ioredis": "^5", "pg": "^8"}
#: DBs of BullMQ's keys and of the Node producer's windows (ours: windows in 0,
#: broker in 1, stats in 3)
BULLMQ_DB = 4
NODE_DB = 5
TARGET = 1.2
#: calls of each subject before the rounds (Node's first thousands of calls are slower)
WARM = 2000
PRODUCERS = ("ours", "bull", "node")


def _npm(args: list[str], cwd: Path) -> None:
    subprocess.run(
        ["npm", *args, "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=cwd,
        check=True,
        timeout=600,
        stdout=subprocess.DEVNULL,
    )


def pack_client(cache: Path) -> str:
    """``npm pack`` of clients/node (its prepack script builds it) into ``cache/pkg``,
    named by its content, so that a changed client is installed again; the npm spec."""
    if not (CLIENT / "node_modules" / "typescript").is_dir():
        _npm(["ci"], CLIENT)  # the build's own dev dependencies
    pkg = cache / "pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _npm(["pack", "--pack-destination", tmp], CLIENT)
        (tarball,) = Path(tmp).glob("*.tgz")
        name = f"celery-debounced-{hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]}.tgz"
        if not (pkg / name).exists():
            shutil.copyfile(tarball, pkg / name)
    for old in pkg.glob("*.tgz"):
        if old.name != name:
            old.unlink()
    return f"file:pkg/{name}"


def install(cache: Path = CACHE) -> Path:
    """npm-install the peers into ``cache`` (again when a version or the client changed);
    return the folder."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        raise RuntimeError("the BullMQ row needs node and npm on PATH")
    dependencies = {**PACKAGES, "celery-debounced": pack_client(cache)}
    manifest = {"name": "celery-debounce-bench-peer", "private": True, "dependencies": dependencies}
    wanted = json.dumps(manifest, indent=2, sort_keys=True)
    package = cache / "package.json"
    if (
        package.exists()
        and package.read_text() == wanted
        and (cache / "node_modules" / "bullmq").is_dir()
        and (cache / "node_modules" / "celery-debounced").is_dir()
    ):
        return cache
    package.write_text(wanted)
    _npm(["install"], cache)
    return cache


def bullmq_version(cache: Path = CACHE) -> str:
    data = json.loads((cache / "node_modules" / "bullmq" / "package.json").read_text())
    return str(data["version"])


class NodeProducer:
    """A Node producer script, kept running; ``run(mode, n)`` returns its seconds."""

    def __init__(
        self, script: Path, url: str, cache: Path, db: int, env: dict[str, str] | None = None
    ) -> None:
        parsed = urlparse(url)
        env = {
            **os.environ,
            "NODE_PATH": str(cache / "node_modules"),
            "BENCH_REDIS_HOST": parsed.hostname or "127.0.0.1",
            "BENCH_REDIS_PORT": str(parsed.port or 6379),
            "BENCH_REDIS_DB": str(db),
            **(env or {}),
        }
        self.name = script.name
        self.proc = subprocess.Popen(
            ["node", str(script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=cache,
            text=True,
            bufsize=1,
        )
        self._read()  # {"ready": true}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited ({self.proc.wait()})")
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


def side_by_side(app: Any, url: str, rounds: int, n: int, cache: Path | None = None) -> list[Row]:
    """Interleaved rounds of the three producers, hot key then new key (rates); the
    producer that goes first rotates every round."""
    cache = install() if cache is None else cache
    debounced = app.tasks["bench.debounced"]
    fresh = iter(range(10**12))
    peers: list[NodeProducer] = []
    try:
        bull = NodeProducer(SCRIPT, url, cache, BULLMQ_DB)
        peers.append(bull)
        node = NodeProducer(NODE_SCRIPT, url, cache, NODE_DB)
        peers.append(node)

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
            "ours_hot": ours_hot,
            "ours_new": ours_new,
            "bull_hot": lambda k: bull.run("hot", k),
            "bull_new": lambda k: bull.run("new", k),
            "node_hot": lambda k: node.run("hot", k),
            "node_new": lambda k: node.run("new", k),
        }
        debounced.delay("hot", n=1)  # open the hot window (the Node ones opened at start)
        for name in subjects:  # warm all (V8's JIT, script caches, allocators)
            subjects[name](WARM)
        out: dict[str, list[float]] = {name: [] for name in subjects}
        for i in range(rounds):
            # rotate who goes first, so a load spike is not always on one side
            order = PRODUCERS[i % 3 :] + PRODUCERS[: i % 3]
            for mode in ("hot", "new"):
                for producer in order:
                    name = f"{producer}_{mode}"
                    out[name].append(n / subjects[name](n))
        version = bullmq_version(cache)
    finally:
        for peer in peers:
            peer.close()
        for db in (0, BULLMQ_DB, NODE_DB):
            redis.Redis.from_url(f"{url}/{db}").flushdb()

    def ratios(a: str, b: str) -> str:
        per = [x / y for x, y in zip(out[a], out[b], strict=True)]
        return f"median of per-round ratios {statistics.median(per):.2f}; per round " + ", ".join(
            f"{r:.2f}" for r in per
        )

    label = f"BullMQ {version} debounce add"
    return [
        compare(
            "9",
            "hot key .delay() vs BullMQ",
            out["ours_hot"],
            label,
            out["bull_hot"],
            TARGET,
            note=ratios("ours_hot", "bull_hot"),
        ),
        compare(
            "9",
            "new key per call .delay() vs BullMQ",
            out["ours_new"],
            label,
            out["bull_new"],
            TARGET,
            note=ratios("ours_new", "bull_new"),
        ),
        compare(
            "9",
            "hot key Node debounce() vs BullMQ",
            out["node_hot"],
            label,
            out["bull_hot"],
            TARGET,
            note=ratios("node_hot", "bull_hot")
            + "; Node/Python "
            + ratios("node_hot", "ours_hot").split(";")[0],
        ),
        compare(
            "9",
            "new key per call Node debounce() vs BullMQ",
            out["node_new"],
            label,
            out["bull_new"],
            TARGET,
            note=ratios("node_new", "bull_new")
            + "; Node/Python "
            + ratios("node_new", "ours_new").split(";")[0],
        ),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.bullmq", description=__doc__)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds")
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
