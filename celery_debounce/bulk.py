"""Bulk producer API: many debounced calls of one task in a few pipelined round trips."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from celery.result import AsyncResult
from redis.exceptions import NoScriptError

from .backend import Backend, backend_for, translate_errors
from .call import PreparedCall, prepare_call
from .errors import DebounceBackendError, DebounceConfigError
from .gate import GateResult, gate_args, gate_keys, parse_reply
from .settings import settings_for
from .task import DebouncedTask

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
    serializer = options.pop("serializer", None) or task.serializer
    settings = settings_for(task.app)
    signature = task.debounce_signature()
    prepared: list[PreparedCall] = []
    for args, kwargs in pairs:
        if task.typing:
            task.__header__(*args, **kwargs)
        prepared.append(prepare_call(
            settings, task.name, spec, args, kwargs, dict(options), signature, serializer,
        ))
    backend = backend_for(task.app)
    results: list[AsyncResult] = []
    for start in range(0, len(prepared), chunk_size):
        for gate in enter_many(backend, prepared[start : start + chunk_size]):
            results.append(task.AsyncResult(gate.task_id))
    return results


def enter_many(backend: Backend, calls: Sequence[PreparedCall]) -> list[GateResult]:
    """Run ``gate.lua`` for each call, in order, in one pipeline (EVALSHA, NOSCRIPT reloaded)."""
    script = backend.scripts["gate"]
    commands = [(*gate_keys(backend, call), *gate_args(backend, call)) for call in calls]
    replies: list[Any] = [None] * len(commands)
    todo = list(range(len(commands)))
    with translate_errors("gate (bulk)"):
        for _attempt in range(2):
            with backend.client.pipeline(transaction=False) as pipe:
                for i in todo:
                    pipe.execute_command(  # type: ignore[no-untyped-call]
                        "EVALSHA", script.sha, 2, *commands[i]
                    )
                answers = pipe.execute(raise_on_error=False)
            missing = []
            for i, answer in zip(todo, answers, strict=True):
                if isinstance(answer, NoScriptError):
                    missing.append(i)
                elif isinstance(answer, Exception):
                    raise answer
                else:
                    replies[i] = answer
            if not missing:
                break
            script.sha = backend.client.script_load(script.script)
            todo = missing
        else:
            raise DebounceBackendError("gate (bulk): script could not be loaded")
    return [parse_reply(reply) for reply in replies]


def _pair(call: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if (
        not isinstance(call, (tuple, list)) or len(call) != 2
        or not isinstance(call[0], (tuple, list)) or not isinstance(call[1], Mapping)
    ):
        raise DebounceConfigError(
            f"enqueue_many: each call must be an (args, kwargs) pair, got {call!r:.80}"
        )
    return tuple(call[0]), dict(call[1])
