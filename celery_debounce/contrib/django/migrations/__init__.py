"""The PostgreSQL store's schema as Django migrations, one per schema version: each
brings the schema of the database it runs on to its version (``celery -A proj debounce
migrate`` does the same; either order, either twice). On another database vendor they
do nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def schema_version(version: int) -> Callable[[Any, Any], None]:
    """A ``RunPython`` forward step: the schema at ``version`` at least (never lowered)."""

    def forward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        from celery_debounce.store.postgres import schema

        with schema_editor.connection.cursor() as cursor:
            cursor.execute(schema.LOCK_SQL, [schema.MIGRATE_LOCK])
            cursor.execute(schema.HAS_SCHEMA_SQL)
            found = None
            if cursor.fetchone()[0]:
                cursor.execute(schema.VERSION_SQL)
                found = cursor.fetchone()[0]
            steps = schema.steps_to(found, version)
            for step in steps:
                cursor.execute(step)
            if steps:
                cursor.execute(schema.WRITE_VERSION_SQL, [version])

    return forward
