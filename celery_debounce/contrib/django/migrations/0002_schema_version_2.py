"""The PostgreSQL store's schema, version 2 (store/postgres/steps/2.sql)."""

from __future__ import annotations

from django.db import migrations

from . import schema_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_debounce", "0001_schema_version_1")]
    operations = [migrations.RunPython(schema_version(2), migrations.RunPython.noop)]
