"""When the windows' store cannot take a call: ``debounce_on_outage`` and the breaker.

``debounce_on_outage`` (a setting, a task option and a per-call option):

* ``"raise"`` (default): the call raises the store's error, as before;
* ``"publish"``: the call is published as a plain message (no window: it runs once,
  not coalesced), so no call is lost while Redis is out.

Only an outage falls back (:func:`outage_kind`); configuration, key, payload and
permission errors always raise. A call that timed out opens this process's breaker
for the app (:class:`Breaker`): for ``debounce_outage_probe_interval`` the calls
skip the store and take the policy at once, then one call probes it again. The hot
path pays one truth test of :data:`OPEN` (see task.py, ``DebouncedTask._gate``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ..errors import DebounceBackendError, error_name
from ..settings import settings_for
from ..signals import call_failed, outage_fallback
from ..store import store_for
from ..store.domain import ReplyLost, ServerRefused, StoreUnavailable
from .gate import enter

if TYPE_CHECKING:  # pragma: no cover
    from celery import Celery

    from ..aliases import FixedId
    from .call import PreparedCall
    from .gate import GateResult
    from .options import DebounceSpec

__all__ = ["OPEN", "Breaker", "DebounceBreakerOpen", "Fallback", "breaker_for", "outage_kind"]


class DebounceBreakerOpen(DebounceBackendError):
    """The call skipped the windows' Redis: a call of this process timed out on it
    less than ``debounce_outage_probe_interval`` ago (``debounce_on_outage="raise"``).
    Nothing was written; raise-policy callers handle it as any DebounceBackendError."""


class Fallback(Exception):
    """Raised by the guarded gate paths when the call is to be published plainly
    (``debounce_on_outage="publish"``); the entry point catches it and publishes."""

    def __init__(self, task_name: str, key: str, reason: str, error: BaseException | None) -> None:
        super().__init__(reason)
        self.task_name, self.key, self.reason, self.error = task_name, key, reason, error

    def published(self, result: Any) -> Any:
        """Tell ``outage_fallback``'s receivers (the metrics count it) about the plain
        publish ``result`` (an AsyncResult: its id is the message's); returns it."""
        if outage_fallback.receivers:
            outage_fallback.send(
                sender=self.task_name,
                task_id=getattr(result, "id", None),
                key=self.key,
                reason=self.reason,
                error=error_name(self.error)
                if self.error is not None
                else DebounceBreakerOpen.__name__,
            )
        return result


def outage_kind(exc: BaseException) -> str | None:
    """``"unreachable"`` (nothing reached Redis: ``StoreUnavailable``), ``"unknown"``
    (the gate may have run: its reply was lost or timed out, ``ReplyLost``),
    ``"refused"`` (the server cannot take writes now, it did not run:
    ``ServerRefused``), or None: not an outage (raise it). Configuration, key,
    payload and permission errors are none of these.

    A ``debounce_redis_wait_replicas`` shortfall is not an outage: the call was
    written on the master (it raises, under every policy)."""
    if isinstance(exc, ServerRefused):
        return "refused"
    if isinstance(exc, StoreUnavailable):
        return "unreachable"
    if isinstance(exc, ReplyLost):
        return "refused" if exc.refused else "unknown"
    return None


def timed_out(exc: BaseException) -> bool:
    """True when a timeout (the socket's or redis-py's, or a store's mark) is in ``exc``'s
    chain: the call waited ``debounce_redis_timeout`` or ``debounce_postgres_timeout``.
    Only such a failure opens the breaker; a refused
    connection fails in a round trip, so every call may try it."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, TimeoutError) or type(seen).__name__ == "TimeoutError":
            return True
        if getattr(seen, "waited", False):  # a store's own mark (store.domain.waited_out)
            return True
        seen = seen.__cause__ or seen.__context__
    return False


#: The open breakers of this process: the hot path's only check (empty: closed).
OPEN: set[Breaker] = set()


class Breaker:
    """One app's breaker in one process (the store's process: a forked child starts
    closed). Open: calls skip the store until ``probe_at``; then one call (the probe) tries
    it while the others still skip; its success closes the breaker, an outage opens it
    for another interval. No lock is held across I/O (safe under gevent)."""

    __slots__ = ("interval_s", "lock", "pid", "probe_at", "probing", "reason", "since")

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.since: float | None = None  # wall time it opened (None: closed)
        self.probe_at = 0.0  # monotonic
        self.probing = False
        self.reason = ""

    def trip(self, exc: BaseException) -> None:
        with self.lock:
            if self.since is None:
                self.since = time.time()
                self.reason = str(exc)
                OPEN.add(self)
            self.probe_at = time.monotonic() + self.interval_s
            self.probing = False

    def admit(self) -> bool:
        """Whether this call may try Redis: the breaker is closed, or this call is the
        probe (one at a time, once the interval passed)."""
        with self.lock:
            if self.since is None:
                return True
            if not self.probing and time.monotonic() >= self.probe_at:
                self.probing = True
                return True
            return False

    def close(self) -> None:
        with self.lock:
            self.since = None
            self.probing = False
            OPEN.discard(self)

    def unprobe(self) -> None:
        """A probe ended without a verdict (interrupted): the next call may probe."""
        with self.lock:
            self.probing = False

    def error(self) -> DebounceBreakerOpen:
        since = time.strftime("%H:%M:%S", time.localtime(self.since or time.time()))
        wait = max(0.0, self.probe_at - time.monotonic())
        return DebounceBreakerOpen(
            f"debounce store breaker open since {since} (a call timed out: "
            f"{self.reason}); calls skip the store, the next one to try it in {wait:.1f} s "
            "(debounce_outage_probe_interval); nothing was written"
        )


_lock = threading.Lock()


def breaker_for(app: Celery) -> Breaker:
    """The app's breaker in this process."""
    found: Breaker | None = app.__dict__.get("_debounce_breaker")
    if found is not None and found.pid == os.getpid():
        return found
    with _lock:
        found = app.__dict__.get("_debounce_breaker")
        if found is None or found.pid != os.getpid():
            found = Breaker(settings_for(app).outage_probe_interval_ms / 1000)
            app.__dict__["_debounce_breaker"] = found
    return found


def _forked() -> None:  # a child starts with every breaker closed (and a fresh lock)
    global _lock
    _lock = threading.Lock()
    OPEN.clear()


os.register_at_fork(after_in_child=_forked)


def policy(app: Celery, spec: DebounceSpec | None) -> str:
    """The call's ``debounce_on_outage``: its own (or its task's), else the setting."""
    own = spec.on_outage if spec is not None else None
    return own or settings_for(app).on_outage


# -- a single call (DebouncedTask.apply_async, send_task) -------------------------------


def gate_guarded(app: Celery, call: PreparedCall, fixed: FixedId | None) -> GateResult:
    """:func:`gate.enter` while some breaker is open (the slow path). Raises
    :class:`Fallback` (publish the call plainly) or what the policy raises."""
    breaker = breaker_for(app)
    if not breaker.admit():
        raise skipped(app, call.spec, call.task_name, call.key, breaker)
    try:
        result = enter(store_for(app, call=True), call, fixed)
    except DebounceBackendError as exc:
        raise failed(app, call.spec, call.task_name, call.key, exc) from exc
    except BaseException:
        breaker.unprobe()
        raise
    breaker.close()
    return result


def failed(
    app: Celery, spec: DebounceSpec | None, task_name: str, key: str, exc: DebounceBackendError
) -> Fallback:
    """After the gate (or the store's first use) raised ``exc``: the :class:`Fallback`
    to raise if the call is to be published plainly (``"publish"`` and an outage), else
    ``exc`` itself is raised."""
    kind = observe(app, exc)
    if kind is None or policy(app, spec) != "publish":
        raise exc
    return Fallback(task_name, key, kind, exc)


def observe(app: Celery, exc: BaseException) -> str | None:
    """Tell the app's breaker about a store error; its :func:`outage_kind`. A timeout
    opens the breaker (an outage of an open breaker's probe opens it again); an answer
    from Redis closes it."""
    kind = outage_kind(exc)
    if OPEN or kind is not None:
        breaker = breaker_for(app)
        if kind is None or kind == "refused":  # Redis answered: it is reachable
            breaker.close()
        elif timed_out(exc) or breaker.since is not None:  # waited, or a probe failed
            breaker.trip(exc)
    return kind


def skipped(
    app: Celery, spec: DebounceSpec | None, task_name: str, key: str, breaker: Breaker
) -> Fallback:
    """A call the open breaker kept from Redis: the :class:`Fallback` to raise
    (``"publish"``), else :class:`DebounceBreakerOpen` is raised."""
    if policy(app, spec) == "publish":
        return Fallback(task_name, key, "breaker", None)
    error = breaker.error()
    if call_failed.receivers:
        call_failed.send(sender=task_name, key=key, error=error_name(error), latency=None)
    raise error
