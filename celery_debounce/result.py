"""The result a debounced call returns: Celery's ``AsyncResult``, built lighter.

``AsyncResult.__init__`` builds a vine promise (``on_ready``, with a weak reference
to a bound method) for every result, although only ``.then()`` and the asynchronous
backends' waiting ever use it. :func:`light_result` returns an instance of a
subclass of the app's own ``AsyncResult`` class that builds that promise on first
use; everything else is Celery's (``get``, ``state``, ``then``, ``forget``, canvas,
``__del__``). It pickles as the app's ``AsyncResult`` does (to
``current_app.AsyncResult(id, backend, ...)``: an ordinary ``AsyncResult``).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task
from celery.result import AsyncResult
from vine import promise


class _Light:
    """Mixed in before the app's ``AsyncResult`` class (see :func:`result_class`)."""

    app: Any
    id: Any
    backend: Any
    parent: Any

    def __init__(self, id: Any, backend: Any = None, task_name: Any = None,
                 app: Any = None, parent: Any = None) -> None:
        # AsyncResult.__init__ without the promise; the class is bound to its app
        if id is None:
            raise ValueError(f"AsyncResult requires valid id, not {type(id)}")
        if app is not None:
            self.app = app
        self.id = id
        self.backend = backend or self.app.backend
        self.parent = parent
        self._cache = None
        self._ignored = False

    @property
    def on_ready(self) -> promise:
        ready: promise | None = self.__dict__.get("_on_ready")
        if ready is None:
            ready = self.__dict__["_on_ready"] = promise(
                self._on_fulfilled, weak=True)  # type: ignore[attr-defined]
        return ready

    @on_ready.setter
    def on_ready(self, value: promise) -> None:
        self.__dict__["_on_ready"] = value


def result_class(app: Celery) -> type[AsyncResult]:
    """The light subclass of ``app.AsyncResult`` (built once per app)."""
    base = app.AsyncResult
    cached: tuple[type[AsyncResult], type[AsyncResult]] | None = app.__dict__.get(
        "_debounce_result")
    if cached is not None and cached[0] is base:
        return cached[1]
    light: type[AsyncResult] = type("AsyncResult", (_Light, base), {
        "__module__": base.__module__, "__qualname__": base.__qualname__})
    app.__dict__["_debounce_result"] = (base, light)
    return light


def light_result(task: Task, task_id: str) -> AsyncResult:
    """``task.AsyncResult(task_id)``, lighter; a task class that overrides
    ``AsyncResult`` gets its own method."""
    if task.__class__.AsyncResult is not Task.AsyncResult:
        return task.AsyncResult(task_id)
    return result_class(task.app)(task_id, backend=task.backend)
