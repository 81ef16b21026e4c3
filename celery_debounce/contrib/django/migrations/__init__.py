"""The PostgreSQL store's schema as Django migrations, one per schema version: each
brings the schema of the database it runs on to its version (``celery -A proj debounce
migrate`` does the same; either order, either twice). On another database vendor they
do nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: The advisory lock ``PostgresStore.migrate()`` takes (store/postgres/schema.py).
_LOCK = "SELECT pg_advisory_xact_lock(%s)"
_FOUND = "SELECT to_regclass('debounce_schema') IS NOT NULL"
_VERSION = "SELECT max(version) FROM debounce_schema"
_WRITE = "UPDATE debounce_schema SET version = %s, written_at = clock_timestamp()"


def schema_version(version: int) -> Callable[[Any, Any], None]:
    """A ``RunPython`` forward step: the schema at ``version`` at least (never lowered)."""

    def forward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        from celery_debounce.store.postgres.schema import MIGRATE_LOCK, steps_to

        with schema_editor.connection.cursor() as cursor:
            cursor.execute(_LOCK, [MIGRATE_LOCK])
            cursor.execute(_FOUND)
            found = None
            if cursor.fetchone()[0]:
                cursor.execute(_VERSION)
                found = cursor.fetchone()[0]
            steps = steps_to(found, version)
            for step in steps:
                cursor.execute(step)
            if steps:
                cursor.execute(_WRITE, [version])

    return forward
