"""Debounced calls from greenlets with the windows in PostgreSQL: one call waits on the
server (a row lock held by another greenlet of this process), the others must go on.

``python pg_green.py <first|late> <postgresql url> [greenlets]`` (``first``: gevent
patched before anything is imported, as ``celery -P gevent`` does; ``late``: after the
package was imported and had made a call, its pool made, as gunicorn ``--preload``
does) prints one JSON object: ``blocked`` (seconds the call on the locked key took, and
its error), ``others`` (the seconds each other greenlet's calls took, and their errors),
``held`` (how long the lock was held). ``python pg_green.py fork <url>``: a call, then a
fork whose child patches gevent and calls (gunicorn ``--preload``'s gevent worker); it
prints whether the parent's server process lives on (``alive``), the child's exit
status and whether the parent's next call answered. Used by tests/system/test_postgres_e2e.py.
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["first"]:
    from gevent import monkey

    monkey.patch_all()

import json
import time
from typing import Any

from celery import Celery

from celery_debounce import DebouncedTask

#: how long the locker greenlet holds the locked key's row
HOLD_S = 1.5


def build(url: str) -> Celery:
    app = Celery("pg_green", set_as_current=False)
    app.conf.update(
        broker_url="memory://",
        debounce_store_url=url,
        task_ignore_result=True,
    )

    @app.task(
        name="green.pg",
        base=DebouncedTask,
        shared=False,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{key}",
    )
    def debounced(key: str) -> None:
        return None

    return app


def fork(url: str) -> int:
    import os

    app = build(url)
    task = app.tasks["green.pg"]
    task.delay("parent")  # the parent's store, made before any patching
    store = app._debounce_store[1]  # type: ignore[attr-defined]

    def backend() -> int:
        with store.pool.connection() as conn:
            return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])

    before = backend()
    child = os.fork()
    if child == 0:  # as gunicorn's gevent worker: patched after the fork, then calls
        from gevent import monkey

        monkey.patch_all()
        try:
            task.delay("child")
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    import psycopg

    with psycopg.connect(url) as conn:  # is the parent's server process still there?
        alive = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (before,)
        ).fetchone()[0]
    print(json.dumps({"alive": alive, "child": status, "call": backend() > 0}))
    return 0


def main(argv: list[str]) -> int:
    mode, url = argv[0], argv[1]
    if mode == "fork":
        return fork(url)
    greenlets = int(argv[2]) if len(argv) > 2 else 10
    task = build(url).tasks["green.pg"]
    task.delay("locked")  # its window, whose row the locker holds
    if mode == "late":
        from gevent import monkey

        monkey.patch_all()
    import gevent
    import gevent.event
    import psycopg

    locked = gevent.event.Event()
    out: dict[str, Any] = {"others": []}

    def locker() -> None:
        with psycopg.connect(url) as conn:  # a transaction: the lock lasts until commit
            conn.execute("SELECT 1 FROM debounce_open WHERE ident LIKE '%locked' FOR UPDATE")
            locked.set()
            start = time.monotonic()
            gevent.sleep(HOLD_S)
            out["held"] = time.monotonic() - start

    def blocked() -> None:
        start = time.monotonic()
        try:
            task.delay("locked")
            error = None
        except Exception as exc:  # reported, not raised
            error = f"{type(exc).__name__}: {exc}"
        out["blocked"] = [time.monotonic() - start, error]

    def other(i: int) -> None:
        start = time.monotonic()
        try:
            for j in range(5):
                task.delay(f"other{i}-{j}")
            error = None
        except Exception as exc:  # reported, not raised
            error = f"{type(exc).__name__}: {exc}"
        out["others"].append([time.monotonic() - start, error])

    holder = gevent.spawn(locker)
    locked.wait(10)
    waiting = gevent.spawn(blocked)
    gevent.sleep(0.1)  # the blocked call is waiting on the row now
    gevent.joinall([gevent.spawn(other, i) for i in range(greenlets)], timeout=30)
    gevent.joinall([holder, waiting], timeout=30)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
