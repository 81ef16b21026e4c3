"""Concurrency models decided when a call is made: asyncio callers through asgiref's
``sync_to_async`` get their own replies, and a fork while another thread holds one of
the package's module locks does not deadlock the child (gevent and eventlet, patched
after import: tests/worker/test_gevent.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from green_callers import assert_each_call_got_its_window, build, key_of
from helpers import StoreCase, made_apps

from celery_debounce.store import factory as store_module
from celery_debounce.worker import retry_queue as marks

pytestmark = pytest.mark.usefixtures("store")


def test_asyncio_callers_through_sync_to_async_each_get_their_own_reply(
    redis_server: str, redis_client: redis.Redis, store: StoreCase
) -> None:
    sync_to_async = pytest.importorskip("asgiref.sync").sync_to_async
    task = build(redis_server, **store.conf).tasks["green.debounced"]
    made_apps.add(task.app)  # its store's pool closed with the test
    keys = [key_of(i, j) for i in range(30) for j in range(20)]

    async def main() -> list[Any]:
        call = sync_to_async(lambda key: task.delay(key).id, thread_sensitive=False)
        return list(await asyncio.gather(*(call(key) for key in keys)))

    ids = asyncio.run(main())
    results = [[k, i, None] for k, i in zip(keys, ids)]
    assert_each_call_got_its_window(redis_server, results, conf=store.conf)


def _fork_while_held(lock: Any, in_child: Callable[[], object]) -> int | None:
    """Fork while another thread holds ``lock``; the child runs ``in_child``. The child's
    exit status, or None if it had not exited 10 s after the lock was released (then
    it is killed)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            in_child()
            code = 0
        finally:
            os._exit(code)
    release.set()
    holder.join(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.parametrize("where", ["store_for", "marks"])
def test_a_fork_while_another_thread_holds_a_module_lock_does_not_deadlock_the_child(
    redis_server: str, redis_client: redis.Redis, store: StoreCase, where: str
) -> None:
    app = build(redis_server, **store.conf)
    made_apps.add(app)
    if where == "store_for":  # the child builds its own store under the lock
        lock, in_child = store_module._lock, lambda: store_module.store_for(app)
    else:  # the child's marks (kept while Redis was down) are read under the lock
        lock, in_child = marks._lock, marks.flush
    assert _fork_while_held(lock, in_child) == 0, (
        "the child deadlocked on a lock a thread of its parent held at the fork"
    )
