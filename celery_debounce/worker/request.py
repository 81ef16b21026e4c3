"""The request class of debounced tasks: a run whose pool child died, seen from the
worker's main process (:class:`WindowRequest`)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import states
from celery.worker.request import Request

from ..store import store_for
from .deliveries import dropped_delivery, store_failure

logger = logging.getLogger("celery_debounce.worker")


class _Watch(threading.local):
    """The request whose failure the main process is handling (:class:`WindowRequest`),
    and what ``task_failure`` reported for it while Celery handled it."""

    task_id: str | None = None
    exc: BaseException | None = None


_watch = _Watch()


def _failed_in_parent(
    sender: Any = None, task_id: str | None = None, exception: BaseException | None = None, **_: Any
) -> None:
    """``task_failure`` sent by the main process for the request it watches: Celery
    stored FAILURE for the run's id (not requeued, not retried)."""
    if task_id is not None and task_id == _watch.task_id:
        _watch.exc = exception if exception is not None else Exception("worker lost")


class WindowRequest(Request):  # type: ignore[misc]
    """The request class of debounced tasks (``DebouncedTask.Request``): the side of a
    window's run that the worker's main process handles.

    A prefork child that dies mid-run (SIGKILL, OOM killer, ``os._exit``) or is killed
    at its hard time limit never reaches ``task_postrun``, so the child cannot finish
    the window. The main process then stores FAILURE (``WorkerLostError`` or
    ``TimeLimitExceeded``) for the run's own id and sends ``task_failure``; this class
    finishes the window with that failure there, so the ids that joined it (aliases)
    get it too and an exclusive key is freed at once. If Celery stored nothing (it put
    the message back: ``acks_late`` with ``reject_on_worker_lost``; or it retried it:
    ``retry_on_worker_lost``), the dead run's claim ends at once, so the next delivery
    runs instead of being skipped as a duplicate of a live claim. A task class that
    sets its own ``Request`` should derive it from this one.
    """

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        if return_ok:  # the child ran the body and handled its failure (task_postrun)
            return super().on_failure(exc_info, send_failed_event, return_ok)
        return self._debounce_watch(super().on_failure, exc_info, send_failed_event, return_ok)

    def on_timeout(self, soft: bool, timeout: float) -> Any:
        if soft:
            return super().on_timeout(soft, timeout)
        return self._debounce_watch(super().on_timeout, soft, timeout, hard_limit=timeout)

    def _debounce_watch(self, handle: Any, *args: Any, hard_limit: float | None = None) -> Any:
        before = (_watch.task_id, _watch.exc)
        _watch.task_id, _watch.exc = self.id, None
        try:
            return handle(*args)
        finally:
            exc = _watch.exc
            _watch.task_id, _watch.exc = before
            try:
                self._debounce_end(exc, hard_limit)
            except Exception:
                logger.exception(
                    "debounce: could not end the window of %s[%s] after its "
                    "worker process was lost",
                    self.name,
                    self.id,
                )

    def _debounce_end(self, exc: BaseException | None, hard_limit: float | None) -> None:
        from celery.exceptions import TimeLimitExceeded
        from celery.worker import state as worker_state

        from .receivers import _end_claim, _finish_window, _shard_of  # imports this

        if getattr(self, "_debounce_ended", False):
            return
        app = self.task.app
        shard = _shard_of(self.request_dict, None, app)
        if shard is None:
            return
        if exc is None and hard_limit is not None and not worker_state.should_terminate:
            # Celery < 5.7 stores TimeLimitExceeded for a hard limit without task_failure
            exc = TimeLimitExceeded(hard_limit)
        self._debounce_ended = True
        if exc is not None:
            logger.warning(
                "debounce: %s[%s] lost its worker process mid-run (%r): window "
                "finished as FAILURE, with its aliases",
                self.name,
                self.id,
                exc,
            )
            _finish_window(app, shard, self.id, self.name, states.FAILURE, exc)
            return
        stored = None if getattr(self, "_debounce_requeued", False) else self._stored_success()
        if stored is not None:  # the child stored SUCCESS, then died before task_postrun
            logger.warning(
                "debounce: %s[%s] succeeded, then lost its worker process before "
                "finishing its window: finished here, with its aliases",
                self.name,
                self.id,
            )
            _finish_window(app, shard, self.id, self.name, states.SUCCESS, stored[0])
        elif getattr(self, "_debounce_requeued", False) and (gone := dropped_delivery(app, self)):
            _finish_window(
                app,
                shard,
                self.id,
                self.name,
                states.FAILURE,
                store_failure(self.task, self.id, gone, self._context),
            )
        else:  # put back (or retried): the next delivery takes the dead run's claim over
            _end_claim(store_for(app), shard, self.id, self.name)

    def _stored_success(self) -> tuple[Any] | None:
        """``(result,)`` if the backend holds SUCCESS for this run's id, else None."""
        if getattr(self, "ignore_result", self.task.ignore_result):
            return None
        try:
            meta = self.task.backend.get_task_meta(self.id)
        except Exception:  # a disabled backend raises; an outage: nothing known
            return None
        if meta.get("status") != states.SUCCESS:
            return None
        return (meta.get("result"),)

    def reject(self, requeue: bool = False) -> None:
        if requeue:
            self._debounce_requeued = True
        super().reject(requeue)
