"""Debounced tasks for Celery: collapse a burst of calls into one run."""

from __future__ import annotations

from . import signals
from . import worker_signals as _worker_signals  # noqa: F401  (connects the signals)
from .admin import DebounceAdmin
from .bootstep import DispatcherStep, install
from .bulk import enqueue_many
from .dispatcher import Dispatcher
from .errors import (
    DebounceBackendError,
    DebounceConfigError,
    DebounceError,
    DebounceKeyError,
    DebouncePayloadError,
    WindowNotFound,
    WindowNotPending,
)
from .task import DebouncedTask, send_task

__version__ = "0.1.0"

__all__ = [
    "DebounceAdmin",
    "DebounceBackendError",
    "DebounceConfigError",
    "DebounceError",
    "DebounceKeyError",
    "DebouncePayloadError",
    "DebouncedTask",
    "Dispatcher",
    "DispatcherStep",
    "WindowNotFound",
    "WindowNotPending",
    "enqueue_many",
    "install",
    "send_task",
    "signals",
]
