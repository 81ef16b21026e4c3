"""The PostgreSQL store's schema, version 4 (store/postgres/steps/4.sql)."""

from __future__ import annotations

from django.db import migrations

from . import schema_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies = [("celery_debounce", "0003_schema_version_3")]
    operations = [migrations.RunPython(schema_version(4), migrations.RunPython.noop)]
