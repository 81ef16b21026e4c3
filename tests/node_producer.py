"""The Node producer (clients/node) driven from the Python tests: the package built from
this checkout, and calls made by a Node process (``node_calls``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

NODE = shutil.which("node")
PACKAGE = Path(__file__).resolve().parent.parent / "clients" / "node"

#: Runs the calls given as JSON (in place of __CALLS__), prints their task ids (or errors).
PRODUCER = """
import Redis from "ioredis";
import pg from "pg";
import {
  cancelWindow, debounce, debounceMany, flushWindow, pendingWindow, redisBroker,
} from "celery-debounced";
const operations = {
  debounce, pending: pendingWindow, flush: flushWindow, cancel: cancelWindow, many: debounceMany,
};
const { url, cluster, postgres, broker, calls } = JSON.parse(__CALLS__);
// an option publish: "__broker__" is redisBroker on the broker's Redis (onOutage: "publish")
const brokerClient = broker ? new Redis(broker) : null;
const publish = brokerClient ? redisBroker(brokerClient) : undefined;
const redis = postgres
  ? new pg.Pool({ connectionString: postgres, max: 2 }).on("error", () => {})
  : cluster
  ? new Redis.Cluster([cluster], { redisOptions: { autoResendUnfulfilledCommands: false } })
  : new Redis(url, { autoResendUnfulfilledCommands: false });
const out = [];
let closed = false;
for (const [task, call, options, operation] of calls) {
  if (task === "__sleep__") { await new Promise((r) => setTimeout(r, call.ms)); continue; }
  if (task === "__close__") {
    closed = true;
    if (postgres) await redis.end();
    else await new Promise((ended) => { redis.once("end", ended); redis.disconnect(); });
    continue;
  }
  const run = operations[operation ?? "debounce"];
  if (options?.publish === "__broker__") options.publish = publish;
  try { out.push(await run(redis, task, call, options ?? undefined)); }
  catch (exc) { out.push({ error: exc.name, message: exc.message }); }
}
if (!closed) { if (postgres) await redis.end(); else redis.disconnect(); }
brokerClient?.disconnect();
console.log(JSON.stringify(out));
"""


def build_node_package() -> Path:
    """clients/node built from this checkout (its gate script from
    celery_debounce/store/redis/lua)."""
    assert NODE is not None
    if not (PACKAGE / "node_modules" / "ioredis").is_dir():
        pytest.fail(
            "clients/node has no node_modules: run `npm install` there (scripts/bootstrap.sh does)"
        )
    subprocess.run(
        [NODE, "scripts/build.mjs"], cwd=PACKAGE, check=True, timeout=120, capture_output=True
    )
    return PACKAGE


def node_calls(
    package: Path,
    url: str,
    calls: list[Any],
    cluster: dict[str, Any] | None = None,
    postgres: str | None = None,
    broker: str | None = None,
) -> list[Any]:
    """Each call ``[task, {args, kwargs}, options]`` made by the Node producer, in order.

    A fourth element ``"pending"``, ``"flush"``, ``"cancel"`` or ``"many"`` calls
    ``pendingWindow``, ``flushWindow``, ``cancelWindow`` or ``debounceMany`` (whose second
    element is then a list of calls);
    a task ``__sleep__`` with ``{ms}`` waits that long and answers nothing; a task
    ``__close__`` closes the store's client (later calls meet a store gone). ``cluster``:
    ``{host, port}`` of a Redis Cluster node, through ioredis's Cluster; ``postgres``: the
    URL of a PostgreSQL store, through a node-postgres Pool; ``broker``: the URL of a Redis
    broker, for options whose ``publish`` is ``"__broker__"`` (``redisBroker``)."""
    assert NODE is not None
    given = {"url": url, "calls": calls, "cluster": cluster, "postgres": postgres, "broker": broker}
    source = PRODUCER.replace("__CALLS__", json.dumps(json.dumps(given)))
    # inside the package (resolves its name), one file per call: tests run side by side
    script = package / "test" / f".producer-{os.getpid()}-{uuid.uuid4().hex[:8]}.mjs"
    script.write_text(source, "utf-8")
    try:
        done = subprocess.run(
            [NODE, str(script)], cwd=package, capture_output=True, text=True, timeout=60
        )
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr
    result: list[Any] = json.loads(done.stdout)
    return result
