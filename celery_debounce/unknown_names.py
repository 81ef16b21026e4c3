"""Unknown ``debounce_*`` names: refused with the closest known name, never ignored.

A misspelt option (``debounce_colect=True`` on a task, ``debounce_replace_paylod=True``
on a call, ``debounce_redis_ulr`` on ``app.conf``) would otherwise be silently
ignored (on a call it even travels into the message's properties). Every name that
starts with the package's prefix ``debounce_`` must be one this package knows.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

from .errors import DebounceConfigError

#: The prefix every task option, call option and setting of this package starts with.
PREFIX = "debounce_"


def unknown_name(
    kind: str,
    name: str,
    value: Any,
    known: Iterable[str],
    *,
    bare: str | None = None,
    spell: Callable[[str], str] = str,
) -> DebounceConfigError:
    """The error for ``name`` (``bare``: its ``debounce_*`` part, when it carries a
    namespace), naming the closest of ``known`` (as ``spell`` writes it)."""
    ordered = sorted(known)
    close = difflib.get_close_matches(bare or name, ordered, n=1, cutoff=0.6)
    hint = (
        f"did you mean {spell(close[0])!r}?"
        if close
        else f"known: {', '.join(spell(k) for k in ordered)}"
    )
    return DebounceConfigError(
        f"{name}={_short(value)}: unknown {kind} (every name starting with {PREFIX!r} must "
        f"be one of celery_debounce's); {hint}"
    )


def refuse_unknown(kind: str, names: Iterable[tuple[str, Any]], known: Iterable[str]) -> None:
    """Raise :func:`unknown_name` for the first ``debounce_*`` name not in ``known``."""
    known = frozenset(known)
    for name, value in names:
        if isinstance(name, str) and name.startswith(PREFIX) and name not in known:
            raise unknown_name(kind, name, value, known)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def refuse_unknown_settings(conf: Any, namespace: str | None, known: Iterable[str]) -> None:
    """Refuse a ``debounce_*`` setting on ``app.conf`` that is not one of ``known``.

    Only names with the package's prefix count: ``debounce_*``, and with a namespace
    (``config_from_object("django.conf:settings", namespace="CELERY")``)
    ``CELERY_DEBOUNCE_*`` as Celery reads them (other Django settings, such as a
    ``DEBOUNCE_*`` of the project's own, are not the package's).
    """
    known = frozenset(known)
    space = f"{namespace.upper()}_" if namespace else None
    for key in list(conf.keys()):
        if not isinstance(key, str):
            continue
        name = key
        spell: Callable[[str], str] = str
        if space is not None and key.upper().startswith(space):
            name = key[len(space) :].lower()
            spell = _spelled(key[: len(space)], key[len(space) :].isupper())
        if name.startswith(PREFIX) and name not in known:
            raise unknown_name("setting", key, conf.get(key), known, bare=name, spell=spell)


def _spelled(space: str, upper: bool) -> Callable[[str], str]:
    def spell(name: str) -> str:
        return space + (name.upper() if upper else name)

    return spell
