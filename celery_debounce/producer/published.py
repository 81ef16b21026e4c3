"""Task definitions: what a producer by name (the Node package, another language) needs
to make the call ``.delay()`` makes, written into the windows' store by each worker at
start and by ``celery -A proj debounce publish`` (docs/contract.md, "Task definitions").

A definition is one JSON object per debounced task: its debounce options, the
signature its calls are bound to, the options JSON a call without options of its own
stores (the route from ``task_routes`` and the task, priority, expires, the exclusive
header), the settings that name and bound a window, and the gate contract's version.
Its ``version`` is a digest of the rest: a change of any of it is a new version,
which replaces the old one in the store.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
from typing import Any

from celery import Celery, Task

from ..settings import settings_for
from ..store.results import CONTRACT_VERSION
from .by_name import DEFINITION_FORMAT, KINDS
from .call import stored_options
from .task import DebouncedTask, exec_defaults

logger = logging.getLogger("celery_debounce.published")

#: Integers a JavaScript number holds exactly (beyond, a default is not published).
_SAFE_INT = 2**53 - 1


def definition(app: Celery, task: Task) -> str | None:
    """The task's definition as JSON, or None for a task that is not debounced (no
    ``debounce`` window, or a definition refused when the app finalized)."""
    if not isinstance(task, DebouncedTask) or type(task)._debounce_refused is not None:
        return None
    spec = task._debounce_defaults.spec
    if spec is None:
        return None
    settings = settings_for(app)
    _, options_json = stored_options(
        app, task.name, task, spec, (), {}, dict(exec_defaults(task)), None
    )
    signature = task.debounce_signature()
    accept = app.conf.accept_content or ()
    body: dict[str, Any] = {
        "format": DEFINITION_FORMAT,
        "contract": CONTRACT_VERSION,
        "task": task.name,
        "debounce_ms": spec.window_ms,
        "max_wait_ms": spec.max_wait_ms,
        "key": spec.key.source if spec.key is not None else None,
        "replace_payload": spec.replace_payload,
        "max_calls": spec.max_calls,
        "leading": spec.leading,
        "trailing": spec.trailing,
        "collect": spec.collect,
        "exclusive": spec.exclusive,
        "options": options_json,
        "accepts_json": "json" in accept or "application/json" in accept,
        "check_arguments": bool(task.typing and getattr(task, "__header__", None)),
        "signature": None if signature is None else _parameters(signature),
        "shards": settings.shards,
        "max_key_length": settings.max_key_length,
        "max_payload_bytes": settings.max_payload_bytes,
        "history_ttl_ms": settings.history_ttl_ms,
        "record_ttl_ms": settings.record_ttl_ms,
        "result_expires_ms": settings.result_expires_ms,
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    body["version"] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def definitions(app: Celery, skipped: dict[str, str] | None = None) -> dict[str, str]:
    """Task name -> definition JSON, for every debounced task of ``app``. A task whose
    definition cannot be made (a router function that refuses a call without arguments,
    say) is left out, logged, and named in ``skipped`` (name -> why): the others are
    still published."""
    app.loader.import_default_modules()
    out: dict[str, str] = {}
    for name, task in sorted(app.tasks.items()):
        try:
            text = definition(app, task)
        except Exception as exc:  # one task's fault must not keep the others out
            why = f"{type(exc).__name__}: {exc}"
            logger.warning("celery_debounce: no definition published for %s (%s)", name, why)
            if skipped is not None:
                skipped[name] = why
            continue
        if text is not None:
            out[name] = text
    return out


def publish(app: Celery) -> tuple[int, int]:
    """Write ``app``'s definitions into its store: ``(definitions, written)``, where
    ``written`` counts those that were new or changed."""
    from ..store import store_for

    found = definitions(app)
    return len(found), store_for(app).publish_definitions(found) if found else 0


def _parameters(signature: inspect.Signature) -> list[dict[str, Any]]:
    """Each parameter: name, kind and, where it has one, its default; a default a
    JSON reader cannot hold as Python does (a float with an integral value, an
    integer past 2**53, an object) is marked ``default_unusable`` instead."""
    out: list[dict[str, Any]] = []
    for param in signature.parameters.values():
        entry: dict[str, Any] = {"name": param.name, "kind": KINDS[param.kind]}
        if param.default is not param.empty:
            if _portable(param.default):
                entry["default"] = param.default
            else:
                entry["default_unusable"] = True
        out.append(entry)
    return out


def _portable(value: Any, depth: int = 0) -> bool:
    """True when JSON carries ``value`` to JavaScript and back as the same Python value."""
    if depth > 32:
        return False
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, str):
        return _is_text(value)
    if isinstance(value, int):
        return -_SAFE_INT <= value <= _SAFE_INT
    if isinstance(value, float):
        return math.isfinite(value) and not value.is_integer()
    if isinstance(value, (list, tuple)):
        return all(_portable(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(
            isinstance(k, str) and _is_text(k) and _portable(v, depth + 1) for k, v in value.items()
        )
    return False


def _is_text(value: str) -> bool:
    """``value`` is valid Unicode (no lone surrogate): UTF-8 can carry it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
