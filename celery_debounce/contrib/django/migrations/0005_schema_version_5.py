"""The PostgreSQL store's schema, version 5 (store/postgres/steps/5.sql, then every function)."""

from __future__ import annotations

from django.db import migrations

from . import schema_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_debounce", "0004_schema_version_4")]
    operations = [migrations.RunPython(schema_version(5), migrations.RunPython.noop)]
