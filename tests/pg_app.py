"""The app the PostgreSQL store's end-to-end tests run in real workers
(tests/system/test_postgres_e2e.py).

Configured from the environment: PG_STORE (``debounce_store_url``, a postgresql:// URL),
PG_BROKER (the broker URL: Redis or RabbitMQ), PG_QUEUE (the default queue), PG_RUNS (a
directory), PG_DISPATCHER ("0": no embedded dispatcher), PG_ACKS_LATE ("1": acks_late,
a 2 s visibility timeout on a Redis broker), PG_CLAIM_LEASE (seconds), PG_PREFIX
(``debounce_key_prefix``). Every run
appends one JSON line to ``<PG_RUNS>/runs.jsonl`` (its task id, key and ``n``) and,
while ``<PG_RUNS>/block-<key>`` exists, waits; a run of ``pg.collect`` (debounce_collect)
appends its task id, key and every call's ``n`` (``ns``). Nothing here needs Redis.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from celery import Celery

from celery_debounce import DebouncedCall, DebouncedTask

#: the debounce window and max wait of ``pg.record``
WINDOW_S = 0.3
MAX_WAIT_S = 1.5


def build(store_url: str, broker_url: str, runs: str, queue: str = "celery") -> Celery:
    app = Celery("pg_app", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        task_default_queue=queue,
        task_ignore_result=True,
        debounce_store_url=store_url,
        debounce_poll_interval=0.2,
        debounce_dispatch_lease=2.0,
        broker_connection_retry_on_startup=True,
        broker_heartbeat=2,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
    )

    @app.task(
        base=DebouncedTask,
        name="pg.record",
        bind=True,
        shared=False,
        debounce=WINDOW_S,
        debounce_key="k:{0}",
        debounce_max_wait=MAX_WAIT_S,
    )
    def record(self: DebouncedTask, key: str, n: int = 0) -> str:
        line = json.dumps({"id": self.request.id, "key": key, "n": n, "at": time.time()})
        with open(Path(runs) / "runs.jsonl", "a", encoding="utf-8") as out:
            out.write(line + "\n")
        while (Path(runs) / f"block-{key}").exists():
            time.sleep(0.05)
        return key

    @app.task(
        base=DebouncedTask,
        name="pg.collect",
        bind=True,
        shared=False,
        debounce=WINDOW_S,
        debounce_key="c:{0}",
        debounce_max_wait=MAX_WAIT_S,
        debounce_collect=True,
    )
    def collect(self: DebouncedTask, calls: list[DebouncedCall]) -> int:
        key = calls[0].args[0]
        ns = [c.args[1] for c in calls]
        line = json.dumps({"id": self.request.id, "key": key, "ns": ns, "at": time.time()})
        with open(Path(runs) / "runs.jsonl", "a", encoding="utf-8") as out:
            out.write(line + "\n")
        return len(calls)

    return app


app = build(
    os.environ.get("PG_STORE", "postgresql://localhost/postgres"),
    os.environ.get("PG_BROKER", "memory://"),
    os.environ.get("PG_RUNS", "."),
    os.environ.get("PG_QUEUE", "celery"),
)
app.conf.debounce_dispatcher = os.environ.get("PG_DISPATCHER", "1") == "1"
if os.environ.get("PG_PREFIX"):  # another deployment on the same database
    app.conf.debounce_key_prefix = os.environ["PG_PREFIX"]
if os.environ.get("PG_ACKS_LATE") == "1":  # a killed run is delivered again after 2 s
    app.conf.task_acks_late = True
    app.conf.broker_transport_options = {
        "visibility_timeout": 2,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }
if os.environ.get("PG_CLAIM_LEASE"):
    app.conf.debounce_claim_lease = float(os.environ["PG_CLAIM_LEASE"])
