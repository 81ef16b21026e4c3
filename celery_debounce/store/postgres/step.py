"""One statement of the store, sent with the transaction's settings in one round trip.

Each operation is one function call of the schema. It is sent as a :class:`Step` and run
by the store in a pipeline after a ``set_config(..., true)`` of the store's settings:
both in one implicit transaction, ended by one Sync, so the settings last for that
transaction only. No session state and no server-side prepared statements: the store
works unchanged behind a pooler in transaction mode (PgBouncer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Step:
    """A statement and its parameters; ``first``: the answer is its first row (or None),
    else every row."""

    sql: str
    params: Any = None
    first: bool = True


def one(sql: str, params: Any = None) -> Step:
    """A statement whose answer is its first row (None when it has none)."""
    return Step(sql, params, True)


def many(sql: str, params: Any = None) -> Step:
    """A statement whose answer is every row."""
    return Step(sql, params, False)


def search_path(schema: str) -> str:
    """A ``search_path`` naming ``schema`` alone (quoted: any name is taken as it is)."""
    return '"' + schema.replace('"', '""') + '"'
