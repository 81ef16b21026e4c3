"""The PostgreSQL store's schema, version 3 (store/postgres/steps/3.sql)."""

from __future__ import annotations

from django.db import migrations

from . import schema_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_debounce", "0002_schema_version_2")]
    operations = [migrations.RunPython(schema_version(3), migrations.RunPython.noop)]
