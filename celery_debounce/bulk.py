"""Bulk producer API: many debounced calls of one task in a few pipelined round trips."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from celery.result import AsyncResult
from redis.exceptions import NoScriptError, ResponseError

from .backend import Backend, backend_for, translate_errors
from .call import PreparedCall, prepare_call, static_routing
from .errors import DebounceConfigError
from .gate import GateResult, gate_args, gate_keys, parse_reply
from .settings import settings_for
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
    results: list[AsyncResult | None] = [None] * len(prepared)
    make = task.AsyncResult

    def on_chunk(indexes: range, replies: list[Any]) -> None:
        # built while Redis runs the next chunk; the reply's id is the window's
        for i in indexes:
            if results[i] is None and replies[i] is not None:
                tid = replies[i][0]
                results[i] = make(tid.decode() if isinstance(tid, bytes) else str(tid))

    enter_many(backend_for(task.app), prepared, chunk_size, on_chunk)
    return [r for r in results if r is not None]


def enter_many(
    backend: Backend, calls: Sequence[PreparedCall], chunk_size: int = 1000,
    on_chunk: Callable[[range, list[Any]], None] | None = None,
) -> list[GateResult]:
    """Run ``gate.lua`` for each call, in order, pipelined on one connection.

    Chunk ``k + 1`` is packed and sent before the replies of chunk ``k`` are read,
    so the client's work overlaps Redis running the scripts. NOSCRIPT replies are
    run again once the script is loaded. Nothing is retried after a connection
    error: calls sent before it may have gone through. ``on_chunk(indexes, replies)``
    runs as each chunk's replies arrive, while Redis works on the next chunk.
    """
    script = backend.scripts["gate"]
    client = backend.client
    pool = client.connection_pool
    replies: list[Any] = [None] * len(calls)
    missing: list[int] = []
    errors: list[Exception] = []
    with translate_errors("gate (bulk)"):
        if not getattr(script, "_loaded_by_bulk", False):  # spare a chunk of NOSCRIPT
            script.sha = client.script_load(script.script)
            setattr(script, "_loaded_by_bulk", True)  # noqa: B010
        conn: Any = pool.get_connection()
        try:
            pending: range | None = None
            for start in range(0, len(calls), chunk_size):
                chunk = range(start, min(start + chunk_size, len(calls)))
                conn.send_packed_command(conn.pack_commands([
                    ("EVALSHA", script.sha, 2, *gate_keys(backend, calls[i]),
                     *gate_args(backend, calls[i]))
                    for i in chunk
                ]))
                if pending is not None:
                    _read(conn, pending, replies, missing, errors)
                    if on_chunk is not None and not errors:
                        on_chunk(pending, replies)
                pending = chunk
            if pending is not None:
                _read(conn, pending, replies, missing, errors)
                if on_chunk is not None and not errors:
                    on_chunk(pending, replies)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if errors:
            raise errors[0]
        if missing:  # the server lost its scripts (restart, SCRIPT FLUSH)
            script.sha = client.script_load(script.script)
            with client.pipeline(transaction=False) as pipe:
                for i in missing:
                    pipe.execute_command(  # type: ignore[no-untyped-call, unused-ignore]
                        "EVALSHA", script.sha, 2, *gate_keys(backend, calls[i]),
                        *gate_args(backend, calls[i]),
                    )
                for i, answer in zip(missing, pipe.execute(), strict=True):
                    replies[i] = answer
            if on_chunk is not None:
                on_chunk(range(len(replies)), replies)
    return [parse_reply(reply) for reply in replies]


def _read(
    conn: Any, indexes: range, replies: list[Any], missing: list[int], errors: list[Exception]
) -> None:
    for i in indexes:
        try:
            replies[i] = conn.read_response()
        except NoScriptError:
            missing.append(i)
        except ResponseError as exc:  # keep reading so the connection stays in step
            errors.append(exc)


def _pair(call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if (
        not isinstance(call, (tuple, list)) or len(call) != 2
        or not isinstance(call[0], (tuple, list)) or not isinstance(call[1], Mapping)
    ):
        raise DebounceConfigError(
            f"enqueue_many: each call must be an (args, kwargs) pair, got {call!r:.80}"
        )
    return tuple(call[0]), dict(call[1])
