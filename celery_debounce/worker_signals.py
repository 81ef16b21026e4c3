"""Worker signals: mark a window claimed when its run starts, finished when it ends."""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import Task, states
from celery.signals import task_postrun, task_prerun
from redis.exceptions import NoScriptError

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


class _Pending(threading.local):
    """Per thread: the connection holding a sent ``claim.lua`` whose reply is unread."""

    conn: Any = None
    task_id: str = ""
    keys: list[str] = []  # replaced per run, never mutated


_pending = _Pending()


def _claim(task_id: str, task: Task, **_: Any) -> None:
    shard = _window_shard(task)
    if shard is None:
        return
    backend = backend_for(task.app)
    tag = backend.settings.tag(shard)
    keys = [f"{tag}:win:{task_id}", f"{tag}:leased", f"{tag}:active"]
    _read_claim(task)  # a run whose postrun never came: drain its reply first
    if backend.direct:
        # Send the claim now and read its reply when the run ends, before the finish
        # is sent: Redis runs it at once all the same, and the worker does not wait
        # a round trip before every run.
        conn = backend.connection()
        try:
            conn.send_packed_command(conn.pack_command(
                "EVALSHA", backend.scripts["claim"].sha, len(keys), *keys, task_id))
        except Exception:
            conn.disconnect()
            backend.release(conn)
        else:
            _pending.conn, _pending.task_id, _pending.keys = conn, task_id, keys
            return
    try:
        before = backend.run("claim", keys, [task_id])
    except Exception as exc:
        logger.warning("debounce: could not mark %s[%s] claimed: %s", task.name, task_id, exc)
        return
    _check_claim(task, task_id, before)


def _read_claim(task: Task) -> None:
    """Read the reply of the claim this thread sent, if any, and give back its connection."""
    conn, task_id = _pending.conn, _pending.task_id
    if conn is None:
        return
    _pending.conn = None
    backend = backend_for(task.app)
    try:
        before = conn.read_response()
    except NoScriptError:  # not run: Redis lost its scripts; claim the usual way
        backend.release(conn)
        try:
            before = backend.run("claim", _pending.keys, [task_id])
        except Exception as exc:
            logger.warning("debounce: could not mark %s[%s] claimed: %s", task.name, task_id, exc)
            return
    except redis.ResponseError as exc:
        backend.release(conn)
        logger.warning("debounce: could not mark %s[%s] claimed: %s", task.name, task_id, exc)
        return
    except Exception as exc:
        conn.disconnect()
        backend.release(conn)
        logger.warning("debounce: could not mark %s[%s] claimed: %s", task.name, task_id, exc)
        return
    else:
        backend.release(conn)
    _check_claim(task, task_id, before)


def _check_claim(task: Task, task_id: str, before: Any) -> None:
    if before in (b"claimed", b"finished") and not task.request.retries:
        logger.warning(
            "debounce: %s[%s] runs again (window was %s): redelivered or republished",
            task.name, task_id, before.decode(),
        )


def _finish(task_id: str, task: Task, state: str | None = None, **_: Any) -> None:
    shard = _window_shard(task)
    if shard is None:
        return
    _read_claim(task)
    if state not in _FINAL:
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
