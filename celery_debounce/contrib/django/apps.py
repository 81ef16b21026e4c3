"""The Django app whose ``ready`` registers the debounce system check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks


class DebounceConfig(AppConfig):  # type: ignore[misc]
    name = "celery_debounce.contrib.django"
    label = "celery_debounce"
    verbose_name = "celery_debounce"

    def ready(self) -> None:
        checks.register(check_debounced_tasks, "celery_debounce")


def check_debounced_tasks(
    app_configs: Sequence[Any] | None = None, **_: Any
) -> list[checks.CheckMessage]:
    """``celery_debounce.E001`` per refused task or setting, for every Celery app of
    the process that defines a debounced task (the project's app is imported by
    ``proj/__init__.py``, as Celery's Django guide writes it)."""
    from celery._state import _get_active_apps
    from django.apps import apps

    from ...ops.validation import check_app
    from ...producer.worker_steps import uses_debounce
    from .. import import_problem

    errors: list[checks.CheckMessage] = []
    for app in list(_get_active_apps()):
        try:
            problems = check_app(app, packages=[c.name for c in apps.get_app_configs()])
        except Exception as exc:  # a tasks module that fails to import
            problems = [import_problem(exc)]
        if not problems and not uses_debounce(app):
            continue
        for problem in problems:
            errors.append(
                checks.Error(
                    problem.message.removeprefix(f"{problem.where}: "),
                    hint="a worker of this app refuses to start with it (celery -A "
                    f"{app.main or 'proj'} debounce check lists the same)",
                    obj=problem.where,
                    id="celery_debounce.E001",
                )
            )
    return errors
