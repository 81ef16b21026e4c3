"""The worker bootstep that runs a dispatcher inside ``celery worker``.

A worker of an app that uses debounce adds it at ``worker_init``
(:mod:`celery_debounce.producer.worker_steps`); :func:`install` adds it for an app
that registers no ``DebouncedTask``."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, bootsteps

from ..settings import DEFAULTS, parse_bool
from ..store import store_for
from ..store.redis.checks import warn_if_evicting
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
    :func:`celery_debounce.send_task` for tasks that are not DebouncedTask. Connects
    the worker's receivers too (:func:`celery_debounce.worker.install`): the runs of
    such an app's windows are claimed and finished.
    """
    from ..worker import install as install_worker

    install_worker()
    app._debounce_installed = True  # type: ignore[attr-defined, unused-ignore]
    app.steps["worker"].add(DispatcherStep)
