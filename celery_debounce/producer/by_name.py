"""A task's published definition as a producer by name reads it (``send_task`` of a
task this process does not have registered): its debounce options, the signature
calls are bound to, and the options a call without options of its own stores. The
format is docs/contract.md's section 7; ``producer/published.py`` writes it."""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass
from typing import Any

from celery import Celery

from ..errors import DebounceConfigError, DebounceContractMismatch
from ..store.results import CONTRACT_VERSION
from .options import TaskDefaults

#: Bumped when a field changes meaning; a reader refuses a format it does not know.
DEFINITION_FORMAT = 1

#: Each parameter kind, by its name in a definition.
KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: "positional_only",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional_or_keyword",
    inspect.Parameter.VAR_POSITIONAL: "var_positional",
    inspect.Parameter.KEYWORD_ONLY: "keyword_only",
    inspect.Parameter.VAR_KEYWORD: "var_keyword",
}


#: How long a definition read by a producer by name is used before it is read again (s).
DEFINITION_MAX_AGE_S = 5.0

_KIND_OF = {name: kind for kind, name in KINDS.items()}


@dataclass(frozen=True)
class Published:
    """A task's definition as a producer by name uses it: its debounce options, the
    signature calls are bound to (None: not bound), the options a call without options
    of its own stores, and whether a call that does not fit the signature is refused."""

    defaults: TaskDefaults
    signature: inspect.Signature | None
    options: dict[str, Any]
    check_arguments: bool
    #: parameters whose default only the publishing process holds (``default_unusable``)
    unusable: frozenset[str]


def published(app: Celery, name: str) -> Published | None:
    """The definition of task ``name`` published in ``app``'s store (read at most every
    :data:`DEFINITION_MAX_AGE_S` per app and task), or None."""
    from ..store import store_for

    cache: dict[str, tuple[float, Published | None]] = app.__dict__.setdefault(
        "_debounce_published", {}
    )
    now = time.monotonic()
    hit = cache.get(name)
    if hit is not None and now - hit[0] < DEFINITION_MAX_AGE_S:
        return hit[1]
    text = store_for(app).task_definition(name)
    found = None if text is None else _parse(name, text)
    cache[name] = (now, found)
    return found


def _parse(name: str, text: str) -> Published:
    """A definition's JSON as :class:`Published`; refused when this package cannot follow it."""
    try:
        body = json.loads(text)
        if body["contract"] != CONTRACT_VERSION:
            raise DebounceContractMismatch(
                f"{name}: the deployment's definition speaks gate contract {body['contract']}, "
                f"this package {CONTRACT_VERSION}: upgrade celery-debounced",
                str(CONTRACT_VERSION),
                str(body["contract"]),
            )
        if body["format"] != DEFINITION_FORMAT:
            raise DebounceConfigError(
                f"{name}: its definition is of format {body['format']!r}, this package reads "
                f"{DEFINITION_FORMAT}: upgrade celery-debounced"
            )
        defaults = TaskDefaults.validate(
            {
                "debounce": f"{body['debounce_ms']}ms",
                "debounce_max_wait": f"{body['max_wait_ms']}ms",
                "debounce_key": body["key"],
                "debounce_replace_payload": body["replace_payload"],
                "debounce_max_calls": body["max_calls"],
                "debounce_leading": body["leading"],
                "debounce_trailing": body["trailing"],
                "debounce_collect": body["collect"],
                "debounce_exclusive": body["exclusive"],
            }
        )
        params = body["signature"]
        signature = None
        unusable: frozenset[str] = frozenset()
        if params is not None:
            signature = inspect.Signature(
                [
                    inspect.Parameter(
                        p["name"], _KIND_OF[p["kind"]], default=p.get("default", _EMPTY)
                    )
                    for p in params
                ]
            )
            unusable = frozenset(p["name"] for p in params if p.get("default_unusable"))
        options = json.loads(body["options"])
        check = bool(body["check_arguments"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DebounceConfigError(
            f"{name}: its published definition cannot be read ({type(exc).__name__}: {exc})"
        ) from None
    return Published(defaults, signature, options, check, unusable)


_EMPTY = inspect.Parameter.empty


def refuse_unfit(name: str, found: Published, args: Any, kwargs: Any) -> None:
    """Refuse a call by name that omits a parameter whose default only the publishing
    process holds, or (where the task checks its arguments) does not fit its signature."""
    if found.signature is None:
        return
    given = set(kwargs or ())
    positional = [
        p.name
        for p in found.signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ][: len(args or ())]
    missing = sorted(found.unusable - given - set(positional))
    if missing:
        raise DebounceConfigError(
            f"{name}: the call leaves out {missing[0]!r}, whose default only the task's own "
            "process holds (a date, a float such as 1.0, an object): pass it on the call"
        )
    if found.check_arguments:
        try:
            found.signature.bind(*(args or ()), **(kwargs or {}))
        except TypeError as exc:
            raise DebounceConfigError(
                f"{name}: the arguments do not match the task's signature ({exc})"
            ) from None
