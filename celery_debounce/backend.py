"""Former home of the store's connection and script runner; now :mod:`celery_debounce.store`.

Kept for one release so code written against it (``Backend``, ``backend_for``) keeps
working, with a :class:`DeprecationWarning` on import: ``Backend`` is
:class:`~celery_debounce.store.WindowStore`, ``backend_for`` is
:func:`~celery_debounce.store.store_for`.
"""

from __future__ import annotations

import warnings

from .layout import as_text
from .store import (
    SCRIPT_NAMES,
    WindowStore,
    script_source,
    store_for,
    translate_errors,
)

warnings.warn("celery_debounce.backend is deprecated: import WindowStore and store_for "
              "from celery_debounce.store", DeprecationWarning, stacklevel=2)

Backend = WindowStore
backend_for = store_for

__all__ = ["SCRIPT_NAMES", "Backend", "as_text", "backend_for", "script_source",
           "translate_errors"]
