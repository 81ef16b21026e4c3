"""The windows' store: the contract every store keeps, its types, and the factory.

:mod:`~celery_debounce.store.api` is the contract (one Protocol per role), its types and
errors are in :mod:`~.results`, :mod:`~.records`, :mod:`~.idents`, :mod:`~.states` and
:mod:`~.domain`, and :func:`store_for` (:mod:`~.factory`) gives the app's store in this
process. The stores below it: ``store/redis/``
(:class:`~celery_debounce.store.redis.store.WindowStore`, on redis-py, with its
transport, cluster and Sentinel clients, key layout, record fields, scripts and Lua
files) and ``store/postgres/`` (on psycopg). Neither is imported until it is built or one of
its names below is used, so the contract loads without redis-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .domain import (
    UNKNOWN_OUTCOME,
    WRITTEN,
    CancelOutcomeUnknown,
    ClaimResult,
    FinishNotReplicated,
    FinishResult,
    NotReplicated,
    Outcome,
    Released,
    is_unknown_outcome,
)
from .factory import build_store, store_for
from .records import as_text
from .redis.scripts import SCRIPT_NAMES, script_source
from .results import (
    EXPIRY_GRACE_MS,
    Cancelled,
    CensusRow,
    GateResult,
    ListStep,
    Shard,
    ShardCounts,
    ShardSnapshot,
    TakenEntry,
    TakenWindow,
    TakeResult,
)

if TYPE_CHECKING:  # pragma: no cover - the names below, for the type checker
    from .redis.server import MIN_REDIS, read_server_version, server_supported
    from .redis.store import WaitedStore, WindowStore
    from .redis.translate import (
        CONNECTION_ERRORS,
        REDIS_ERROR,
        is_error_reply,
        is_outage,
        pipeline_failed_at,
        reply_code,
        translate_errors,
    )
    from .redis.wake import WakeListener

#: Names of the Redis store kept importable from here, each loaded on first use (they
#: import redis-py): name -> its module.
_REDIS_NAMES = {
    "WindowStore": ".redis.store",
    "WaitedStore": ".redis.store",
    "CONNECTION_ERRORS": ".redis.translate",
    "REDIS_ERROR": ".redis.translate",
    "is_error_reply": ".redis.translate",
    "is_outage": ".redis.translate",
    "pipeline_failed_at": ".redis.translate",
    "reply_code": ".redis.translate",
    "translate_errors": ".redis.translate",
    "MIN_REDIS": ".redis.server",
    "read_server_version": ".redis.server",
    "server_supported": ".redis.server",
    "WakeListener": ".redis.wake",
}


def __getattr__(name: str) -> Any:
    module = _REDIS_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CONNECTION_ERRORS",
    "EXPIRY_GRACE_MS",
    "MIN_REDIS",
    "REDIS_ERROR",
    "SCRIPT_NAMES",
    "UNKNOWN_OUTCOME",
    "WRITTEN",
    "CancelOutcomeUnknown",
    "Cancelled",
    "CensusRow",
    "ClaimResult",
    "FinishNotReplicated",
    "FinishResult",
    "GateResult",
    "ListStep",
    "NotReplicated",
    "Outcome",
    "Released",
    "Shard",
    "ShardCounts",
    "ShardSnapshot",
    "TakeResult",
    "TakenEntry",
    "TakenWindow",
    "WaitedStore",
    "WakeListener",
    "WindowStore",
    "as_text",
    "build_store",
    "is_error_reply",
    "is_outage",
    "is_unknown_outcome",
    "pipeline_failed_at",
    "read_server_version",
    "reply_code",
    "script_source",
    "server_supported",
    "store_for",
    "translate_errors",
]
