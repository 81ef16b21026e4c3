"""The PostgreSQL store as an app uses it (``debounce_store_url = "postgresql://..."``):
:class:`AppPostgresStore`, built by :func:`~celery_debounce.store.store_for`.

It is :class:`~celery_debounce.store.postgres.PostgresStore` (every role of the
contract) with the app's shard tags and its copies in forked children.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import TYPE_CHECKING

from ...errors import DebounceConfigError
from ..domain import ShardRef
from ..green import eventlet_patched, made_unpatched, select_patched
from ..idents import shard_tag
from .store import PostgresStore

if TYPE_CHECKING:  # pragma: no cover
    from ...settings import Settings

__all__ = ["AppPostgresStore", "cooperate", "postgres_store"]


class AppPostgresStore(PostgresStore):
    """:class:`PostgresStore` with every member of the contract (see the module)."""

    @property
    def server_checked(self) -> bool:
        """The server and the schema were checked (``store_for`` checks until then)."""
        return self._checked

    def tag(self, shard: ShardRef) -> str:
        """The wire form of a shard, as the Redis store writes it (the worker reads a
        message's ``debounce_tag`` as the app's prefix's): the store has one table, so
        the worker's claim and finish find the window whatever it says."""
        return shard if isinstance(shard, str) else shard_tag(self.settings.key_prefix, shard)


def cooperate() -> None:
    """If psycopg chose its blocking C wait before gevent patched ``select``, switch it
    to the wait it chooses when imported after the patching (``poll``, patched)."""
    if not select_patched():
        return
    from psycopg import waiting

    if waiting.wait is getattr(waiting, "wait_c", None):
        waiting.wait = waiting.wait_poll


def postgres_store(settings: Settings) -> AppPostgresStore:
    """The app's PostgreSQL store (``settings.postgres_url``)."""
    assert settings.postgres_url is not None
    if eventlet_patched():
        raise DebounceConfigError(
            "debounce_store_url selects the PostgreSQL store, which does not run under "
            "eventlet: psycopg 3 waits for the server without yielding to eventlet, so one "
            "call waiting on a lock would stop every green thread. Use gevent, threads, "
            "prefork or solo, or the Redis store"
        )
    cooperate()
    store = AppPostgresStore(
        settings.postgres_url,
        settings,
        timeout=settings.postgres_timeout_s,
        max_size=settings.postgres_pool_size,
    )
    _built.add(store)
    made_unpatched(store)
    return store


#: Every store built in this process (a forked child keeps its parent's: see below).
_built: weakref.WeakSet[AppPostgresStore] = weakref.WeakSet()
#: A forked child's copies of its parent's stores, never collected: collecting one
#: would close its connections, which the parent still uses (libpq's close sends the
#: server a Terminate on the shared socket). The child builds its own store.
_inherited: list[AppPostgresStore] = []


def _forked() -> None:
    _inherited.extend(_built)
    _built.clear()


def _at_exit() -> None:
    """Close this process's own stores (never a parent's copies) before the interpreter
    tears down: a pool collected then stops its workers too late (under gevent, from a
    greenlet being finalized)."""
    for store in list(_built):
        store.close()


os.register_at_fork(after_in_child=_forked)
atexit.register(_at_exit)


if TYPE_CHECKING:  # pragma: no cover
    from ..api import Store

    def _app_postgres_is_a_store(store: AppPostgresStore) -> Store:
        """``mypy --strict`` fails here when a member of the contract is missing."""
        return store
