"""Helpers for testing your own debounced tasks, and a pytest plugin with fixtures.

Everything here works against a real Redis or a fakeredis server (with Lua) and
never sleeps: windows are read straight from Redis and made due on demand.

* :func:`debounce_windows`: the pending windows, with their decoded payload.
* :func:`flush_windows`: make pending windows due now and publish them (one
  :meth:`Dispatcher.dispatch_once <celery_debounce.Dispatcher.dispatch_once>`).
* :func:`run_windows`: make them due and run them inline in this process
  (``Task.apply``), without a broker or a worker.
* :func:`use_fakeredis`: point an app's debounce backend at a fakeredis server.
* :func:`clear_windows`: delete every debounce key of an app (real Redis shared by tests).

The pytest plugin (entry point ``pytest11``) only defines the fixture
``debounce_fakeredis``; it imports fakeredis only when that fixture is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from celery import Celery
from celery.result import EagerResult
from kombu import serialization

from .admin import flush_window
from .backend import SCRIPT_NAMES, Backend, as_text, backend_for, script_source
from .dispatcher import SHARD_HEADER, Dispatcher, take_due
from .gate import DEFAULT_CONTENT_TYPE
from .keys import split_ident
from .settings import settings_for

if TYPE_CHECKING:  # pragma: no cover
    import fakeredis

__all__ = [
    "PendingWindow",
    "clear_windows",
    "debounce_windows",
    "flush_windows",
    "run_windows",
    "use_fakeredis",
]

_FIELDS = ("id", "fs", "mw", "n", "ct", "p", "o")


@dataclass(frozen=True)
class PendingWindow:
    """An open window as a test sees it. Times are epoch seconds on the Redis clock."""

    task: str
    key: str
    task_id: str
    calls: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    first_seen: float = 0.0
    deadline: float = 0.0
    max_wait_at: float = 0.0
    shard: int = 0



def _task_name(task: Any) -> str | None:
    return task if task is None or isinstance(task, str) else str(task.name)


def _decode(app: Celery, content_type: str, payload: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    data = payload if isinstance(payload, bytes) else str(payload).encode("utf-8")
    accept = serialization.prepare_accept_content(app.conf.accept_content)
    args, kwargs = serialization.loads(data, content_type, "utf-8", accept=accept)
    return tuple(args), dict(kwargs)


def _pending(app: Celery, task: Any = None) -> Iterator[tuple[Backend, int, str, PendingWindow]]:
    import json

    backend = backend_for(app)
    name = _task_name(task)
    prefix = None if name is None else f"{len(name)}:{name}:"
    for shard in range(backend.settings.shards):
        tag = backend.settings.tag(shard)
        due: list[Any] = backend.client.zrange(
            f"{tag}:due", 0, -1, withscores=True
        )
        for member, dl in due:  # a pending window's deadline is its due score
            ident = as_text(member)
            if prefix is not None and not ident.startswith(prefix):
                continue
            row: list[Any] = backend.client.hmget(f"{tag}:open:{ident}", *_FIELDS)
            tid, fs, mw, n, ct, p, o = row
            if tid is None:
                continue
            task_name, key = split_ident(ident)
            args, kwargs = _decode(app, as_text(ct) if ct is not None else DEFAULT_CONTENT_TYPE, p)
            yield backend, shard, ident, PendingWindow(
                task=task_name,
                key=key,
                task_id=as_text(tid),
                calls=int(n),
                args=args,
                kwargs=kwargs,
                options=json.loads(as_text(o)) if o is not None else {},
                first_seen=int(fs) / 1000,
                deadline=int(dl) / 1000,  # float score from zrange
                max_wait_at=(int(fs) + int(mw)) / 1000,
                shard=shard,
            )


def debounce_windows(app: Celery, task: Any = None) -> list[PendingWindow]:
    """The app's pending windows (optionally of one task, by name or object), by deadline."""
    return sorted((w for *_, w in _pending(app, task)), key=lambda w: (w.deadline, w.task_id))


def _make_due(app: Celery, task: Any = None) -> list[str]:
    ids = []
    for backend, shard, ident, window in list(_pending(app, task)):
        flush_window(backend, shard, ident, window.task_id)
        ids.append(window.task_id)
    return ids


def flush_windows(app: Celery, task: Any = None) -> list[str]:
    """Make pending windows due now and publish every due window to the broker.

    Returns the task ids of the windows it made due (windows that were already
    due are published too). A worker (``celery_worker``, ``start_worker``
    or a real one) then runs them; ``AsyncResult(id).get()`` waits for the run.
    """
    flushed = _make_due(app, task)
    Dispatcher(app, name="testing").dispatch_once()
    return flushed


def run_windows(app: Celery, task: Any = None, *, throw: bool | None = None) -> list[EagerResult]:
    """Make pending windows due and run each due window inline, once, in this process.

    Uses ``Task.apply`` with the window's task id, so no broker or worker is needed;
    the window is marked claimed and finished as a worker would. Returns the
    results in deadline order. ``throw`` is passed to ``Task.apply`` (default:
    ``task_eager_propagates``).
    """
    _make_due(app, task)
    backend = backend_for(app)
    results: list[EagerResult] = []
    for shard in range(backend.settings.shards):
        tag = backend.settings.tag(shard)
        while True:
            taken = take_due(backend, shard, backend.settings.dispatch_batch)
            if taken.windows:
                ids = [w.task_id for w in taken.windows]
                backend.run("ack", [f"{tag}:leased", f"{tag}:active"], [tag, *ids])
            for window in taken.windows:
                args, kwargs = _decode(app, window.content_type, window.payload)
                results.append(
                    app.tasks[window.task_name].apply(
                        args, kwargs, task_id=window.task_id,
                        headers={SHARD_HEADER: shard}, throw=throw,
                    )
                )
            if len(taken.windows) < backend.settings.dispatch_batch:
                break
    return results


def clear_windows(app: Celery) -> int:
    """Delete every key under the app's ``debounce_key_prefix``; returns how many."""
    backend = backend_for(app)
    keys = list(backend.client.scan_iter(match=f"{backend.settings.key_prefix}:*", count=1000))
    return int(backend.client.delete(*keys)) if keys else 0


def use_fakeredis(app: Celery, server: fakeredis.FakeServer | None = None) -> fakeredis.FakeRedis:
    """Make ``app`` keep its windows in a fakeredis server (a new one if not given).

    Only this process sees the fake server: use it with inline runs
    (:func:`run_windows`) or an in-process worker, not with a prefork worker.
    If the app has no Redis URL for windows, a placeholder is set (never connected).
    """
    import fakeredis

    if not app.conf.get("debounce_redis_url") and not str(app.conf.broker_url or "").startswith(
        ("redis://", "rediss://")
    ):
        app.conf.debounce_redis_url = "redis://fakeredis.invalid:6379/0"
    backend = Backend(settings_for(app))
    client = fakeredis.FakeRedis(server=server or fakeredis.FakeServer())
    backend.client = client
    backend.scripts = {name: client.register_script(script_source(name)) for name in SCRIPT_NAMES}
    app._debounce_backend = (os.getpid(), backend)  # type: ignore[attr-defined, unused-ignore]
    return client


@pytest.fixture
def debounce_fakeredis() -> Iterator[Callable[[Celery], fakeredis.FakeRedis]]:
    """``debounce_fakeredis(app)`` points ``app`` at a fakeredis server private to this test.

    Every app passed in shares the same fake server; each app gets its previous
    backend back when the test ends.
    """
    import fakeredis

    server = fakeredis.FakeServer()
    saved: list[tuple[Celery, Any]] = []

    def use(app: Celery) -> fakeredis.FakeRedis:
        saved.append((app, getattr(app, "_debounce_backend", None)))
        return use_fakeredis(app, server)

    yield use
    for app, previous in reversed(saved):
        if previous is None:
            del app._debounce_backend  # type: ignore[attr-defined, unused-ignore]
        else:
            app._debounce_backend = previous  # type: ignore[attr-defined, unused-ignore]
