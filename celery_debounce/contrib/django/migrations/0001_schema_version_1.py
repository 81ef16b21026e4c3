"""The PostgreSQL store's schema, version 1 (store/postgres/steps/1.sql)."""

from __future__ import annotations

from django.db import migrations

from . import schema_version


class Migration(migrations.Migration):  # type: ignore[misc]
    dependencies: list[tuple[str, str]] = []
    operations = [migrations.RunPython(schema_version(1), migrations.RunPython.noop)]
