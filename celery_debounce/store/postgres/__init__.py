"""The PostgreSQL window store (in progress): ``PostgresStore`` and its schema.

Needs the ``postgres`` extra (``pip install celery-debounced[postgres]``: psycopg 3 and
psycopg_pool); nothing else of the package imports this module.
"""

from __future__ import annotations

from .schema import (
    SCHEMA_VERSION,
    SchemaMismatch,
    SchemaMissing,
    SchemaTooNew,
    SchemaTooOld,
)
from .store import PostgresStore

__all__ = [
    "SCHEMA_VERSION",
    "PostgresStore",
    "SchemaMismatch",
    "SchemaMissing",
    "SchemaTooNew",
    "SchemaTooOld",
]
