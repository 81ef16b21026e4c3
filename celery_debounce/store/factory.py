"""The factory: the app's store in this process (:func:`store_for`), built by
:func:`build_store` from the settings: the Redis store (``store/redis/``) or, for a
``postgresql://`` ``debounce_store_url``, the PostgreSQL one (``store/postgres/``).
Each backend is imported only when it is built."""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from ..errors import DebounceConfigError
from ..settings import Settings, settings_for
from .green import outdated

if TYPE_CHECKING:  # pragma: no cover
    from celery import Celery

    from .api import Store

__all__ = ["POSTGRES_EXTRA", "build_store", "store_for"]

_lock = threading.Lock()


def _forked() -> None:  # a thread that held the lock at the fork is not in the child
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def store_for(app: Celery, call: bool = False) -> Store:
    """The app's store in this process (a forked child builds its own): the Redis
    :class:`WindowStore`, or the PostgreSQL store when ``debounce_store_url`` is a
    ``postgresql://`` URL (:func:`build_store`).

    Until the server's version was read (:meth:`WindowStore.check_server`; the
    PostgreSQL store's also its schema), each use reads it; ``call``: a producer's
    call, which raises an outage found there."""
    pid = os.getpid()
    cached: tuple[int, Store] | None = getattr(app, "_debounce_store", None)
    if cached is not None and cached[0] == pid and outdated(cached[1]):
        # gevent patched since it was built: built anew (a forked child's copy is its
        # parent's, never closed here: below it builds its own)
        with _lock:
            replaced = getattr(app, "_debounce_store", None) is cached
            if replaced:
                app._debounce_store = None  # type: ignore[attr-defined, unused-ignore]
        if replaced:
            _close(cached[1])  # a call under way on it ends on its connection
        cached = getattr(app, "_debounce_store", None)
    if cached is not None and cached[0] == pid and cached[1].server_checked:
        return cached[1]
    if cached is None or cached[0] != pid:
        # built outside the lock: a cluster's client reads the topology, and under gevent
        # a lock made before the patching, held across that I/O, blocks every greenlet
        built = build_store(settings_for(app))
        with _lock:  # nothing under it yields
            cached = getattr(app, "_debounce_store", None)
            if cached is None or cached[0] != pid:
                cached = (pid, built)
                app._debounce_store = cached  # type: ignore[attr-defined, unused-ignore]
        if cached[1] is not built:  # another thread's came first: this one goes
            _close(built)
    store = cached[1]
    if not store.server_checked:  # the first call, dispatcher or worker of this process
        store.check_server(outage_raises=call)
    return store


#: What a ``postgresql://`` store URL needs when the extra is missing.
POSTGRES_EXTRA = "pip install 'celery-debounced[postgres]'"


def build_store(settings: Settings) -> Store:
    """A new store for ``settings``: PostgreSQL for ``debounce_store_url =
    "postgresql://..."`` (the ``postgres`` extra), else Redis."""
    if settings.postgres_url is None:
        from .redis.store import WindowStore

        return WindowStore(settings)
    try:
        from .postgres.app import postgres_store
    except ImportError as exc:
        raise DebounceConfigError(
            f"debounce_store_url selects the PostgreSQL store, which needs the postgres "
            f"extra ({exc}): {POSTGRES_EXTRA}"
        ) from None
    return postgres_store(settings)


def _close(store: Store) -> None:
    close = getattr(store, "close", None)  # each store's own: its client, its pool
    if close is not None:
        close()
