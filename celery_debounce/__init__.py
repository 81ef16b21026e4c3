"""Debounced tasks for Celery: collapse a burst of calls into one run."""

from __future__ import annotations

import os as _os
import warnings as _warnings

from . import signals
from . import worker_signals as _worker_signals  # noqa: F401  (connects the signals)
from .admin import DebounceAdmin
from .bootstep import DispatcherStep, install
from .bulk import enqueue_many
from .collect import DebouncedCall
from .dispatcher import Dispatcher
from .errors import (
    DebounceBackendError,
    DebounceConfigError,
    DebounceError,
    DebounceKeyError,
    DebounceOutcomeUnknown,
    DebouncePayloadError,
    WindowNotFound,
    WindowNotPending,
    WindowQuarantined,
)
from .task import DebouncedTask, send_task

__version__ = "0.2.0"

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

__all__ = [
    "DebounceAdmin",
    "DebounceBackendError",
    "DebounceConfigError",
    "DebounceError",
    "DebounceKeyError",
    "DebounceOutcomeUnknown",
    "DebouncePayloadError",
    "DebouncedCall",
    "DebouncedTask",
    "Dispatcher",
    "DispatcherStep",
    "WindowNotFound",
    "WindowNotPending",
    "WindowQuarantined",
    "enqueue_many",
    "install",
    "send_task",
    "signals",
]
