"""The worker's embedded dispatcher in a child process (``debounce_dispatcher_process``).

Celery's own embedded beat (``celery worker -B``) runs the same way: a billiard
``Process`` forked from the worker's main process. Here the dispatcher no longer
shares the main process's interpreter lock with the consumer that hands runs to the
pool, so at hundreds of runs a second its round trips no longer delay task starts.

The worker owns the child: it starts it with the worker, restarts it (with back-off)
if it dies, and stops it with SIGTERM (SIGKILL after the stop timeout) when the worker
stops. No dispatcher outlives its worker:

* the worker's pid is read in the worker, before the fork (a pid the child read itself
  would be init's if the worker died before it looked);
* on Linux the child asks for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), then
  checks that its parent is still that pid (a worker that died before the ``prctl``)
  and stops at once if not, before starting anything;
* it keeps comparing its parent with that pid every :data:`TICK_S` (any platform).

``PR_SET_PDEATHSIG`` fires when the *thread* that forked exits, not only the process.
Every child is therefore forked by the supervisor thread, which lives exactly as long
as the child is supervised: if it ended for any reason, the child would stop too
rather than run on unsupervised. The supervisor blocks SIGTERM, so each child starts
with SIGTERM blocked and unblocks it once its own handler is set: a stop that lands
during the child's start is kept pending for that handler, not run by the worker's.
"""

from __future__ import annotations

import ctypes
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
_PR_SET_PDEATHSIG = 1


def _term_when_parent_dies() -> None:
    """Linux: SIGTERM this process when the thread that forked it ends."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(
            ctypes.c_int(_PR_SET_PDEATHSIG),
            ctypes.c_ulong(signal.SIGTERM),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )
    except (OSError, AttributeError):  # no prctl: the pid comparison below still holds
        pass


class _Child(Process):  # type: ignore[misc]
    def __init__(self, app: Celery, name: str) -> None:
        super().__init__(name=f"debounce-{name}", daemon=False)
        self.app = app
        self.dispatcher_name = name
        #: read here, in the worker before the fork; see the module docstring
        self.parent_pid = os.getpid()

    def _orphaned(self) -> bool:
        return os.getppid() != self.parent_pid

    def run(self) -> None:
        from .dispatcher import Dispatcher

        reset_signals(full=False)
        close_open_fds([sys.__stdin__, sys.__stdout__, sys.__stderr__, *iter_open_logger_fds()])
        # The handler only sets a flag: taking a lock there (Event.set) deadlocks when the
        # signal lands while this thread holds that lock (seen: a child that never stopped)
        terms: list[int] = []
        signal.signal(signal.SIGTERM, lambda signum, _frame: terms.append(signum))
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's Ctrl-C stops us with TERM
        _term_when_parent_dies()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked at the fork
        if self._orphaned():  # the worker died before the prctl: start nothing
            logger.warning(
                "debounce: dispatcher %s: its worker (pid %d) is gone before it "
                "started; not starting",
                self.dispatcher_name,
                self.parent_pid,
            )
            return
        self.app.set_default()
        self.app.set_current()
        dispatcher = Dispatcher(self.app, name=self.dispatcher_name)
        if terms:  # stopped (or, by the prctl, orphaned) while it was being built
            dispatcher.close()
            if self._orphaned():
                self._log_gone("not started")
        else:
            thread = dispatcher.start()
            while thread.is_alive() and not terms and not self._orphaned():
                time.sleep(TICK_S)
            gone = self._orphaned()
            if gone:
                self._log_gone("stopping")
            dispatcher.stop()
            # A killed worker's forking thread can exit before its main thread: the
            # prctl's SIGTERM then lands while the parent still reads as the worker
            if not gone and self._orphaned():
                self._log_gone("stopped")

    def _log_gone(self, what: str) -> None:
        logger.warning(
            "debounce: dispatcher %s: its worker (pid %d) is gone; %s",
            self.dispatcher_name,
            self.parent_pid,
            what,
        )


class DispatcherProcess:
    """Runs a :class:`~celery_debounce.dispatch.dispatcher.Dispatcher` in a supervised child."""

    def __init__(self, app: Celery, name: str, stop_timeout: float = 10.0) -> None:
        self.app = app
        self.name = name
        self.stop_timeout = stop_timeout
        self._child: _Child | None = None
        self._stopping = threading.Event()
        # held while a child is forked and while stop() begins: after stop() set
        # _stopping, no child is forked, and the child stop() signals is the last one
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._supervisor: threading.Thread | None = None
        #: how many times a dead child was started again
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        child = self._child
        return None if child is None else child.pid

    def start(self) -> None:
        """Start the supervisor, which forks the first child; returns once it is forked."""
        self._stopping.clear()
        self._started.clear()
        self._start_error = None
        self._supervisor = threading.Thread(
            target=self._supervise, daemon=True, name=f"debounce-{self.name}-supervisor"
        )
        self._supervisor.start()
        self._started.wait()
        if self._start_error is not None:
            self._supervisor.join()
            self._supervisor = None
            raise self._start_error

    def _spawn(self) -> bool:
        """Fork a child, unless stop() began (then False)."""
        with self._lock:
            if self._stopping.is_set():
                return False
            child = _Child(self.app, self.name)
            child.start()
            self._child = child
            return True

    def _supervise(self) -> None:
        """Forks every child (see the module docstring), and is the only thread that waits
        for (reaps) it: two waiting threads race."""
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            if not self._spawn():
                return
        except BaseException as exc:  # handed to start()'s caller
            self._start_error = exc
            return
        finally:
            self._started.set()
        backoff = RESTART_BACKOFF_S[0]
        while True:
            child = self._child
            assert child is not None
            child.join(PARENT_CHECK_S)
            if child.exitcode is None:
                continue
            if self._stopping.is_set():
                return
            logger.warning(
                "debounce: embedded dispatcher process %s (pid %s) exited with "
                "code %s; starting it again in %.0fs",
                self.name,
                child.pid,
                child.exitcode,
                backoff,
            )
            if self._stopping.wait(backoff):
                return
            try:
                if not self._spawn():
                    return
            except OSError as exc:  # fork failed (EAGAIN, ENOMEM): try again later
                logger.error(
                    "debounce: embedded dispatcher process %s could not be started again: %s",
                    self.name,
                    exc,
                )
            else:
                self.restarts += 1
                logger.warning(
                    "debounce: embedded dispatcher process %s started again (pid %s)",
                    self.name,
                    self.pid,
                )
            backoff = min(backoff * 2, RESTART_BACKOFF_S[1])

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM the child and wait for its clean stop; SIGKILL it after ``timeout``."""
        with self._lock:  # waits out a fork under way: its child is the one to stop
            self._stopping.set()
            supervisor, child = self._supervisor, self._child
        if supervisor is None or child is None:
            return
        self._signal(child, signal.SIGTERM)
        supervisor.join(self.stop_timeout if timeout is None else timeout)
        if supervisor.is_alive():
            logger.warning(
                "debounce: embedded dispatcher process %s (pid %s) did not "
                "stop in time; killing it",
                self.name,
                child.pid,
            )
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
