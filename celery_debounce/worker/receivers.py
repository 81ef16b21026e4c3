"""Worker signals: mark a window claimed when its run starts, finished when it ends.

A message the worker drops without running it also finishes its window, so the
record does not linger as ``queued`` until ``debounce_record_ttl``: an unregistered
task name (``task_unknown``: state ``REJECTED``), an invalid message
(``task_rejected``: ``REJECTED``) and a revoked or expired one (``task_revoked``:
``REVOKED``).

Claims have a lease (``debounce_claim_lease``): each process that runs tasks (a
prefork child, a solo, threads or gevent worker) renews the claims of the runs it is
running from one daemon thread, one pipelined round trip per third of the lease
(:class:`leases._Renewer`), so a claim whose worker died goes stale within one lease and
``take.lua`` releases it. A delivery of a window that already finished, or whose
claim is live, is a duplicate: it is skipped before the task's code runs (the hook
:func:`install_skip` gives every task's ``before_start``, which raises ``Ignore``),
logged at INFO, counted (stats ``d|<task>``) and signalled (``duplicate_skipped``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, Task, shared_task, states
from celery.app.trace import build_tracer, task_has_custom
from celery.exceptions import Ignore
from celery.signals import (
    task_failure,
    task_postrun,
    task_prerun,
    task_rejected,
    task_revoked,
    task_unknown,
    worker_init,
    worker_process_init,
)
from celery.worker.request import Request

from ..aliases import resolve_aliases
from ..calls import plain_call_of
from ..headers import COLLECT_HEADER, DEFERRED_HEADER, IDENT_HEADER, SHARD_HEADER, TAG_HEADER
from ..signals import duplicate_skipped, max_wait_exceeded
from ..store import NotReplicated, store_for
from ..store.api import WorkerStore
from ..store.domain import FinishNotReplicated, FinishResult, ShardRef
from ..store.idents import is_tag_of
from . import retry_queue as marks
from .ceiling import check_ceiling
from .deliveries import dropped_delivery, store_failure
from .leases import _renewer
from .request import WindowRequest as WindowRequest
from .request import _failed_in_parent

logger = logging.getLogger("celery_debounce.worker")

_FINAL = frozenset(states.READY_STATES) | {states.IGNORED}


def _request_shard(request: Any, app: Celery) -> str | int | None:
    """Where the record of the window a task request belongs to is: its shard's tag
    (header ``debounce_tag``), or for a message sent by 0.2 its shard number
    (``debounce_shard``); None for other tasks (and for a tag outside the prefix)."""
    return _shard_of(getattr(request, "headers", None) or {}, request, app)


def _shard_of(headers: Any, request: Any, app: Celery) -> str | int | None:
    tag = getattr(request, TAG_HEADER, None) if request is not None else None
    if tag is None:
        tag = headers.get(TAG_HEADER)
    if tag is not None:
        prefix = store_for(app).settings.key_prefix
        if is_tag_of(prefix, tag):
            return str(tag)
        logger.warning(
            "debounce: ignored a %s header naming no shard of prefix %r: %r",
            TAG_HEADER,
            prefix,
            tag,
        )
        return None
    value = getattr(request, SHARD_HEADER, None) if request is not None else None
    if value is None:
        value = headers.get(SHARD_HEADER)
    return None if value is None else int(value)


def _window_shard(task: Task) -> str | int | None:
    """Where the record of the window this run belongs to is, or None for other tasks."""
    return _request_shard(task.request, task.app)


#: Attribute set on the request of a duplicate delivery: its body must not run.
SKIP = "debounce_duplicate"


def _claim(task_id: str, task: Task, **_: Any) -> None:
    shard = _window_shard(task)
    if shard is None:
        return
    store = store_for(task.app)
    retry = bool(task.request.retries)
    # nothing delivers the last delivery a quorum queue allows again: a lapse of its
    # claim finishes the window (take.lua)
    last = dropped_delivery(task.app, task.request) is not None
    try:
        if store.settings.wait_replicas:
            before, run = store.claim(
                shard,
                task_id,
                task.name,
                retry,
                str(_header(task.request, IDENT_HEADER) or ""),
                last_delivery=last,
            )
        elif last:
            before, run = store.claim(shard, task_id, task.name, retry, last_delivery=True)
        else:
            before, run = store.claim(shard, task_id, task.name, retry)
    except NotReplicated as exc:
        if getattr(type(task), _HOOK, False) and _defer(task, task_id, exc):
            setattr(task.request, SKIP, True)
            return
        logger.warning(
            "debounce: %s[%s] runs although its claim may not survive a failover (%s)",
            task.name,
            task_id,
            exc,
        )
        return
    except Exception as exc:
        logger.warning("debounce: could not mark %s[%s] claimed: %s", task.name, task_id, exc)
        marks.keep(store, marks.ClaimMark(shard, task_id, task.name, retry), exc)
        _renewer.hold(store, shard, task_id)
        return
    if not run:
        if getattr(type(task), _HOOK, False):
            setattr(task.request, SKIP, True)
            logger.info(
                "debounce: %s[%s] skipped: a duplicate delivery of a window %s "
                "(redelivered or republished); its callers get the first run's outcome",
                task.name,
                task_id,
                "already finished"
                if before == "finished"
                else "still open here: its take was lost with a failover, it is published again"
                if before == "pending"
                else "running under a live claim",
            )
            if duplicate_skipped.receivers:
                duplicate_skipped.send(sender=task.name, task_id=task_id, state=before)
            return
        logger.warning(
            "debounce: %s[%s] runs again (window was %s): the task has no "
            "duplicate-skip hook here (registered after the worker started?)",
            task.name,
            task_id,
            before,
        )
    elif before in ("claimed", "stale") and not retry:
        logger.warning(
            "debounce: %s[%s] runs again: its previous claim went stale "
            "(its worker died or stopped renewing)",
            task.name,
            task_id,
        )
    _renewer.hold(store, shard, task_id)
    if max_wait_exceeded.receivers and not retry:  # the max_wait_violations counter
        check_ceiling(store, shard, task.name, task_id)


def _header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


#: First and longest wait (s) before a delivery whose claim too few replicas
#: acknowledged is delivered again (doubling each time).
DEFER_FIRST_S = 0.25
DEFER_MAX_S = 5.0


def _defer(task: Task, task_id: str, exc: BaseException) -> bool:
    """Too few replicas acknowledged this delivery's claim (``debounce_redis_wait_replicas``;
    the store undid it): send the same message (same id, arguments, headers, routing,
    links, ``retries``) through the broker again after a short countdown, as
    ``Task.retry`` would but without counting a retry or storing ``RETRY``, and skip
    this delivery. The next delivery claims on the master then: the run is delayed,
    never doubled (a copy of the window published by a promoted replica is a duplicate
    of it, or it of that copy). True if it was sent; False: it runs now (the broker
    refused the message; at least once rather than lost)."""
    request = task.request
    if request.is_eager:  # Task.apply (celery_debounce.testing's drain): no broker here
        return False
    times = int(_header(request, DEFERRED_HEADER) or 0)
    countdown = min(DEFER_MAX_S, DEFER_FIRST_S * 2 ** min(times, 8))
    headers = {**(getattr(request, "headers", None) or {}), DEFERRED_HEADER: times + 1}
    try:
        task.signature_from_request(
            request,
            countdown=countdown,
            retries=request.retries or 0,
            headers=headers,
        ).apply_async()
    except Exception as sent:
        logger.warning(
            "debounce: %s[%s] runs now: its claim may not survive a failover "
            "(%s) and it could not be sent again (%r)",
            task.name,
            task_id,
            exc,
            sent,
        )
        return False
    logger.info(
        "debounce: %s[%s] delivered again in %.2f s: %s", task.name, task_id, countdown, exc
    )
    return True


# -- claim leases: leases.py; a run whose pool child died: request.py ----------------


# -- the duplicate skip ---------------------------------------------------------------------

_HOOK = "_debounce_skip_hook"


def _skip_hook(original: Any) -> Any:
    def before_start(self: Task, task_id: str, args: Any, kwargs: Any) -> None:
        if getattr(self.request, SKIP, False):
            raise Ignore()
        if original is not None:
            original(self, task_id, args, kwargs)

    return before_start


def install_skip(app: Celery) -> bool:
    """Give every task of ``app`` (Celery's own ``celery.*`` tasks aside) a
    ``before_start`` that raises ``Ignore`` for a duplicate delivery, keeping a
    ``before_start`` the task had. Celery's tracer calls ``before_start`` inside the
    block that turns ``Ignore`` into an ignored run (no result stored, message acked);
    an exception in a ``task_prerun`` receiver is only logged, so the skip cannot be
    raised there. True if some task class was changed (its tracer must be rebuilt)."""
    changed = False
    for name, task in list(app.tasks.items()):
        cls = type(task)
        if name.startswith("celery.") or cls.__dict__.get(_HOOK):
            continue
        original = cls.before_start if task_has_custom(task, "before_start") else None
        cls.before_start = _skip_hook(original)
        setattr(cls, _HOOK, True)
        changed = True
    return changed


#: Celery's own request class, as ``Task.Request`` names it by default.
_DEFAULT_REQUEST = "celery.worker.request:Request"


def install_request(app: Celery) -> None:
    """Give every task of ``app`` that keeps Celery's request class
    :class:`WindowRequest` (a debounced task has it already): a window published by
    name (``send_task``) to a plain task is finished by the worker's main process too
    when its pool child dies. Called in the main process before the consumer builds
    its strategies (``worker_init``)."""
    for name, task in list(app.tasks.items()):
        cls = type(task)
        if not name.startswith("celery.") and cls.Request in (_DEFAULT_REQUEST, Request):
            cls.Request = "celery_debounce.worker.receivers:WindowRequest"


def _install_in_worker(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        install_skip(app)
        install_request(app)


def _install_in_child(sender: Any = None, **_: Any) -> None:
    """A prefork child: the classes came patched from the parent (fork), unless it is a
    fresh interpreter (spawn): patch them then and rebuild the tracers built before."""
    from celery import current_app

    app = current_app._get_current_object()
    if install_skip(app):
        for name, task in app.tasks.items():
            task.__trace__ = build_tracer(name, task, app.loader, sender, app=app)


def _reshape(task_id: str, task: Task, args: Any = None, kwargs: Any = None, **_: Any) -> None:
    """A collect body (header ``debounce_collect``) reaching a task that is not
    ``debounce_collect`` here (a rolling deploy that turned it off): the run gets the
    opener's call (the newest with ``debounce_replace_payload``), as a plain window's
    run would, instead of the raw list of calls. The tracer calls the task with these
    very ``args``/``kwargs`` objects (JSON: a list and a dict), so they are replaced
    in place."""
    headers = getattr(task.request, "headers", None)
    if not headers or not headers.get(COLLECT_HEADER):
        return
    defaults = getattr(task, "_debounce_defaults", None)
    if defaults is not None and defaults.debounce_collect:
        return
    replace = bool(defaults is not None and defaults.debounce_replace_payload)
    call = plain_call_of(args, replace)
    if call is None or not isinstance(args, list) or not isinstance(kwargs, dict):
        return
    logger.warning(
        "debounce: %s[%s] got a debounce_collect window's calls, but the task is not "
        "debounce_collect here (a rolling deploy?): it runs with the %s call's arguments",
        task.name,
        task_id,
        "newest" if replace else "first",
    )
    args[:] = list(call.args)
    kwargs.clear()
    kwargs.update(call.kwargs)


def _finish_window(
    app: Celery, shard: str | int, task_id: str, name: str, state: str, retval: Any = None
) -> None:
    """Mark the window finished; store the run's outcome under its aliases (aliases.py)."""
    store: WorkerStore = store_for(app)
    mark = marks.FinishMark(shard, task_id, state)
    try:
        done = store.finish_run(shard, task_id, state)
    except FinishNotReplicated as exc:
        # finished on the master, too few replicas acknowledged it: the body ran, so its
        # outcome is stored now and the finish is sent again until it is acknowledged
        # (finish.lua is idempotent): a failover cannot forget that it ran
        logger.warning("debounce: %s[%s] finished; its mark is sent again: %s", name, task_id, exc)
        marks.keep(store, mark, exc)
        _finished(app, task_id, exc.result, state, retval)
        return
    except Exception as exc:
        logger.warning("debounce: could not mark %s[%s] finished: %s", name, task_id, exc)
        # sent again when Redis is back (worker/retry_queue.py), and its aliases resolved then
        marks.keep(store, mark, exc, then=lambda done: _finished(app, task_id, done, state, retval))
        return
    _finished(app, task_id, done, state, retval)


def _finished(app: Celery, task_id: str, done: FinishResult, state: str, retval: Any) -> None:
    """The finish answered: store the run's outcome under the window's aliases."""
    aliases = done.aliases
    if aliases:
        resolve_aliases(app, task_id, aliases, state, retval)


def _finish(
    task_id: str, task: Task, state: str | None = None, retval: Any = None, **_: Any
) -> None:
    shard = _window_shard(task)
    if shard is None or getattr(task.request, SKIP, False):
        return  # a skipped duplicate: the first run holds and finishes the window
    store: WorkerStore = store_for(task.app)
    _renewer.drop(store, shard, task_id)
    if state == states.REJECTED and shard is not None and _rejected_for_good(task, retval):
        # Reject(requeue=False), or a requeue of a message already acked: it never runs
        # again. Celery stores FAILURE (the Reject) for the window's id; so do its aliases.
        state = states.FAILURE
    if state == states.REJECTED and (dropped := dropped_delivery(task.app, task.request)):
        state, retval = states.FAILURE, store_failure(task, task_id, dropped, task.request)
    if state == states.REJECTED:  # requeued: its next delivery must run, not be skipped
        _put_back(store, shard, task_id, task.name)
    if state is None or state not in _FINAL:
        return
    if state == states.IGNORED and getattr(task.request, REPLACED_FLAG, False):
        return  # self.replace(): the replacement's outcome finishes it (forward_replacement)
    _finish_window(task.app, shard, task_id, task.name, state, retval)


def _end_claim(store: WorkerStore, shard: ShardRef, task_id: str, name: str) -> None:
    """End a run's claim now (its lease expires at once): a Reject(requeue=True) puts the
    message back, and that delivery takes the claim over instead of being skipped as a
    duplicate of a live run. A failure only delays it: the claim lapses within a lease."""
    try:
        store.end_claim(shard, task_id)
    except Exception as exc:
        logger.warning(
            "debounce: could not end the claim of %s[%s] (requeued): %s", name, task_id, exc
        )


def _put_back(store: WorkerStore, shard: ShardRef, task_id: str, name: str) -> None:
    """A Reject(requeue=True): the message goes back to the queue (after this signal),
    so the window is ``queued`` again (:meth:`WorkerStore.put_back`): its next delivery
    claims it, and an exclusive key stays held until that run ends (ending the claim
    alone let ``take.lua`` free the key, and the follow-up ran beside the requeued
    run). A failure falls back to ending the claim (:func:`_end_claim`)."""
    try:
        store.put_back(shard, task_id)
    except Exception as exc:
        logger.warning(
            "debounce: could not put %s[%s] back in its queue (requeued): %s", name, task_id, exc
        )
        _end_claim(store, shard, task_id, name)


def _rejected_for_good(task: Task, retval: Any) -> bool:
    """The run raised ``Reject``: True unless its message goes back to the queue (a
    requeue with ``acks_late``; without it the message was acked before the run)."""
    return not (getattr(retval, "requeue", False) and task.acks_late)


# -- self.replace() in a window's run --------------------------------------------------
#: Request attribute set on a window's run that called ``self.replace()``.
REPLACED_FLAG = "debounce_replaced"
#: The tasks a replacement's link and link_error call with its outcome.
REPLACED_DONE = "celery_debounce.replacement_done"
REPLACED_FAILED = "celery_debounce.replacement_failed"


def forward_replacement(task: Task, sig: Any) -> None:
    """A window's run replaces itself (``Task.on_replace``): its window finishes, and
    every alias resolves, with the replacement's outcome, not with ``IGNORED``.

    Celery runs the replacement under the window's id (so the window's own id
    resolves by itself) but stores nothing for the run it replaced, and the aliases
    (canvas members, ``task_id=``) are ours to resolve. The replacement is linked to
    :data:`REPLACED_DONE` (its result) and :data:`REPLACED_FAILED` (the id of the task
    that failed), which finish the window and store that outcome under each alias.
    A replacement that replaces itself again carries the links on (Celery copies a
    request's callbacks and errbacks to the replacement). The links are routed as the
    window's message was, so a worker that runs the window's task runs them.
    """
    shard = _window_shard(task)
    if shard is None:
        return
    setattr(task.request, REPLACED_FLAG, True)
    where = {}
    delivery = getattr(task.request, "delivery_info", None) or {}
    for name in ("exchange", "routing_key"):
        if delivery.get(name) is not None:
            where[name] = delivery[name]
    if where.get("exchange") == "":  # the default exchange: route by queue name
        where = {"queue": where["routing_key"]} if "routing_key" in where else {}
    kwargs = {"shard": shard, "window_id": task.request.id, "name": task.name}
    sig.link(task.app.signature(REPLACED_DONE, kwargs=kwargs, **where))
    sig.link_error(task.app.signature(REPLACED_FAILED, kwargs=kwargs, **where))


@shared_task(name=REPLACED_DONE, bind=True, ignore_result=True)  # type: ignore[untyped-decorator]
def _replacement_done(self: Task, retval: Any, *, shard: int, window_id: str, name: str) -> None:
    _finish_window(self.app, shard, window_id, name, states.SUCCESS, retval)


@shared_task(name=REPLACED_FAILED, bind=True, ignore_result=True)  # type: ignore[untyped-decorator]
def _replacement_failed(
    self: Task, failed_id: str, *, shard: int, window_id: str, name: str
) -> None:
    result = self.app.AsyncResult(failed_id)
    exc = result.result
    if not isinstance(exc, BaseException):  # not stored (ignore_result): say what we know
        exc = Exception(
            f"the replacement of {name}[{window_id}] failed in {failed_id} ({result.state})"
        )
    _finish_window(self.app, shard, window_id, name, states.FAILURE, exc)


def _revoked(sender: Task | None = None, request: Any = None, **_: Any) -> None:
    task_id = getattr(request, "id", None)
    if sender is None or not task_id:
        return
    shard = _request_shard(request, sender.app)
    if shard is None:
        return
    _finish_window(sender.app, shard, task_id, sender.name, states.REVOKED)


def _dropped(
    sender: Any = None,
    message: Any = None,
    name: str | None = None,
    id: str | None = None,
    **_: Any,
) -> None:
    """A message the consumer rejected: unregistered task name or invalid message."""
    headers = getattr(message, "headers", None) or {}
    task_id = id or headers.get("id")
    app = getattr(sender, "app", None)
    if not task_id or app is None or (TAG_HEADER not in headers and SHARD_HEADER not in headers):
        return
    shard = _shard_of(headers, None, app)
    if shard is None:
        return
    name = name or headers.get("task") or "?"
    logger.warning(
        "debounce: %s[%s] was rejected by the worker (%s): window finished as REJECTED",
        name,
        task_id,
        "unregistered task" if id else "invalid message",
    )
    _finish_window(app, shard, task_id, name, states.REJECTED)


_connected = False


def connect() -> None:
    """Connect the receivers above to Celery's signals, once per process (see
    :func:`celery_debounce.worker.install`; racing threads connect each receiver once:
    Celery's ``Signal.connect`` keeps one entry per receiver)."""
    global _connected
    if _connected:
        return
    task_prerun.connect(_claim, weak=False)
    task_prerun.connect(_reshape, weak=False)
    task_postrun.connect(_finish, weak=False)
    task_revoked.connect(_revoked, weak=False)
    task_failure.connect(_failed_in_parent, weak=False)
    task_unknown.connect(_dropped, weak=False)
    task_rejected.connect(_dropped, weak=False)
    worker_init.connect(_install_in_worker, weak=False)
    worker_process_init.connect(_install_in_child, weak=False)
    _connected = True
