"""The Django app whose ``ready`` registers the debounce system checks: the task
definitions and settings always, the store reached under ``check --deploy``."""

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
        checks.register(check_store_reached, "celery_debounce", deploy=True)


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


def check_store_reached(
    app_configs: Sequence[Any] | None = None, **_: Any
) -> list[checks.CheckMessage]:
    """``celery_debounce.E002`` per problem found on reaching the windows' store
    (``manage.py check --deploy``), for every Celery app of the process that defines a
    debounced task and whose settings are valid: what ``debounce check --connect``
    reports."""
    from celery._state import _get_active_apps

    from ...errors import DebounceError
    from ...ops.validation import reach_app
    from ...producer.worker_steps import uses_debounce

    errors: list[checks.CheckMessage] = []
    for app in list(_get_active_apps()):
        if not uses_debounce(app):
            continue
        try:
            reached = reach_app(app)
        except DebounceError:  # a refused setting: check_debounced_tasks names it
            continue
        for kind, message in reached.problems:
            errors.append(
                checks.Error(
                    message,
                    hint=f"celery -A {app.main or 'proj'} debounce check --connect lists the same",
                    obj=f"store/{kind}",
                    id="celery_debounce.E002",
                )
            )
    return errors
