"""The worker's embedded dispatcher in a child process (``debounce_dispatcher_process``).

Celery's own embedded beat (``celery worker -B``) runs the same way: a billiard
``Process`` forked from the worker's main process. Here the dispatcher no longer
shares the main process's interpreter lock with the consumer that hands runs to the
pool, so at hundreds of runs a second its round trips no longer delay task starts.

The worker owns the child: it starts it with the worker, restarts it (with back-off)
if it dies, and stops it with SIGTERM (SIGKILL after the stop timeout) when the worker
stops. The child stops by itself within a second when its parent is gone (a worker
SIGKILLed), so no dispatcher outlives its worker.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from billiard.common import reset_signals
from billiard.context import Process
from celery import Celery
from celery.platforms import close_open_fds
from celery.utils.log import iter_open_logger_fds

logger = logging.getLogger("celery_debounce.worker")

#: First and longest wait before a dead child is started again (seconds).
RESTART_BACKOFF_S = (1.0, 30.0)
#: How often the supervisor looks at its child (seconds).
PARENT_CHECK_S = 1.0
#: How often the child looks for a stop request and for its parent (seconds).
TICK_S = 0.1


class _Child(Process):  # type: ignore[misc]
    def __init__(self, app: Celery, name: str) -> None:
        super().__init__(name=f"debounce-{name}", daemon=False)
        self.app = app
        self.dispatcher_name = name

    def run(self) -> None:
        from .dispatcher import Dispatcher

        reset_signals(full=False)
        close_open_fds([sys.__stdin__, sys.__stdout__, sys.__stderr__,
                        *iter_open_logger_fds()])
        self.app.set_default()
        self.app.set_current()
        parent = os.getppid()
        # The handler only sets a flag: taking a lock there (Event.set) deadlocks when the
        # signal lands while this thread holds that lock (seen: a child that never stopped)
        terms: list[int] = []
        signal.signal(signal.SIGTERM, lambda signum, _frame: terms.append(signum))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's Ctrl-C stops us with TERM
        dispatcher = Dispatcher(self.app, name=self.dispatcher_name)
        thread = dispatcher.start()
        while thread.is_alive() and not terms:
            time.sleep(TICK_S)
            if os.getppid() != parent:
                logger.warning("debounce: dispatcher %s: its worker (pid %d) is gone; "
                               "stopping", self.dispatcher_name, parent)
                break
        dispatcher.stop()


class DispatcherProcess:
    """Runs a :class:`~celery_debounce.dispatcher.Dispatcher` in a supervised child."""

    def __init__(self, app: Celery, name: str, stop_timeout: float = 10.0) -> None:
        self.app = app
        self.name = name
        self.stop_timeout = stop_timeout
        self._child: _Child | None = None
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        #: how many times a dead child was started again
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        child = self._child
        return None if child is None else child.pid

    def start(self) -> None:
        self._stopping.clear()
        self._spawn()
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name=f"debounce-{self.name}-supervisor")
        self._supervisor.start()

    def _spawn(self) -> None:
        child = _Child(self.app, self.name)
        child.start()
        self._child = child

    def _supervise(self) -> None:
        """The only thread that waits for (reaps) the child: two waiting threads race."""
        backoff = RESTART_BACKOFF_S[0]
        while True:
            child = self._child
            assert child is not None
            child.join(PARENT_CHECK_S)
            if child.exitcode is None:
                continue
            if self._stopping.is_set():
                return
            logger.warning("debounce: embedded dispatcher process %s (pid %s) exited with "
                           "code %s; starting it again in %.0fs", self.name, child.pid,
                           child.exitcode, backoff)
            if self._stopping.wait(backoff):
                return
            self._spawn()
            self.restarts += 1
            logger.warning("debounce: embedded dispatcher process %s started again (pid %s)",
                           self.name, self.pid)
            backoff = min(backoff * 2, RESTART_BACKOFF_S[1])

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM the child and wait for its clean stop; SIGKILL it after ``timeout``."""
        self._stopping.set()
        supervisor, child = self._supervisor, self._child
        if supervisor is None or child is None:
            return
        self._signal(child, signal.SIGTERM)
        supervisor.join(self.stop_timeout if timeout is None else timeout)
        if supervisor.is_alive():
            logger.warning("debounce: embedded dispatcher process %s (pid %s) did not "
                           "stop in time; killing it", self.name, child.pid)
            self._signal(child, signal.SIGKILL)
            supervisor.join(PARENT_CHECK_S * 3)
        self._supervisor = None

    @staticmethod
    def _signal(child: _Child, signum: int) -> None:
        if child.pid is not None and child.exitcode is None:
            try:
                os.kill(child.pid, signum)
            except ProcessLookupError:  # it ended on its own meanwhile
                pass


def green_pool(parent: Any) -> bool:
    """Whether the worker runs a gevent or eventlet pool (no fork there: a thread is used)."""
    pool = getattr(parent, "pool_cls", None)
    module = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    return bool(module) and str(module).endswith(("gevent", "eventlet"))
