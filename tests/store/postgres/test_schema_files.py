"""The PostgreSQL schema's SQL files: numbered steps of table changes, and one file per
function, applied whole by every migration."""

from __future__ import annotations

import re
from pathlib import Path

from celery_debounce.store.postgres import schema

SQL = Path(schema.__file__).parent
DECLARED = re.compile(r"^CREATE (OR REPLACE )?FUNCTION (\w+)\s*\(", re.M)


def test_each_function_has_one_file_that_declares_only_it_each_time_or_replace() -> None:
    files = sorted(path.stem for path in (SQL / "functions").glob("*.sql"))
    assert sorted(schema.FUNCTIONS) == files and len(set(schema.FUNCTIONS)) == len(files)
    for name in schema.FUNCTIONS:
        declared = DECLARED.findall((SQL / "functions" / f"{name}.sql").read_text())
        assert declared and {(replace, found) for replace, found in declared} == {
            ("OR REPLACE ", name)
        }, name


def test_the_steps_are_numbered_from_1_to_the_version_and_declare_no_function() -> None:
    steps = sorted(int(path.stem) for path in (SQL / "steps").glob("*.sql"))
    assert steps == list(range(1, schema.SCHEMA_VERSION + 1))
    for step in steps:
        assert DECLARED.findall((SQL / "steps" / f"{step}.sql").read_text()) == [], step


def test_every_migration_to_this_version_applies_every_function_after_its_steps() -> None:
    functions = schema.functions_sql()
    for found in (None, 1, schema.SCHEMA_VERSION - 1, schema.SCHEMA_VERSION):
        steps = schema.steps_to(found, schema.SCHEMA_VERSION)  # then the grants again
        assert steps[-2:] == [functions, schema.regrants_sql()], found
        assert functions not in steps[:-2], found
    # a Django migration to an older version: its steps only
    assert functions not in schema.steps_to(None, 1)
