"""Worker signals: mark a window claimed when its run starts, finished when it ends."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task, states
from celery.signals import task_postrun, task_prerun

from .backend import backend_for
from .dispatcher import SHARD_HEADER

logger = logging.getLogger("celery_debounce.worker")

_FINAL = frozenset(states.READY_STATES) | {states.IGNORED}


def _window_shard(task: Task) -> int | None:
    """The shard of the window this run belongs to, or None for other tasks."""
    value = getattr(task.request, SHARD_HEADER, None)
    if value is None:
        headers = getattr(task.request, "headers", None) or {}
        value = headers.get(SHARD_HEADER)
    return None if value is None else int(value)


def _claim(task_id: str, task: Task, **_: Any) -> None:
    shard = _window_shard(task)
    if shard is None:
        return
    backend = backend_for(task.app)
    tag = backend.settings.tag(shard)
    try:
        before = backend.run(
            "claim", [f"{tag}:win:{task_id}", f"{tag}:leased", f"{tag}:active"], [task_id]
        )
    except Exception as exc:
        logger.warning("debounce: could not mark %s[%s] claimed: %s", task.name, task_id, exc)
        return
    if before in (b"claimed", b"finished") and not task.request.retries:
        logger.warning(
            "debounce: %s[%s] runs again (window was %s): redelivered or republished",
            task.name, task_id, before.decode(),
        )


def _finish(task_id: str, task: Task, state: str | None = None, **_: Any) -> None:
    shard = _window_shard(task)
    if shard is None or state not in _FINAL:
        return
    backend = backend_for(task.app)
    tag = backend.settings.tag(shard)
    try:
        backend.run(
            "finish",
            [f"{tag}:win:{task_id}", f"{tag}:leased", f"{tag}:active"],
            [task_id, state, backend.settings.history_ttl_ms],
        )
    except Exception as exc:
        logger.warning("debounce: could not mark %s[%s] finished: %s", task.name, task_id, exc)


task_prerun.connect(_claim, weak=False)
task_postrun.connect(_finish, weak=False)
