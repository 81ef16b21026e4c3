"""Bulk producer API: many debounced calls of one task in a few pipelined round trips."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from celery.result import AsyncResult

from ..errors import DebounceBackendError, DebounceConfigError
from ..settings import settings_for
from ..store import UNKNOWN_OUTCOME, WRITTEN, Outcome, is_unknown_outcome, store_for
from . import outage
from .call import PreparedCall, prepare_call, static_routing
from .gate import GateResult, announce, listening
from .options import DebounceSpec
from .task import DebouncedTask, check_arguments, check_eager

__all__ = ["UNKNOWN_OUTCOME", "WRITTEN", "Call", "DebounceBulkError", "enqueue_many"]

#: One call: ``(args, kwargs)``.
Call = tuple[Sequence[Any], Mapping[str, Any]]


def enqueue_many(
    task: DebouncedTask,
    calls: Iterable[Call],
    *,
    chunk_size: int = 1000,
    **options: Any,
) -> list[AsyncResult]:
    """Call ``task.apply_async(args, kwargs, **options)`` for each ``(args, kwargs)`` pair.

    Each call goes through the gate exactly as a single call would (same window,
    key, deadline and max-wait rules, in order), but the gate calls are sent in
    pipelines of ``chunk_size``. Every call is validated first: if one is refused,
    nothing is written. Returns one AsyncResult per call, in order. Calls that
    would not be debounced (``debounce=False``, eager mode) are published one by
    one through ``apply_async``.
    """
    pairs = _checked_batch(task, calls, chunk_size, options)
    original = dict(options)
    spec = task._debounce_defaults.for_call(options)
    if spec is None:
        return [task.apply_async(args, kwargs, debounce=False, **options) for args, kwargs in pairs]
    if task.app.conf.task_always_eager:
        return _eager(task, spec, pairs, options, original)
    prepared = _prepare_all(task, spec, pairs, options)
    app = task.app
    plain = {**original, "debounce": False}  # how a call is published without a window

    def publish(i: int, reason: str, error: BaseException | None) -> AsyncResult:
        args, kwargs = pairs[i]
        fallback = outage.Fallback(task.name, prepared[i].key, reason, error)
        return fallback.published(task.apply_async(args, kwargs, **plain))

    breaker = outage.breaker_for(app) if outage.OPEN else None
    if breaker is not None and not breaker.admit():
        outage.skipped(app, spec, task.name, "", breaker)  # raises unless "publish"
        return [publish(i, "breaker", None) for i in range(len(prepared))]
    make = task.AsyncResult
    results: list[AsyncResult | None] = [None] * len(prepared)
    outcomes: list[Outcome] = []

    def on_chunk(chunk: range) -> None:
        # runs while Redis works on the next chunk: building results overlaps it
        for i in chunk:
            outcome = outcomes[i]
            if isinstance(outcome, GateResult):
                results[i] = make(outcome.task_id)

    try:
        store = store_for(app, call=True)
        outcomes = store.gate_many(prepared, chunk_size, on_chunk, outcomes)
    except DebounceBackendError as exc:  # the server check, or no connection
        if any(outcome is not None for outcome in outcomes):
            if breaker is not None:  # no verdict on Redis: the next call may probe
                breaker.unprobe()
            raise  # some calls were answered: not a whole-batch outage
        fallback = outage.failed(app, spec, task.name, "", exc)  # raises unless "publish"
        return [publish(i, fallback.reason, exc) for i in range(len(prepared))]
    except BaseException:
        if breaker is not None:
            breaker.unprobe()
        raise

    return _settled(app, spec, prepared, outcomes, results, make, publish, breaker)


def _checked_batch(
    task: Any, calls: Iterable[Call], chunk_size: Any, options: dict[str, Any]
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The calls as ``(args, kwargs)`` pairs, or refused before anything is written."""
    if not isinstance(task, DebouncedTask):
        raise DebounceConfigError(f"enqueue_many: {task!r} is not a DebouncedTask")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise DebounceConfigError(f"chunk_size={chunk_size!r}: expected a positive int")
    pairs = [_pair(call) for call in calls]
    if "retries" in options:
        raise DebounceConfigError("retries=: enqueue_many is for new calls, not retries")
    if options.get("task_id") is not None:
        raise DebounceConfigError(
            f"task_id={options['task_id']!r}: enqueue_many gives each call its own id (or "
            "its window's); no call would get this one, so nothing would ever resolve it"
        )
    return pairs


def _eager(
    task: DebouncedTask,
    spec: DebounceSpec,
    pairs: list[tuple[tuple[Any, ...], dict[str, Any]]],
    options: dict[str, Any],
    original: dict[str, Any],
) -> list[AsyncResult]:
    """Eager mode: every call checked as the gated path checks it (one refused, none
    runs), then each run at once."""
    plain = {k: v for k, v in options.items() if k not in ("link", "link_error", "shadow")}
    for args, kwargs in pairs:
        check_eager(
            task,
            spec,
            args,
            kwargs,
            None,
            options.get("link"),
            options.get("link_error"),
            options.get("shadow"),
            plain,
        )
    return [task.apply_async(args, kwargs, **original) for args, kwargs in pairs]


def _prepare_all(
    task: DebouncedTask,
    spec: DebounceSpec,
    pairs: list[tuple[tuple[Any, ...], dict[str, Any]]],
    options: dict[str, Any],
) -> list[PreparedCall]:
    """Each call validated and encoded as a single call would be (one refused: raised
    before anything is written)."""
    for name in ("link", "link_error", "shadow"):
        if options.get(name) is None:
            options.pop(name, None)
    static = None if options else static_routing(task.app)
    options = {**task._debounce_exec_defaults(), **options}
    serializer = options.pop("serializer", None) or task.serializer
    settings = settings_for(task.app)
    signature = task.debounce_signature()
    prepared: list[PreparedCall] = []
    for args, kwargs in pairs:
        check_arguments(task, args, kwargs)
        prepared.append(
            prepare_call(
                settings,
                task.name,
                spec,
                args,
                kwargs,
                dict(options),
                signature,
                serializer,
                app=task.app,
                task_type=task,
                static=static,
            )
        )
    return prepared


def _settled(
    app: Any,
    spec: DebounceSpec,
    prepared: list[PreparedCall],
    outcomes: list[Outcome],
    results: list[AsyncResult | None],
    make: Callable[[str], AsyncResult],
    publish: Callable[[int, str, BaseException | None], AsyncResult],
    breaker: Any,
) -> list[AsyncResult]:
    """The results of the answered chunks; the calls an outage kept out published
    plainly under ``debounce_on_outage="publish"``; otherwise, any call not written
    raises :class:`DebounceBulkError` with what was."""
    errors: dict[int, BaseException] = {}
    unknown: list[int] = []
    heard = listening()
    for i, (call, outcome) in enumerate(zip(prepared, outcomes, strict=True)):
        if isinstance(outcome, GateResult):
            if results[i] is None:
                results[i] = make(outcome.task_id)
            if heard:
                announce(call, outcome)
        elif isinstance(outcome, BaseException):
            results[i] = None
            errors[i] = outcome
            if is_unknown_outcome(outcome):
                unknown.append(i)
        else:  # WRITTEN: written, but the reply was lost and the window moved on
            results[i] = None
    if errors:
        kind = outage.observe(app, next(iter(errors.values())))
        if kind is not None and outage.policy(app, spec) == "publish":
            for i, error in list(errors.items()):  # an outage kept them out: no window
                reason = outage.outage_kind(error)
                if reason is not None:
                    results[i] = publish(i, reason, error)
                    del errors[i]
            unknown = [i for i in unknown if i in errors]
    elif breaker is not None:
        breaker.close()
    if errors or any(r is None for r in results):
        first = next(iter(errors.values()), "reply lost")
        raise DebounceBulkError(
            f"enqueue_many: {len(errors)} of {len(prepared)} call(s) not written "
            f"(first error: {first}); see .unwritten",
            results=results,
            errors=errors,
            unknown=unknown,
        )
    return [r for r in results if r is not None]


class DebounceBulkError(DebounceBackendError):
    """Redis failed part-way through :func:`enqueue_many`: some calls were written.

    * ``results``: one entry per call, in order: the window's ``AsyncResult`` for a
      written call, ``None`` for a call that was not written (and, rarely, for a
      written call whose reply was lost and whose window was already taken).
    * ``written``: how many calls were written (each counted once in its window).
    * ``unwritten``: indexes of the calls that were not written: retry exactly these
      (a retry of them never counts a written call twice).
    * ``errors``: index -> the error that kept that call out.
    * ``unknown``: indexes whose outcome could not be checked because Redis stayed
      unreachable (they are in ``unwritten`` too; retrying them may count them twice).
    """

    def __init__(
        self,
        message: str,
        *,
        results: list[AsyncResult | None],
        errors: dict[int, BaseException],
        unknown: list[int],
    ) -> None:
        super().__init__(message)
        self.results = results
        self.errors = errors
        self.unwritten = sorted(errors)
        self.unknown = unknown
        self.written = len(results) - len(errors)


def _pair(call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if (
        not isinstance(call, (tuple, list))
        or len(call) != 2
        or not isinstance(call[0], (tuple, list))
        or not isinstance(call[1], Mapping)
    ):
        raise DebounceConfigError(
            f"enqueue_many: each call must be an (args, kwargs) pair, got {call!r:.80}"
        )
    return tuple(call[0]), dict(call[1])
