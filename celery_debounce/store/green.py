"""Stores made before gevent patched ``select``: ``store_for`` builds such a store anew.

psycopg picks how it waits for the server when it is imported: a C loop that blocks
every greenlet, unless gevent had patched ``select`` by then. A process that made a
PostgreSQL store (or imported psycopg) before patching, as gunicorn ``--preload`` does,
keeps that loop and that store's pool threads: :func:`outdated` tells ``store_for`` to
build the store again, and ``store/postgres/app.py``'s ``cooperate`` makes psycopg wait
as it would have had it been imported after the patching.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

__all__ = ["eventlet_patched", "made_unpatched", "outdated", "select_patched"]

#: Stores built while ``select`` was not patched (the PostgreSQL store registers itself).
_unpatched: weakref.WeakSet[Any] = weakref.WeakSet()


def select_patched() -> bool:
    """Whether gevent has patched ``select`` (psycopg's own test; gevent not imported:
    no)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("select"))


def eventlet_patched() -> bool:
    """Whether eventlet has patched ``socket`` (psycopg 3 cannot wait cooperatively
    under eventlet)."""
    patcher = sys.modules.get("eventlet.patcher")
    return patcher is not None and bool(patcher.is_monkey_patched("socket"))


def made_unpatched(store: Any) -> None:
    """Register ``store``, built now: outdated once gevent patches ``select``."""
    if not select_patched():
        _unpatched.add(store)


def outdated(store: Any) -> bool:
    """True when ``store`` was built before gevent patched ``select``."""
    return select_patched() and store in _unpatched
