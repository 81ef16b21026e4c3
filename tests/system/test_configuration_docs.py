"""docs/configuration.md must list every option and setting with its real default."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from celery_debounce import DebouncedTask
from celery_debounce.producer.options import OPTION_NAMES, TaskDefaults
from celery_debounce.settings import DEFAULTS

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `(\w+)` \| `([^`]*)` \|", re.M)


def section(title: str) -> dict[str, object]:
    """The `name` -> literal default rows of the table under '## title'."""
    text = DOC.read_text("utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end >= 0 else None]
    rows = ROW.findall(body)
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), f"duplicate rows in '{title}'"
    return {name: ast.literal_eval(default) for name, default in rows}


def test_every_setting_is_documented_with_its_default() -> None:
    documented = section("Settings")
    assert sorted(documented) == sorted(DEFAULTS), "settings table and DEFAULTS differ"
    for name, default in DEFAULTS.items():
        assert documented[name] == default and type(documented[name]) is type(default), name


def test_every_task_option_is_documented_with_its_default() -> None:
    documented = section("Task options")
    assert sorted(documented) == sorted(OPTION_NAMES)
    for name in OPTION_NAMES:
        assert documented[name] == getattr(TaskDefaults, name), name
        assert documented[name] == getattr(DebouncedTask, name), name


def test_every_per_call_option_is_documented() -> None:
    documented = section("Per-call options")
    assert sorted(documented) == sorted(OPTION_NAMES)
    assert all(value is None for value in documented.values())  # None: the task's value
