"""Helpers for testing your own debounced tasks (throwaway servers: the two server
modules of this package, below).

Everything here works against a real Redis or a fakeredis server (with Lua) and
never sleeps: windows are read straight from Redis and made due on demand.

* :func:`debounce_windows`: the pending windows, with their decoded payload.
* :func:`flush_windows`: make pending windows due now and publish them (one
  :meth:`Dispatcher.dispatch_once <celery_debounce.Dispatcher.dispatch_once>`).
* :func:`run_windows`: make them due and run them inline in this process
  (``Task.apply``), without a broker or a worker.
* :func:`use_fakeredis`: point an app's windows' store at a fakeredis server.
* :func:`assert_pending` / :func:`assert_not_pending`: a task's window for given
  arguments (the key resolved as a call resolves it) is open, with ``calls`` calls.
* :func:`clear_windows`: delete every debounce key of an app (real Redis shared by tests).
* ``servers.LocalRedis``, ``servers.LocalSentinels`` and ``LocalCluster`` (the cluster
  module beside them): a throwaway local redis-server, Sentinel group or Redis Cluster
  (needs the binaries).

The pytest plugin (entry point ``pytest11``: the module ``celery_debounce_pytest``)
only defines the fixture ``debounce_fakeredis`` (its body: :func:`fakeredis_fixture`).
It imports nothing of Celery, kombu, redis or this package until a test uses the
fixture, so suites that never use it pay nothing and get no debounce signal handlers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery import Celery, states
from celery.result import EagerResult
from kombu import serialization

from ..calls import DebouncedCall
from ..dispatch.dispatcher import Dispatcher
from ..headers import SHARD_HEADER
from ..ops.read_view import WindowInfo
from ..settings import settings_for
from ..store import WindowStore, store_for
from ..store.api import OperatorStore, Store
from ..store.domain import Released
from ..store.idents import ident_prefix, split_ident
from ..stored_call import decode_options
from ..worker import install as install_worker

if TYPE_CHECKING:  # pragma: no cover
    import fakeredis

__all__ = [
    "PendingWindow",
    "assert_not_pending",
    "assert_pending",
    "clear_windows",
    "close_store",
    "debounce_windows",
    "django_database_url",
    "flush_windows",
    "run_windows",
    "use_fakeredis",
    "use_postgres",
]


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
    # the stored payload is Celery's protocol-2 body: [args, kwargs, embed]
    args, kwargs, _embed = serialization.loads(data, content_type, "utf-8", accept=accept)
    return tuple(args), dict(kwargs)


def _pending(
    app: Celery,
    task: Any = None,
) -> Iterator[tuple[OperatorStore, int, str, PendingWindow]]:
    store: OperatorStore = store_for(app)
    name = _task_name(task)
    prefix = None if name is None else ident_prefix(name)
    for shard in range(store.settings.shards):
        for record in store.pending_payloads(shard, prefix):
            ident = record.ident or ""
            task_name, key = split_ident(ident)
            if record.collected is not None:  # debounce_collect: what the run gets
                args: tuple[Any, ...] = (
                    [DebouncedCall.from_element(json.loads(e)) for e in record.collected],
                )
                kwargs: dict[str, Any] = {}
            else:
                args, kwargs = _decode(app, record.content_type, record.payload)
            yield (
                store,
                shard,
                ident,
                PendingWindow(
                    task=task_name,
                    key=key,
                    task_id=record.task_id,
                    calls=record.calls,
                    args=args,
                    kwargs=kwargs,
                    options=decode_options(record.options_json),
                    first_seen=record.first_seen_ms / 1000,
                    deadline=record.deadline_ms / 1000,
                    max_wait_at=record.ceiling_ms / 1000,
                    shard=shard,
                ),
            )


def debounce_windows(app: Celery, task: Any = None) -> list[PendingWindow]:
    """The app's pending windows (optionally of one task, by name or object), by deadline."""
    return sorted((w for *_, w in _pending(app, task)), key=lambda w: (w.deadline, w.task_id))


def _make_due(app: Celery, task: Any = None) -> list[str]:
    ids = []
    for store, shard, ident, window in list(_pending(app, task)):
        store.flush(shard, [(ident, window.task_id)])
        ids.append(window.task_id)
    return ids


def flush_windows(app: Celery, task: Any = None) -> list[str]:
    """Make pending windows due now and publish every due window to the broker.

    Returns the task ids of the windows it made due (windows that were already
    due are published too). A worker (``celery_worker``, ``start_worker``
    or a real one) then runs them; ``AsyncResult(id).get()`` waits for the run.
    """
    flushed = _make_due(app, task)
    dispatcher = Dispatcher(app, name="testing")
    try:
        dispatcher.dispatch_once()
    finally:
        dispatcher.close()
    return flushed


def run_windows(app: Celery, task: Any = None, *, throw: bool | None = None) -> list[EagerResult]:
    """Make pending windows due and run each due window inline, once, in this process.

    Uses ``Task.apply`` with the window's task id, so no broker or worker is needed;
    the window is marked claimed and finished as a worker would (a run that raises
    is finished as ``FAILURE``). With ``task``, only that task's windows run (other
    tasks' due windows are left for a dispatcher). Returns the results in deadline
    order. ``throw`` is passed to ``Task.apply`` (default: ``task_eager_propagates``).

    When a run raises (``throw=True`` or ``task_eager_propagates``), every other
    due window still runs first, then the first exception is raised: no window is
    left behind. A window whose task is not registered in ``app`` is not run (it is
    handed back, due, for a dispatcher of an app that has the task).
    """
    install_worker()  # the worker's receivers claim and finish each run
    name = _task_name(task)
    _make_due(app, task)
    store: Store = store_for(app)  # taken as a dispatcher does, finished as a worker does
    results: list[EagerResult] = []
    errors: list[BaseException] = []
    for shard in range(store.settings.shards):
        handed_back: list[Released] = []
        while True:
            taken = store.take(shard, store.settings.dispatch_batch)
            for window in taken.windows:
                if (
                    name is not None and window.task_name != name
                ) or window.task_name not in app.tasks:
                    handed_back.append(Released(window.task_id, window.tries))  # due again
                    continue
                args, kwargs = _decode(app, window.content_type, window.payload)
                try:  # never acked: the run itself marks the window claimed, then finished
                    results.append(
                        app.tasks[window.task_name].apply(
                            args,
                            kwargs,
                            task_id=window.task_id,
                            headers={SHARD_HEADER: shard},
                            throw=throw,
                        )
                    )
                except Exception as exc:  # propagated: finish it, run the rest, raise later
                    store.finish_run(shard, window.task_id, states.FAILURE)
                    errors.append(exc)
            got = len(taken.windows) + len(taken.skipped) + len(taken.unreadable)
            if got < store.settings.dispatch_batch:
                break
        if handed_back:  # lease expiry := now: the next take (any dispatcher) publishes them
            store.release(shard, 0, handed_back)
    if errors:
        raise errors[0]
    return results


def assert_pending(
    task: Any,
    *args: Any,
    calls: int | None = None,
    debounce_key: str | None = None,
    **kwargs: Any,
) -> WindowInfo:
    """Assert that ``task`` has a pending window for these arguments (and, with
    ``calls``, that it absorbed exactly that many calls); return it.

    The key is resolved as ``task.delay(*args, **kwargs)`` resolves it
    (``task.debounce_pending``); pass ``debounce_key=`` if the calls override it.
    """
    window: WindowInfo | None = task.debounce_pending(*args, debounce_key=debounce_key, **kwargs)
    where = f"{task.name}{_call_repr(args, kwargs)}"
    if window is None:
        raise AssertionError(f"no pending debounce window for {where}")
    if calls is not None and window.calls != calls:
        raise AssertionError(
            f"pending debounce window for {where} (key {window.key!r}) has "
            f"{window.calls} call(s), expected {calls}"
        )
    return window


def assert_not_pending(
    task: Any, *args: Any, debounce_key: str | None = None, **kwargs: Any
) -> None:
    """Assert that ``task`` has no pending window for these arguments (none opened,
    or already taken for dispatch, flushed or cancelled)."""
    window: WindowInfo | None = task.debounce_pending(*args, debounce_key=debounce_key, **kwargs)
    if window is not None:
        raise AssertionError(
            f"unexpected pending debounce window for {task.name}{_call_repr(args, kwargs)}: "
            f"{window.task_id} (key {window.key!r}, {window.calls} call(s))"
        )


def _call_repr(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"({', '.join(parts)})"


def clear_windows(app: Celery) -> int:
    """Delete every window of the app's store (on Redis every key under
    ``debounce_key_prefix``; on PostgreSQL every row but the schema's version); returns
    how many keys or rows."""
    return store_for(app).delete_all()


def use_fakeredis(app: Celery, server: fakeredis.FakeServer | None = None) -> fakeredis.FakeRedis:
    """Make ``app`` keep its windows in a fakeredis server (a new one if not given).

    Only this process sees the fake server: use it with inline runs
    (:func:`run_windows`) or an in-process worker, not with a prefork worker.
    If the app has no Redis URL for windows, a placeholder is set (never connected).
    The ``debounce_fakeredis`` fixture undoes all of this when the test ends.
    """
    import fakeredis

    from ..settings import POSTGRES_SCHEMES

    if str(app.conf.get("debounce_store_url") or "").startswith(POSTGRES_SCHEMES):
        # the app's windows are in PostgreSQL: this test's go to fakeredis instead
        pg = settings_for(app)
        settings = dataclasses.replace(pg, postgres_url=None, redis_url=PLACEHOLDER_URL)
        app._debounce_settings = settings  # type: ignore[attr-defined, unused-ignore]
    else:
        if not app.conf.get("debounce_redis_url") and not str(app.conf.broker_url or "").startswith(
            ("redis://", "rediss://")
        ):
            app.conf.debounce_redis_url = PLACEHOLDER_URL
        settings = settings_for(app)
    client = fakeredis.FakeRedis(server=server or fakeredis.FakeServer())
    # the client given: an app configured for a Redis Cluster never connects to it;
    # fakeredis has no replicas (and no WAIT): debounce_redis_wait_replicas is off here
    store = WindowStore(dataclasses.replace(settings, wait_replicas=0), client)
    app._debounce_store = (os.getpid(), store)  # type: ignore[attr-defined, unused-ignore]
    return client


def use_postgres(app: Celery, url: str, *, migrate: bool = True) -> Any:
    """Make ``app`` keep its windows in the PostgreSQL database at ``url`` (in Django
    tests: :func:`django_database_url`, the test database), the schema migrated there
    unless ``migrate`` is False; the store (a ``PostgresStore``).

    Call :func:`close_store` when the test ends: the store's connections would keep the
    database from being dropped."""
    from ..settings import NO_REDIS_URL
    from ..store.postgres.app import postgres_store

    close_store(app)
    settings = dataclasses.replace(settings_for(app), postgres_url=url, redis_url=NO_REDIS_URL)
    store = postgres_store(settings)
    if migrate:
        store.migrate()
    app._debounce_settings = settings  # type: ignore[attr-defined, unused-ignore]
    app._debounce_store = (os.getpid(), store)  # type: ignore[attr-defined, unused-ignore]
    return store


def close_store(app: Celery) -> None:
    """Close the connections of ``app``'s window store in this process (before a test
    database is dropped); the next call builds it again from the app's settings."""
    cached = app.__dict__.pop("_debounce_store", None)
    app.__dict__.pop("_debounce_settings", None)
    store = cached[1] if cached else None
    close = getattr(store, "close", None)
    if close is not None and cached is not None and cached[0] == os.getpid():
        close()


def django_database_url(alias: str = "default") -> str:
    """The ``postgresql://`` URL of Django's database ``alias`` as Django connects to it
    now: inside a test run, the test database."""
    from django.db import connections

    from ..contrib.django.database import database_url

    return database_url(connections[alias].settings_dict)


#: The windows URL :func:`use_fakeredis` sets on an app that has none (never connected).
PLACEHOLDER_URL = "redis://fakeredis.invalid:6379/0"

_MISSING: Any = object()
#: What use_fakeredis changes on an app: one conf key and two cached attributes.
_APP_ATTRS = ("_debounce_settings", "_debounce_store")


def _snapshot(app: Celery) -> tuple[Any, ...]:
    return (
        app.conf.changes.get("debounce_redis_url", _MISSING),
        *(app.__dict__.get(attr, _MISSING) for attr in _APP_ATTRS),
    )


def _restore(app: Celery, snapshot: tuple[Any, ...]) -> None:
    url, *attrs = snapshot
    if url is _MISSING:
        app.conf.changes.pop("debounce_redis_url", None)
    else:
        app.conf.changes["debounce_redis_url"] = url
    for attr, value in zip(_APP_ATTRS, attrs, strict=True):
        if value is _MISSING:
            app.__dict__.pop(attr, None)
        else:
            app.__dict__[attr] = value


def fakeredis_fixture() -> Iterator[Callable[[Celery], fakeredis.FakeRedis]]:
    """The body of the ``debounce_fakeredis`` fixture (see celery_debounce_pytest)."""
    import fakeredis

    server = fakeredis.FakeServer()
    saved: dict[int, tuple[Celery, tuple[Any, ...]]] = {}

    def use(app: Celery) -> fakeredis.FakeRedis:
        saved.setdefault(id(app), (app, _snapshot(app)))  # as the test found it
        return use_fakeredis(app, server)

    try:
        yield use
    finally:
        for app, snapshot in reversed(saved.values()):
            _restore(app, snapshot)
