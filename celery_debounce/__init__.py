"""Debounced tasks for Celery: collapse a burst of calls into one run.

The public names load on first use (PEP 562), so ``import celery_debounce.store``
(or ``.settings``) runs none of the call encoding. No import connects
anything: using any public name, or binding a ``DebouncedTask`` to an app, connects
the worker signals (:mod:`celery_debounce.worker.receivers`) and the hook that adds the
embedded dispatcher's worker bootstep (:func:`celery_debounce.producer.worker_steps.install`);
the ``celery`` command's plugin (``ops/cli.py``) connects the worker signals
(:func:`celery_debounce.worker.install`).
"""

from __future__ import annotations

import importlib as _importlib
import os as _os
import warnings as _warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from . import signals
    from .calls import DebouncedCall
    from .dispatch.bootstep import DispatcherStep, install
    from .dispatch.dispatcher import Dispatcher
    from .errors import (
        DebounceBackendError,
        DebounceConfigError,
        DebounceContractMismatch,
        DebounceError,
        DebounceKeyError,
        DebounceOutcomeUnknown,
        DebouncePayloadError,
        MigrationBlocked,
        SchemaMismatch,
        SchemaMissing,
        SchemaTooNew,
        SchemaTooOld,
        StoreMisconfigured,
        WindowNotFound,
        WindowNotPending,
        WindowQuarantined,
    )
    from .ops.admin import DebounceAdmin
    from .producer.many import DebounceBulkError, enqueue_many
    from .producer.outage import DebounceBreakerOpen
    from .producer.task import DebouncedTask, send_task
    from .store.domain import (
        AliasesFull,
        CancelOutcomeUnknown,
        PayloadTooLarge,
        ReplaceRefused,
        ReplyLost,
        ServerRefused,
        StoreUnavailable,
    )
    from .worker.deliveries import DeliveryLimitReached

__version__ = "0.3.0"

#: A file the unrelated 2022 PyPI package ``celery-debounce`` installs into the same folder.
_FOREIGN_MODULE = _os.path.join(_os.path.dirname(__file__), "celery_debounce.py")
if _os.path.exists(_FOREIGN_MODULE):
    _warnings.warn(
        f"celery_debounce: found {_FOREIGN_MODULE} from the unrelated 2022 'celery-debounce' "
        "package, installed into the same folder; run `pip uninstall celery-debounce` and "
        "reinstall `celery-debounced` (see docs/migrating.md)",
        RuntimeWarning,
        stacklevel=2,
    )

#: Each public name -> the module that defines it ("" for the module of that name).
_OWNERS = {
    "AliasesFull": "store.domain",
    "CancelOutcomeUnknown": "store.domain",
    "DebounceAdmin": "ops.admin",
    "DebounceBackendError": "errors",
    "DebounceBreakerOpen": "producer.outage",
    "DebounceBulkError": "producer.many",
    "DebounceConfigError": "errors",
    "DebounceContractMismatch": "errors",
    "DebounceError": "errors",
    "DebounceKeyError": "errors",
    "DebounceOutcomeUnknown": "errors",
    "DebouncePayloadError": "errors",
    "DebouncedCall": "calls",
    "DebouncedTask": "producer.task",
    "DeliveryLimitReached": "worker.deliveries",
    "Dispatcher": "dispatch.dispatcher",
    "DispatcherStep": "dispatch.bootstep",
    "MigrationBlocked": "errors",
    "PayloadTooLarge": "store.domain",
    "ReplaceRefused": "store.domain",
    "ReplyLost": "store.domain",
    "SchemaMismatch": "errors",
    "SchemaMissing": "errors",
    "SchemaTooNew": "errors",
    "SchemaTooOld": "errors",
    "ServerRefused": "store.domain",
    "StoreMisconfigured": "errors",
    "StoreUnavailable": "store.domain",
    "WindowNotFound": "errors",
    "WindowNotPending": "errors",
    "WindowQuarantined": "errors",
    "enqueue_many": "producer.many",
    "install": "dispatch.bootstep",
    "send_task": "producer.task",
    "signals": "",
}

__all__ = [
    "AliasesFull",
    "CancelOutcomeUnknown",
    "DebounceAdmin",
    "DebounceBackendError",
    "DebounceBreakerOpen",
    "DebounceBulkError",
    "DebounceConfigError",
    "DebounceContractMismatch",
    "DebounceError",
    "DebounceKeyError",
    "DebounceOutcomeUnknown",
    "DebouncePayloadError",
    "DebouncedCall",
    "DebouncedTask",
    "DeliveryLimitReached",
    "Dispatcher",
    "DispatcherStep",
    "MigrationBlocked",
    "PayloadTooLarge",
    "ReplaceRefused",
    "ReplyLost",
    "SchemaMismatch",
    "SchemaMissing",
    "SchemaTooNew",
    "SchemaTooOld",
    "ServerRefused",
    "StoreMisconfigured",
    "StoreUnavailable",
    "WindowNotFound",
    "WindowNotPending",
    "WindowQuarantined",
    "enqueue_many",
    "install",
    "send_task",
    "signals",
]


def __getattr__(name: str) -> Any:
    owner = _OWNERS.get(name)
    if owner is None:
        raise AttributeError(f"module 'celery_debounce' has no attribute {name!r}")
    # the worker signals and bootstep, connected whenever the public API is used (as
    # when this module imported everything): a worker that only sends or inspects
    # still claims and finishes the windows it runs
    _importlib.import_module(".producer.worker_steps", __name__).install()
    module = _importlib.import_module(f".{owner or name}", __name__)
    value = module if not owner else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_OWNERS})
