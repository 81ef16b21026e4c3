"""The worker bootstep that runs a dispatcher inside ``celery worker``."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, bootsteps
from celery.signals import worker_init

from ..errors import DebounceConfigError
from ..settings import DEFAULTS, parse_bool
from ..store import store_for
from ..store.checks import warn_if_evicting
from ..worker import signals as worker_signals  # noqa: F401  (connects the claim/finish signals)
from .dispatcher import Dispatcher
from .process import DispatcherProcess, green_pool

logger = logging.getLogger("celery_debounce.worker")


class DispatcherStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs a :class:`Dispatcher` thread in the worker's main process, or with
    ``debounce_dispatcher_process = True`` a supervised child process
    (:class:`~celery_debounce.dispatch.process.DispatcherProcess`).

    Switched off with ``app.conf.debounce_dispatcher = False``.
    """

    label = "debounce dispatcher"

    def include_if(self, parent: Any) -> bool:
        value = parent.app.conf.get("debounce_dispatcher")
        # "False" from an environment-driven settings module means False; garbage is refused
        return parse_bool(
            "debounce_dispatcher", DEFAULTS["debounce_dispatcher"] if value is None else value
        )

    def create(self, parent: Any) -> Dispatcher | DispatcherProcess:
        # The step framework calls start()/stop() on what create() returns.
        app = parent.app
        name = f"worker-{parent.hostname}"
        value = app.conf.get("debounce_dispatcher_process")
        if parse_bool(
            "debounce_dispatcher_process",
            DEFAULTS["debounce_dispatcher_process"] if value is None else value,
        ):
            if not green_pool(parent):
                return DispatcherProcess(app, name)
            logger.info(
                "debounce: debounce_dispatcher_process is ignored under a gevent or "
                "eventlet pool (no fork there): the dispatcher runs as a thread"
            )
        return Dispatcher(app, name=name)

    def start(self, parent: Any) -> None:
        super().start(parent)
        dispatcher: Dispatcher | DispatcherProcess = self.obj
        store = store_for(parent.app)
        settings = store.settings
        where = (
            f"process pid {dispatcher.pid}"
            if isinstance(dispatcher, DispatcherProcess)
            else "thread"
        )
        logger.info(
            "debounce: embedded dispatcher %s started (%s, prefix %r, %d shard(s), poll %dms)",
            dispatcher.name,
            where,
            settings.key_prefix,
            settings.shards,
            settings.poll_interval_ms,
        )
        # beside the worker's start-up: a hung Redis must not hold the worker up
        threading.Thread(
            target=warn_if_evicting,
            args=(store, dispatcher.name, logger),
            name="debounce-eviction-check",
            daemon=True,
        ).start()

    def stop(self, parent: Any) -> None:
        super().stop(parent)
        self._stopped()

    def terminate(self, parent: Any) -> None:  # a cold shutdown calls this instead of stop
        super().terminate(parent)
        self._stopped()

    def _stopped(self) -> None:
        if self.obj is not None:
            logger.info("debounce: embedded dispatcher %s stopped", self.obj.name)


def install(app: Celery) -> None:
    """Run a dispatcher in this app's workers even if it registers no DebouncedTask.

    Needed only for workers of an app whose producers use
    :func:`celery_debounce.send_task` for tasks that are not DebouncedTask.
    """
    app._debounce_installed = True  # type: ignore[attr-defined, unused-ignore]
    app.steps["worker"].add(DispatcherStep)


def uses_debounce(app: Celery) -> bool:
    from ..producer.task import DebouncedTask

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


def refuse_invalid_tasks(app: Celery) -> None:
    """Raise ``DebounceConfigError`` listing each refused debounced task of ``app``."""
    from ..producer.task import refused_tasks

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
        from ..producer.task import refused_tasks

        if refused_tasks(app):
            app.steps["worker"].add(RefusedTasksStep)
        app.steps["worker"].add(DispatcherStep)


worker_init.connect(_add_dispatcher_step, weak=False)
