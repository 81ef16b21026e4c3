"""Key templates: parsed once, resolved against each call's bound arguments.

A template is plain text with placeholders: ``{name}`` (argument by name),
``{0}`` (argument by position in the signature), ``{name.field}`` (a key inside a
mapping argument), ``{{`` and ``}}`` for literal braces. Nothing is evaluated:
there is no attribute access, indexing or format spec.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache

from ..errors import DebounceConfigError, DebounceKeyError

_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")  # ASCII digits only
_SUBKEY = re.compile(r"[^.{}\[\]!:]+")


@dataclass(frozen=True)
class Placeholder:
    """``{head.path[0].path[1]...}``: ``head`` is an argument name or index."""

    head: str | int
    path: tuple[str, ...]
    text: str


Part = str | Placeholder


@dataclass(frozen=True)
class KeyTemplate:
    """A parsed ``debounce_key`` template."""

    source: str
    parts: tuple[Part, ...]

    @property
    def placeholders(self) -> tuple[Placeholder, ...]:
        return tuple(p for p in self.parts if isinstance(p, Placeholder))


def parse_template(source: str, option: str = "debounce_key") -> KeyTemplate:
    """Parse ``source``; raise :class:`DebounceConfigError` on bad syntax."""
    if not isinstance(source, str):  # checked before the cache: lists are unhashable
        raise DebounceConfigError(f"{option}={source!r}: expected a str template")
    return _parse_template(source, option)


@lru_cache(maxsize=1024)
def _parse_template(source: str, option: str) -> KeyTemplate:
    parts: list[Part] = []
    literal: list[str] = []
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch == "{" and source.startswith("{{", i):
            literal.append("{")
            i += 2
        elif ch == "}" and source.startswith("}}", i):
            literal.append("}")
            i += 2
        elif ch == "}":
            raise DebounceConfigError(f"{option}={source!r}: single '}}' at {i}; write '}}}}'")
        elif ch == "{":
            end = source.find("}", i)
            if end < 0:
                raise DebounceConfigError(f"{option}={source!r}: unclosed '{{' at {i}")
            body = source[i + 1 : end]
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(_parse_placeholder(body, source, option))
            i = end + 1
        else:
            literal.append(ch)
            i += 1
    if literal:
        parts.append("".join(literal))
    return KeyTemplate(source, tuple(parts))


def _parse_placeholder(body: str, source: str, option: str) -> Placeholder:
    head, *path = body.split(".")
    if not _FIELD.fullmatch(head) or not all(_SUBKEY.fullmatch(p) for p in path):
        raise DebounceConfigError(
            f"{option}={source!r}: bad placeholder {{{body}}}; use {{name}}, {{0}} or "
            "{name.field} (no attribute access, indexing, conversions or format specs)"
        )
    return Placeholder(int(head) if head.isdigit() else head, tuple(path), body)


def check_against(
    template: KeyTemplate, fn: Callable[..., object], owner: str, skip_first: bool = False
) -> None:
    """Refuse, at registration, a placeholder that no call of ``fn`` can fill: a name
    that is not a parameter (unless ``fn`` takes ``**kwargs``), a position past the
    last positional parameter (unless it takes ``*args``). ``skip_first``: ``fn`` is a
    method (``self`` is not an argument of the call). A signature that cannot be read
    (a builtin) is not checked: the call still is."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return
    if (
        skip_first
        and params
        and params[0].kind
        in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ):
        params = params[1:]
    kinds = {p.kind for p in params}
    positional = [
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    names = [
        p.name
        for p in params
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    shown = ", ".join(names) or "none"
    for part in template.placeholders:
        if isinstance(part.head, int):
            if part.head >= len(positional) and inspect.Parameter.VAR_POSITIONAL not in kinds:
                raise DebounceConfigError(
                    f"{owner}: debounce_key={template.source!r}: {{{part.text}}} refers to "
                    f"argument {part.head} but the task takes {len(positional)} positional "
                    f"argument(s) ({shown})"
                )
        elif part.head not in names and inspect.Parameter.VAR_KEYWORD not in kinds:
            raise DebounceConfigError(
                f"{owner}: debounce_key={template.source!r}: {{{part.text}}} names no "
                f"parameter of the task (parameters: {shown})"
            )


def scalar_text(value: object) -> str | None:
    """The key text of a scalar value, or None if ``value`` is not a scalar."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return None


def resolve(
    template: KeyTemplate,
    positional: tuple[object, ...],
    named: Mapping[str, object],
) -> str:
    """Resolve ``template`` against a call.

    ``positional`` is every argument in signature order, ``named`` the same
    arguments by parameter name (for a by-name producer: the call's kwargs).
    """
    out: list[str] = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            continue
        value: object
        if isinstance(part.head, int):
            if part.head >= len(positional):
                raise DebounceKeyError(
                    f"debounce_key {template.source!r}: {{{part.text}}} refers to argument "
                    f"{part.head} but the call has {len(positional)} positional argument(s)"
                )
            value = positional[part.head]
        else:
            if part.head not in named:
                raise DebounceKeyError(
                    f"debounce_key {template.source!r}: {{{part.text}}} names no argument "
                    f"of this call (arguments: {', '.join(named) or 'none'})"
                )
            value = named[part.head]
        walked = part.head
        for field in part.path:
            if not isinstance(value, Mapping):
                raise DebounceKeyError(
                    f"debounce_key {template.source!r}: {{{part.text}}} needs {walked!r} "
                    f"to be a mapping, got {type(value).__name__}"
                )
            if field not in value:
                raise DebounceKeyError(
                    f"debounce_key {template.source!r}: {{{part.text}}}: {walked!r} "
                    f"has no key {field!r}"
                )
            value = value[field]
            walked = f"{walked}.{field}"
        if (isinstance(value, float) and not math.isfinite(value)) or (
            isinstance(value, Decimal) and not value.is_finite()
        ):
            raise DebounceKeyError(
                f"debounce_key {template.source!r}: {{{part.text}}} resolved to "
                f"{_short(value)}; a key cannot be NaN or an infinity (NaN never equals "
                "itself, and no other producer can write either)"
            )
        text = scalar_text(value)
        if text is None:
            raise DebounceKeyError(
                f"debounce_key {template.source!r}: {{{part.text}}} resolved to "
                f"{type(value).__name__} {_short(value)}; a key needs a str, number, "
                "bool, UUID, Decimal or date"
            )
        out.append(text)
    key = "".join(out)
    if "\x00" in key:  # PostgreSQL's text cannot hold it: refused on every store alike
        raise DebounceKeyError(
            f"debounce_key {template.source!r} resolved to {_short(key)}, which holds a NUL "
            f"character (at position {key.index(chr(0))}); a key cannot hold NUL on any store"
        )
    if not key.isascii():  # the Lua scripts see UTF-8: refuse what cannot be encoded
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DebounceKeyError(
                f"debounce_key {template.source!r} resolved to {_short(key)}, which is not "
                f"valid Unicode text ({exc.reason} at position {exc.start})"
            ) from None
    return key


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def digest_key(serialized_arguments: bytes) -> str:
    """The key of a call made without ``debounce_key``: a digest of its arguments."""
    return "args:" + hashlib.blake2b(serialized_arguments, digest_size=16).hexdigest()
