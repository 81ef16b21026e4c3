"""The PostgreSQL store's schema as Django migrations, one per schema version: each
brings the schema of the database it runs on to its version (``celery -A proj debounce
migrate`` does the same; either order, either twice). On another database vendor they
do nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def deployment_schema() -> str | None:
    """The schema of the deployment's tables, as the app's settings name it under
    Django's ``CELERY_`` namespace: ``CELERY_DEBOUNCE_POSTGRES_SCHEMA``, else a
    ``CELERY_DEBOUNCE_KEY_PREFIX`` other than the default (as ``debounce_postgres_schema``
    and ``debounce_key_prefix`` do); None: the connection's ``search_path``."""
    from django.conf import settings

    from celery_debounce.settings import _postgres_schema

    return _postgres_schema(
        getattr(settings, "CELERY_DEBOUNCE_POSTGRES_SCHEMA", None),
        getattr(settings, "CELERY_DEBOUNCE_KEY_PREFIX", None),
    )


def schema_version(version: int) -> Callable[[Any, Any], None]:
    """A ``RunPython`` forward step: the schema at ``version`` at least (never lowered),
    in the deployment's schema (:func:`deployment_schema`)."""

    def forward(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor != "postgresql":
            return
        from celery_debounce.store.postgres import schema
        from celery_debounce.store.postgres.step import search_path

        named = deployment_schema()
        with schema_editor.connection.cursor() as cursor:
            if named is not None:
                cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {search_path(named)}")
                cursor.execute("SELECT set_config('search_path', %s, true)", [search_path(named)])
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
