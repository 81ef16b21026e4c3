"""Bulk producer API: many debounced calls of one task in a few pipelined round trips."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import redis
from celery.result import AsyncResult
from redis.exceptions import NoScriptError

from .backend import Backend, as_text, backend_for, translate_errors
from .call import PreparedCall, prepare_call, static_routing
from .errors import DebounceBackendError, DebounceConfigError
from .gate import GateResult, gate_args, gate_keys, parse_reply
from .settings import settings_for
from .signals import call_absorbed, window_opened
from .task import DebouncedTask, check_arguments

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
    if not isinstance(task, DebouncedTask):
        raise DebounceConfigError(f"enqueue_many: {task!r} is not a DebouncedTask")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise DebounceConfigError(f"chunk_size={chunk_size!r}: expected a positive int")
    pairs = [_pair(call) for call in calls]
    if "retries" in options:
        raise DebounceConfigError("retries=: enqueue_many is for new calls, not retries")
    original = dict(options)
    spec = task._debounce_defaults.for_call(options)
    if spec is None:
        return [task.apply_async(args, kwargs, debounce=False, **options) for args, kwargs in pairs]
    if task.app.conf.task_always_eager:
        return [task.apply_async(args, kwargs, **original) for args, kwargs in pairs]
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
        prepared.append(prepare_call(
            settings, task.name, spec, args, kwargs, dict(options), signature, serializer,
            app=task.app, task_type=task, static=static,
        ))
    backend = backend_for(task.app)
    make = task.AsyncResult
    results: list[AsyncResult | None] = [None] * len(prepared)
    outcomes: list[Outcome] = []

    def on_chunk(chunk: range) -> None:
        # runs while Redis works on the next chunk: building results overlaps it
        for i in chunk:
            outcome = outcomes[i]
            if isinstance(outcome, GateResult):
                results[i] = make(outcome.task_id)

    outcomes = enter_many(backend, prepared, chunk_size, on_chunk, outcomes)
    errors: dict[int, BaseException] = {}
    unknown: list[int] = []
    listening = window_opened.receivers or call_absorbed.receivers
    for i, (call, outcome) in enumerate(zip(prepared, outcomes, strict=True)):
        if isinstance(outcome, GateResult):
            if results[i] is None:
                results[i] = make(outcome.task_id)
            if listening:
                _announce(call, outcome)
        elif isinstance(outcome, BaseException):
            results[i] = None
            errors[i] = outcome
            if isinstance(outcome, _UnknownOutcome):
                unknown.append(i)
        else:  # WRITTEN: written, but the reply was lost and the window moved on
            results[i] = None
    if errors or any(r is None for r in results):
        first = next(iter(errors.values()), "reply lost")
        raise DebounceBulkError(
            f"enqueue_many: {len(errors)} of {len(prepared)} call(s) not written "
            f"(first error: {first}); see .unwritten",
            results=results, errors=errors, unknown=unknown,
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
        self, message: str, *, results: list[AsyncResult | None],
        errors: dict[int, BaseException], unknown: list[int],
    ) -> None:
        super().__init__(message)
        self.results = results
        self.errors = errors
        self.unwritten = sorted(errors)
        self.unknown = unknown
        self.written = len(results) - len(errors)


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Outcome of a call whose chunk ran but whose reply was lost (window id unknown).
WRITTEN = _Marker("WRITTEN")


class _UnknownOutcome(DebounceBackendError):
    pass


#: Outcome of a call whose chunk may or may not have run (Redis unreachable afterwards).
UNKNOWN_OUTCOME = _UnknownOutcome("debounce Redis unreachable: outcome of this call unknown")

Outcome = GateResult | _Marker | BaseException

#: How long a chunk's "this chunk ran" marker key lives (ms).
_MARKER_TTL_MS = 60_000


def _announce(call: PreparedCall, result: GateResult) -> None:
    """The signals a single call sends (gate.enter): window_opened or call_absorbed."""
    signal = window_opened if result.opened else call_absorbed
    if signal.receivers:
        signal.send(sender=call.task_name, task_id=result.task_id, key=call.key,
                    deadline=result.deadline_ms / 1000, calls=result.calls)


def enter_many(
    backend: Backend, calls: Sequence[PreparedCall], chunk_size: int = 1000,
    on_chunk: Callable[[range], None] | None = None, into: list[Outcome] | None = None,
) -> list[Outcome]:
    """Run ``gate.lua`` for each call, in order, pipelined on one connection.

    Each chunk is one ``MULTI``/``EXEC`` transaction that also sets a short-lived
    marker key, so a chunk runs entirely or not at all, and after a connection
    error the marker tells whether an unanswered chunk ran. Chunk ``k + 1`` is
    sent before the replies of chunk ``k`` are read, so the client's work overlaps
    Redis running the scripts. NOSCRIPT replies are run again once the script is
    loaded. Returns one outcome per call: its :class:`GateResult`, :data:`WRITTEN`
    (ran, reply lost, window id not found), or the exception that kept it out.
    ``on_chunk(indexes)`` runs after a chunk's replies were read while the next
    chunk is already on its way (``into``, if given, is the list filled in).
    """
    script = backend.scripts["gate"]
    client = backend.client
    outcomes: list[Any] = into if into is not None else []
    outcomes[:] = [None] * len(calls)
    missing: list[int] = []
    if backend.cluster:
        _enter_many_cluster(backend, calls, chunk_size, on_chunk, outcomes, missing)
        _rerun_missing(backend, calls, outcomes, missing)
        return outcomes
    pool = client.connection_pool
    waited = _wait_command(backend)
    token = uuid.uuid4().hex
    marker_prefix = f"{backend.settings.tag(0)}:bulk:{token}:"
    sent: list[tuple[str, range]] = []  # (marker, chunk) sent and not answered
    answered: list[str] = []  # markers of the chunks whose replies were read
    failure: BaseException | None = None
    with translate_errors("gate (bulk)"):
        if not getattr(script, "_loaded_by_bulk", False):  # spare a chunk of NOSCRIPT
            script.sha = client.script_load(script.script)
            setattr(script, "_loaded_by_bulk", True)  # noqa: B010
    # redis-py < 5.3 needs the command name to check a connection out (backend knows)
    conn: Any = pool.get_connection(*backend._checkout_args)
    try:
        for start in range(0, len(calls), chunk_size):
            chunk = range(start, min(start + chunk_size, len(calls)))
            marker = f"{marker_prefix}{start}"
            conn.send_packed_command(conn.pack_commands([
                ("MULTI",),
                *(("EVALSHA", script.sha, 2, *gate_keys(backend, calls[i]),
                   *gate_args(backend, calls[i])) for i in chunk),
                ("SET", marker, 1, "PX", _MARKER_TTL_MS),
                ("EXEC",),
                *waited,
            ]))
            sent.append((marker, chunk))
            if len(sent) > 1:
                _read_chunk(conn, sent[0][1], outcomes, missing)
                if waited:
                    _check_acks(backend, conn.read_response(), sent[0][1], outcomes)
                marker, done = sent.pop(0)
                answered.append(marker)
                if on_chunk is not None:
                    on_chunk(done)
        while sent:
            _read_chunk(conn, sent[0][1], outcomes, missing)
            if waited:
                _check_acks(backend, conn.read_response(), sent[0][1], outcomes)
            answered.append(sent.pop(0)[0])
        # every reply arrived: the markers served their purpose (else they expire)
        conn.send_command("DEL", *answered)
        conn.read_response()
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        conn.disconnect()
        failure = exc
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    if failure is not None:
        _settle(backend, calls, sent, outcomes, failure)
    _rerun_missing(backend, calls, outcomes, missing)
    return outcomes


def _wait_command(backend: Backend) -> tuple[tuple[Any, ...], ...]:
    """``WAIT n timeout`` after each chunk with ``debounce_redis_wait_replicas``, else ()."""
    wanted = backend.settings.wait_replicas
    if not wanted:
        return ()
    return (("WAIT", wanted, backend.settings.wait_replicas_ms),)


def _check_acks(backend: Backend, acks: Any, chunk: Iterable[int], outcomes: list[Any]) -> None:
    """Fewer replicas than ``debounce_redis_wait_replicas`` acknowledged a chunk: its
    written calls may not survive a failover (retrying them may count them twice)."""
    wanted = backend.settings.wait_replicas
    if isinstance(acks, Exception) or int(acks) >= wanted:
        if isinstance(acks, Exception):
            raise acks
        return
    error = _UnknownOutcome(
        f"debounce_redis_wait_replicas={wanted}: only {int(acks)} replica(s) acknowledged "
        "this chunk; its calls were written on the master but may not survive a failover"
    )
    for i in chunk:
        if isinstance(outcomes[i], GateResult):
            outcomes[i] = error


def _enter_many_cluster(
    backend: Backend, calls: Sequence[PreparedCall], chunk_size: int,
    on_chunk: Callable[[range], None] | None, outcomes: list[Any], missing: list[int],
) -> None:
    """:func:`enter_many` on a Redis Cluster: a ``MULTI``/``EXEC`` chunk may hold one
    slot only, so calls are grouped by shard (in order within each shard: a window's
    calls are all in one shard) and each chunk goes to its shard's master, one chunk
    at a time. The marker key carries the shard's tag."""
    script = backend.scripts["gate"]
    token = uuid.uuid4().hex
    waited = _wait_command(backend)
    by_shard: dict[int, list[int]] = {}
    for i, call in enumerate(calls):
        by_shard.setdefault(call.shard, []).append(i)
    markers: list[str] = []
    for shard, indexes in by_shard.items():
        tag = backend.settings.tags[shard]
        for start in range(0, len(indexes), chunk_size):
            chunk = indexes[start : start + chunk_size]
            marker = f"{tag}:bulk:{token}:{shard}:{start}"
            commands: list[tuple[Any, ...]] = [
                ("MULTI",),
                *(("EVALSHA", script.sha, 2, *gate_keys(backend, calls[i]),
                   *gate_args(backend, calls[i])) for i in chunk),
                ("SET", marker, 1, "PX", _MARKER_TTL_MS),
                ("EXEC",),
                *waited,
            ]
            try:
                with translate_errors("gate (bulk)"):
                    replies = backend.send_on_node(marker, commands)
            except DebounceBackendError as exc:
                if isinstance(exc.__cause__, (redis.ConnectionError, redis.TimeoutError)):
                    _settle(backend, calls, [(marker, chunk)], outcomes, exc)  # type: ignore[list-item]
                else:
                    for i in chunk:
                        outcomes[i] = exc
                continue
            executed = replies[len(chunk) + 2]
            if isinstance(executed, Exception):  # EXECABORT: nothing of this chunk ran
                for i in chunk:
                    outcomes[i] = executed
                continue
            for i, reply in zip(chunk, executed, strict=False):
                if isinstance(reply, NoScriptError):
                    missing.append(i)
                elif isinstance(reply, Exception):
                    outcomes[i] = reply
                else:
                    outcomes[i] = parse_reply(reply)
            if waited:
                _check_acks(backend, replies[-1], chunk, outcomes)
            markers.append(marker)
            if on_chunk is not None:
                for i in chunk:
                    on_chunk(range(i, i + 1))
    if markers:
        try:
            backend.client.delete(*markers)  # split by slot by the cluster client
        except redis.RedisError:
            pass  # they expire


def _rerun_missing(
    backend: Backend, calls: Sequence[PreparedCall], outcomes: list[Any], missing: list[int],
) -> None:
    """Run again, one by one, the calls that met NOSCRIPT (server restart, SCRIPT FLUSH)."""
    script = backend.scripts["gate"]
    client = backend.client
    if missing:  # the server lost its scripts (restart, SCRIPT FLUSH)
        try:
            with translate_errors("gate (bulk)"):
                script.sha = client.script_load(script.script)
                for i in missing:  # one by one: each reply is known
                    try:
                        argv: list[Any] = gate_args(backend, calls[i])
                        outcomes[i] = parse_reply(
                            backend.run_gate(gate_keys(backend, calls[i]), argv))
                    except redis.ResponseError as exc:
                        outcomes[i] = exc
                    except DebounceBackendError as exc:
                        if not isinstance(exc.__cause__, redis.ResponseError):
                            raise
                        outcomes[i] = exc.__cause__
        except DebounceBackendError as exc:
            for i in missing:
                if outcomes[i] is None:
                    outcomes[i] = exc


def _read_chunk(conn: Any, chunk: range, outcomes: list[Any], missing: list[int]) -> None:
    """Read one chunk's MULTI/QUEUED.../EXEC replies into ``outcomes``."""
    queue_error: redis.ResponseError | None = None
    for _ in range(len(chunk) + 2):  # MULTI's OK, then QUEUED per command (+ the marker)
        try:
            conn.read_response()
        except redis.ResponseError as exc:  # refused at queue time (OOM, ...): EXEC aborts
            queue_error = queue_error or exc
    try:
        replies = conn.read_response()
    except redis.ResponseError as exc:  # EXECABORT: nothing of this chunk ran
        for i in chunk:
            outcomes[i] = queue_error or exc
        return
    for i, reply in zip(chunk, replies, strict=False):
        if isinstance(reply, NoScriptError):
            missing.append(i)
        elif isinstance(reply, Exception):  # this script failed; the others ran
            outcomes[i] = reply
        else:
            outcomes[i] = parse_reply(reply)


def _settle(
    backend: Backend, calls: Sequence[PreparedCall], unanswered: list[tuple[str, range]],
    outcomes: list[Any], failure: BaseException,
) -> None:
    """After a connection error: find out which unanswered chunks ran (their marker exists)."""
    error = DebounceBackendError(f"debounce Redis unreachable during gate (bulk): {failure}")
    pending = [i for i in range(len(calls)) if outcomes[i] is None and
               not any(i in chunk for _, chunk in unanswered)]
    for i in pending:  # never sent
        outcomes[i] = error
    try:
        with translate_errors("gate (bulk) check"):
            with backend.client.pipeline(transaction=False) as pipe:
                for marker, _ in unanswered:
                    pipe.exists(marker)
                ran = pipe.execute()
            for (_, chunk), did_run in zip(unanswered, ran, strict=True):
                if not did_run:
                    for i in chunk:
                        outcomes[i] = error
                    continue
                with backend.client.pipeline(transaction=False) as pipe:
                    for i in chunk:
                        tag = backend.settings.tags[calls[i].shard]
                        pipe.hget(f"{tag}:open:{calls[i].ident}", "id")
                    ids = pipe.execute()
                for i, tid in zip(chunk, ids, strict=True):
                    outcomes[i] = WRITTEN if tid is None else GateResult(
                        as_text(tid), False, 0, 0, 0)
    except DebounceBackendError:
        for _, chunk in unanswered:
            for i in chunk:
                if outcomes[i] is None:
                    outcomes[i] = UNKNOWN_OUTCOME


def _pair(call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if (
        not isinstance(call, (tuple, list)) or len(call) != 2
        or not isinstance(call[0], (tuple, list)) or not isinstance(call[1], Mapping)
    ):
        raise DebounceConfigError(
            f"enqueue_many: each call must be an (args, kwargs) pair, got {call!r:.80}"
        )
    return tuple(call[0]), dict(call[1])
