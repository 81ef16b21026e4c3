"""Debounced tasks for Celery: collapse a burst of calls into one run."""

from __future__ import annotations

from . import worker_signals as _worker_signals  # noqa: F401  (connects the signals)
from .bootstep import DispatcherStep, install
from .bulk import enqueue_many
from .dispatcher import Dispatcher
from .errors import (
    DebounceBackendError,
    DebounceConfigError,
    DebounceError,
    DebounceKeyError,
    DebouncePayloadError,
)
from .task import DebouncedTask, send_task

__version__ = "0.1.0"

__all__ = [
    "DebounceBackendError",
    "DebounceConfigError",
    "DebounceError",
    "DebounceKeyError",
    "DebouncePayloadError",
    "DebouncedTask",
    "Dispatcher",
    "DispatcherStep",
    "enqueue_many",
    "install",
    "send_task",
]
