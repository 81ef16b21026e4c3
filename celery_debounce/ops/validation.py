"""Deploy-time checks of an app's debounced tasks and settings: ``celery debounce
check`` and the Django system check (``celery_debounce.contrib.django``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from celery import Celery

from ..errors import DebounceConfigError
from ..store.reach import Reached


class Problem(NamedTuple):
    """One refused definition: ``where`` is the task's name, or ``settings``."""

    where: str
    message: str


def check_app(app: Celery, *, packages: Sequence[str] | None = None) -> list[Problem]:
    """Every refused debounced task definition of ``app`` and a refused configuration,
    each with the message the worker refuses to start with; nothing is connected.

    First imports the modules a worker imports (``imports``, ``include``,
    ``autodiscover_tasks``), so tasks defined there are checked too. ``packages``
    (Django's apps): import their ``tasks`` modules instead of sending Celery's
    ``import_modules`` signal, whose Django fixup runs the system checks again.
    """
    from ..producer.task import refused_tasks
    from ..settings import Settings

    problems: list[Problem] = []
    loader = app.loader
    try:
        if packages is None:
            loader.import_default_modules()
        else:
            for module in loader.default_modules:
                loader.import_task_module(module)
            loader.autodiscover_tasks(list(packages))
    except (DebounceConfigError, ImportError) as exc:  # a definition in a finalized app
        problems.append(Problem("imports", f"{type(exc).__name__}: {exc}"))
    try:
        Settings.from_app(app)
    except DebounceConfigError as exc:
        problems.append(Problem("settings", str(exc)))
    problems += [Problem(name, message) for name, message in refused_tasks(app).items()]
    return problems


def reach_app(app: Celery) -> Reached:
    """What reaching ``app``'s windows' store found (``check --connect``, Django's
    ``check --deploy``); the store built for it is closed after."""
    from ..settings import Settings
    from ..store import build_store

    store = build_store(Settings.from_app(app))
    try:
        return store.reach()
    finally:
        close = getattr(store, "close", None)
        if close is not None:
            close()
