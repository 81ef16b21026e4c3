"""The app the cluster fault tests run in subprocesses (a dispatcher that gets killed).

Windows on the Redis Cluster at $CLUSTER_REDIS (``debounce_redis_cluster=True``, 6
shards), broker in DB 1 of the single redis-server at $CLUSTER_BROKER; every run
appends its task id to the list ``runs:<key>`` in DB 3 of that server.

    python cluster_app.py take     take every due window of every shard (leasing it),
                                   print their ids, then hang until killed
"""

from __future__ import annotations

import os
import sys
import time

import redis
from celery import Celery

from celery_debounce import DebouncedTask


def build(cluster_url: str, broker_url: str, **conf: object) -> Celery:
    app = Celery("cluster_app", set_as_current=False)
    app.conf.update(
        broker_url=f"{broker_url}/1",
        task_ignore_result=True,
        debounce_redis_url=f"{cluster_url}/0",
        debounce_redis_cluster=True,
        debounce_shards=6,
        debounce_poll_interval=0.2,
        debounce_dispatch_lease=1.0,
        debounce_redis_timeout=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.conf.update(conf)

    @app.task(
        base=DebouncedTask,
        name="cluster.record",
        bind=True,
        shared=False,
        debounce="200ms",
        debounce_key="k:{0}",
        debounce_max_wait="2s",
    )
    def record(self: DebouncedTask, key: str) -> str:
        client = redis.Redis.from_url(f"{broker_url}/3", socket_timeout=2)
        client.rpush(f"runs:{key}", self.request.id)
        client.close()
        return key

    return app


app = build(
    os.environ.get("CLUSTER_REDIS", "redis://127.0.0.1:7000"),
    os.environ.get("CLUSTER_BROKER", "redis://127.0.0.1:6379"),
)


if __name__ == "__main__" and sys.argv[1:2] == ["take"]:
    from celery_debounce.store import store_for

    store = store_for(app)
    taken = [w.task_id for shard in range(6) for w in store.take(shard, 100).windows]
    print("TAKEN", *taken, flush=True)
    while True:
        time.sleep(1)
