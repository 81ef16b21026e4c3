"""The PostgreSQL store's schema, version 6 (store/postgres/steps/6.sql, then every function)."""

from __future__ import annotations

from django.db import migrations

from . import schema_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_debounce", "0005_schema_version_5")]
    operations = [migrations.RunPython(schema_version(6), migrations.RunPython.noop)]
