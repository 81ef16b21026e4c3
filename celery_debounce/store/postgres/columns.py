"""The columns that begin every record a read of the PostgreSQL store returns, and the
:class:`~celery_debounce.store.records.Record` fields they give: their one list."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["RECORD_COLUMNS", "record_fields", "select_record"]

#: A window's id, ident, first call and deadline (epoch ms), max wait (ms) and calls, in
#: this order, first in every read of a record (``debounce_take``'s rows begin alike).
RECORD_COLUMNS = (
    "task_id, ident, debounce_ms(first_seen), debounce_ms(deadline), max_wait_ms, calls"
)


def select_record(rest: str) -> str:
    """``SELECT`` :data:`RECORD_COLUMNS` followed by ``rest`` (constants of the store's
    modules, never a caller's text: values go as parameters)."""
    return "SELECT " + RECORD_COLUMNS + rest


def record_fields(row: Sequence[Any]) -> dict[str, Any]:
    """The :data:`RECORD_COLUMNS` of ``row`` (its first six values) as record fields."""
    task_id, ident, first_seen, deadline, max_wait, calls = row[:6]
    return {
        "task_id": task_id,
        "ident": ident,
        "first_seen_ms": int(first_seen),
        "deadline_ms": int(deadline),
        "max_wait_ms": int(max_wait),
        "calls": int(calls),
    }
