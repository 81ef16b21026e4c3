"""``python -m bench.cluster``: Redis Cluster against a single node, side by side, one run.

Starts a single redis-server, a local 3-master, 3-replica cluster (and a 3-master one
without replicas), then measures:

* C1: the hot call (``.delay()`` joining an open window), windows on the cluster
  (6 shards) against windows on the single node (goal >= 0.8x);
* C1b: the same with ``debounce_redis_wait_replicas=1``; C1c: on 3 masters without
  replicas (a second local cluster), to see where C1's difference goes;
* C2: with 6 shards on 3 masters, the spread of window keys and of EVALSHA ``usec``
  (``INFO commandstats``) over the masters (goal: each within 20% of an even share);
* C3: gate throughput from 4 producer processes (new windows, then joins), cluster
  against single node.

The broker is the single node in both cases (it only matters for C3's plain calls,
which are not measured).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import Any

import redis
from celery import Celery

from bench.apps import make_app
from bench.harness import Row, compare, interleaved, table
from celery_debounce.testing.redis_cluster import LocalCluster
from celery_debounce.testing.servers import LocalRedis

SHARDS = 6


def _apps(single: str, cluster: str, bare: str) -> dict[str, Celery]:
    on_cluster = {"debounce_redis_url": f"{cluster}/0", "debounce_redis_cluster": True}
    return {
        "cluster, no replicas": make_app(
            single,
            debounce_dispatcher=False,
            debounce_shards=SHARDS,
            debounce_redis_cluster=True,
            debounce_redis_url=f"{bare}/0",
        ),
        "single": make_app(single, debounce_dispatcher=False, debounce_shards=SHARDS),
        "cluster": make_app(
            single, debounce_dispatcher=False, debounce_shards=SHARDS, **on_cluster
        ),
        "cluster+wait": make_app(
            single,
            debounce_dispatcher=False,
            debounce_shards=SHARDS,
            debounce_redis_wait_replicas=1,
            **on_cluster,
        ),
    }


def hot_call(apps: dict[str, Celery], rounds: int, n: int) -> list[Row]:
    tasks = {name: app.tasks["bench.debounced"] for name, app in apps.items()}
    for task in tasks.values():
        task.delay("hot")  # open the window, load the script

    def run(task: Any) -> Any:
        def go(count: int) -> None:
            delay = task.delay
            for _ in range(count):
                delay("hot")

        return go

    rates = interleaved(rounds, n, {name: run(t) for name, t in tasks.items()})
    return [
        compare(
            "C1",
            "hot call .delay(), windows on the cluster (6 shards)",
            rates["cluster"],
            "single node",
            rates["single"],
            0.8,
        ),
        compare(
            "C1b",
            "same, debounce_redis_wait_replicas=1 (EVALSHA + WAIT 1)",
            rates["cluster+wait"],
            "cluster",
            rates["cluster"],
            None,
        ),
        compare(
            "C1c",
            "same on a cluster of 3 masters without replicas",
            rates["cluster, no replicas"],
            "single node",
            rates["single"],
            None,
            note="where C1's gap goes: replication to the replicas on the same 2 cores",
        ),
    ]


def spread(app: Celery, cluster: LocalCluster, calls: int) -> list[Row]:
    masters = cluster.master_ports()
    clients = {port: redis.Redis(port=port) for port in masters}
    for client in clients.values():
        client.config_resetstat()
    task = app.tasks["bench.debounced"]
    for i in range(calls):
        task.delay(f"s{i}")
    keys = {port: c.dbsize() for port, c in clients.items()}
    usec = {
        port: c.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0)
        for port, c in clients.items()
    }
    rows = []
    for label, per in (("window keys", keys), ("EVALSHA usec", usec)):
        total = sum(per.values())
        shares = [v / total * len(per) for v in per.values()]  # 1.0 = even share
        row = Row("C2", f"{label} per master (share of an even split)", "x even", shares)
        row.target = "each in [0.8, 1.2]"
        row.passed = all(0.8 <= s <= 1.2 for s in shares)
        row.note = ", ".join(f"{port}: {v:,}" for port, v in per.items())
        rows.append(row)
    return rows


def _producer(url: str, cluster: bool, start: Any, index: int, n: int, out: Any) -> None:
    conf: dict[str, Any] = {"debounce_dispatcher": False, "debounce_shards": SHARDS}
    if cluster:
        conf.update(debounce_redis_url=f"{url}/0", debounce_redis_cluster=True)
        app = make_app(out_broker[0], **conf)
    else:
        app = make_app(url, **conf)
    task = app.tasks["bench.debounced"]
    task.delay(f"warm{index}")
    start.wait()
    began = time.perf_counter()
    for i in range(n):
        task.delay(f"p{index}:{i % 500}")  # 500 windows per producer: opens, then joins
    out.put(time.perf_counter() - began)


out_broker: list[str] = [""]


def throughput(single: str, cluster: str, n: int, rounds: int) -> Row:
    ctx = multiprocessing.get_context("fork")
    out_broker[0] = single

    def once(url: str, is_cluster: bool) -> float:
        start = ctx.Event()
        results = ctx.Queue()
        procs = [
            ctx.Process(target=_producer, args=(url, is_cluster, start, i, n, results))
            for i in range(4)
        ]
        for p in procs:
            p.start()
        time.sleep(1.0)  # every producer connected and warm
        start.set()
        times = [results.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(30)
        return 4 * n / max(times)

    samples: dict[str, list[float]] = {"single": [], "cluster": []}
    for _ in range(rounds):
        samples["single"].append(once(single, False))
        samples["cluster"].append(once(cluster, True))
    return compare(
        "C3",
        "gate calls/s from 4 producer processes, cluster",
        samples["cluster"],
        "single node",
        samples["single"],
        None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    args = parser.parse_args()
    rounds, n = (3, 1000) if args.quick else (5, 3000)
    with (
        LocalRedis() as single,
        LocalCluster(masters=3, replicas=1) as cluster,
        LocalCluster(masters=3, replicas=0) as bare,
    ):
        apps = _apps(single.url, cluster.url, bare.url)
        rows = hot_call(apps, rounds, n)
        del apps["cluster, no replicas"]
        rows += spread(apps["cluster"], cluster, 3000 if args.quick else 12000)
        del apps["cluster+wait"]
        rows.append(
            throughput(
                single.url, cluster.url, 1000 if args.quick else 3000, 2 if args.quick else 3
            )
        )
    print(table(rows))
    print(
        f"\nhot call medians: single {statistics.median(rows[0].extra['baseline_samples']):,.0f}"
        f" calls/s, cluster {rows[0].median:,.0f} calls/s"
    )


if __name__ == "__main__":
    main()
