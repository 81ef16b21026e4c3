"""The result a debounced call returns: Celery's ``AsyncResult``, built lighter.

``AsyncResult.__init__`` builds a vine promise (``on_ready``, with a weak reference
to a bound method) for every result, although only ``.then()`` and the asynchronous
backends' waiting ever use it. :func:`light_result` returns an instance of a
subclass of the app's own ``AsyncResult`` class that builds that promise on first
use, and looks the task's backend up on first use too (``app.backend`` is per
thread: a result handed to another thread before its first use gets that
thread's instance of the same backend); everything else is Celery's (``get``,
``state``, ``then``, ``forget``, canvas, ``__del__``). It pickles as the app's
``AsyncResult`` does (to ``current_app.AsyncResult(id, backend, ...)``: an ordinary
``AsyncResult``).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task
from celery.result import AsyncResult
from vine import promise

from .call import cached_attribute


class _Light:
    """Mixed in before the app's ``AsyncResult`` class (see :func:`result_class`)."""

    app: Any
    id: Any
    parent: Any

    def __init__(
        self,
        id: Any,
        backend: Any = None,
        task_name: Any = None,
        app: Any = None,
        parent: Any = None,
    ) -> None:
        # AsyncResult.__init__ without the promise; the class is bound to its app
        if id is None:
            raise ValueError(f"AsyncResult requires valid id, not {type(id)}")
        if app is not None:
            self.app = app
        self.id = id
        if backend is not None:
            self.__dict__["_backend"] = backend
        self.parent = parent
        self._cache = None
        self._ignored = False

    _debounce_task: Any = None

    @property
    def backend(self) -> Any:
        """The task's backend (``Task.AsyncResult`` passes ``task.backend``), looked
        up on first use rather than on every call."""
        backend = self.__dict__.get("_backend")
        if backend is None:
            task = self._debounce_task
            backend = self.__dict__["_backend"] = (
                task.backend if task is not None else self.app.backend
            )
        return backend

    @backend.setter
    def backend(self, value: Any) -> None:
        self.__dict__["_backend"] = value

    def __del__(self) -> None:
        # AsyncResult.__del__ drops the result from its backend's pending results; a
        # result becomes pending only through its backend (then, get, ...), which
        # looks the backend up: nothing to drop while it was never looked up
        if "_backend" in self.__dict__:
            super().__del__()  # type: ignore[misc]

    @property
    def on_ready(self) -> promise:
        ready: promise | None = self.__dict__.get("_on_ready")
        if ready is None:
            ready = self.__dict__["_on_ready"] = promise(self._on_fulfilled, weak=True)  # type: ignore[attr-defined]
        return ready

    @on_ready.setter
    def on_ready(self, value: promise) -> None:
        self.__dict__["_on_ready"] = value


def result_class(app: Celery) -> type[AsyncResult]:
    """The light subclass of ``app.AsyncResult`` (built once per app)."""
    base = cached_attribute(app, "AsyncResult")
    cached: tuple[type[AsyncResult], type[AsyncResult]] | None = app.__dict__.get(
        "_debounce_result"
    )
    if cached is not None and cached[0] is base:
        return cached[1]
    light: type[AsyncResult] = type(
        "AsyncResult",
        (_Light, base),
        {"__module__": base.__module__, "__qualname__": base.__qualname__},
    )
    app.__dict__["_debounce_result"] = (base, light)
    return light


def light_result(task: Task, task_id: str) -> AsyncResult:
    """``task.AsyncResult(task_id)``, lighter; a task class that overrides
    ``AsyncResult`` gets its own method."""
    if task.__class__.AsyncResult is not Task.AsyncResult:
        return task.AsyncResult(task_id)
    result = result_class(task.app)(task_id)
    result._debounce_task = task
    return result
