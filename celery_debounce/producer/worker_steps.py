"""What an app that uses the package brings into its workers, connected by
:func:`install` (idempotent; never by an import): the worker's receivers
(:func:`celery_debounce.worker.install`), and at ``worker_init`` for an app that uses
debounce (a ``DebouncedTask``, or :func:`celery_debounce.install`) the worker
bootsteps: :class:`RefusedTasksStep` when a debounced task's definition was refused,
and the embedded dispatcher's :class:`~celery_debounce.dispatch.bootstep.DispatcherStep`.

:func:`install` runs where it must hold: when a ``DebouncedTask`` is bound to an app
(``DebouncedTask.on_bound``; in a worker, before ``worker_init``, as the worker
finalizes its app) and when a public name of the package is first used. It reaches
the worker and dispatch stages only when called (docs/design.md, "Module map": the
producer imports neither at import time).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, bootsteps
from celery.signals import worker_init

from ..errors import DebounceConfigError

__all__ = [
    "PublishDefinitionsStep",
    "RefusedTasksStep",
    "StoreCheckStep",
    "install",
    "invalid_tasks_message",
    "refuse_invalid_tasks",
    "uses_debounce",
]

_installed = False
logger = logging.getLogger(__name__)


def install() -> None:
    """Connect the worker's receivers and the ``worker_init`` hook that adds the
    package's worker bootsteps, once per process (two threads racing here connect
    each receiver once: Celery's ``Signal.connect`` keeps one entry per receiver)."""
    global _installed
    if _installed:
        return
    from ..worker import install as install_worker

    install_worker()
    worker_init.connect(_add_dispatcher_step, weak=False)
    _installed = True


def uses_debounce(app: Celery) -> bool:
    """True for an app with a ``DebouncedTask`` or one :func:`celery_debounce.install`
    was called for (finalizes the app)."""
    from .task import DebouncedTask

    if getattr(app, "_debounce_installed", False):
        return True
    return any(isinstance(task, DebouncedTask) for task in app.tasks.values())


class RefusedTasksStep(bootsteps.Step):  # type: ignore[misc]
    """Stops the worker's start-up when a debounced task's definition was refused
    while the app finalized (``task_definition.refuse_later``), with every such task's error."""

    label = "debounce task check"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        refuse_invalid_tasks(parent.app)
        super().__init__(parent, **kwargs)


class StoreCheckStep(bootsteps.Step):  # type: ignore[misc]
    """Stops the worker's start-up when the PostgreSQL store (``debounce_store_url``)
    refuses its database: no schema, or one older or newer than the package's (the
    error names it and the migrate command), or a server too old."""

    label = "debounce store check"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        from ..store import store_for

        store_for(parent.app)  # checks the server and the schema; an outage waits
        super().__init__(parent, **kwargs)


class PublishDefinitionsStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Writes the app's task definitions into the store as the worker starts
    (``producer/published.py``): producers by name read them. A store that cannot be
    written is logged, not fatal: the worker's own calls need no definition."""

    label = "debounce task definitions"

    def start(self, parent: Any) -> None:
        from ..errors import DebounceError
        from .published import publish

        try:
            found, written = publish(parent.app)
        except DebounceError as exc:
            logger.warning(
                "celery_debounce: task definitions not written (%s); producers by name "
                "(Node) refuse the tasks without one until `celery debounce publish` runs",
                exc,
            )
            return
        logger.info("celery_debounce: %d task definition(s), %d written", found, written)


def selects_postgres(app: Celery) -> bool:
    """``debounce_store_url`` names a PostgreSQL database (read as set, unchecked)."""
    from ..settings import POSTGRES_SCHEMES

    value = app.conf.get("debounce_store_url")
    return isinstance(value, str) and value.startswith(POSTGRES_SCHEMES)


def refuse_invalid_tasks(app: Celery) -> None:
    """Raise ``DebounceConfigError`` listing each refused debounced task of ``app``."""
    from .task import refused_tasks

    refused = refused_tasks(app)
    if refused:
        raise DebounceConfigError(invalid_tasks_message(refused))


def invalid_tasks_message(refused: dict[str, str]) -> str:
    """The one text the worker, ``celery debounce check`` and the Django check give."""
    lines = [f"{len(refused)} debounced task definition(s) refused:"]
    lines += [f"  {message}" for message in refused.values()]
    return "\n".join(lines)


def _add_dispatcher_step(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None and uses_debounce(app):
        from ..dispatch.bootstep import DispatcherStep
        from .task import refused_tasks

        if refused_tasks(app):
            app.steps["worker"].add(RefusedTasksStep)
        if selects_postgres(app):
            app.steps["worker"].add(StoreCheckStep)
        app.steps["worker"].add(DispatcherStep)
        app.steps["worker"].add(PublishDefinitionsStep)
