"""Former home of the store's connection and script runner; now :mod:`celery_debounce.store`.

Kept so code written against it (``Backend``, ``backend_for``) keeps working:
``Backend`` is :class:`~celery_debounce.store.WindowStore`.
"""

from __future__ import annotations

from .layout import as_text
from .store import (
    SCRIPT_NAMES,
    WindowStore,
    script_source,
    store_for,
    translate_errors,
)

Backend = WindowStore
backend_for = store_for

__all__ = ["SCRIPT_NAMES", "Backend", "as_text", "backend_for", "script_source",
           "translate_errors"]
