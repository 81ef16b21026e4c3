"""Turn one call into what the gate stores: window ident, payload and opener's options."""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from kombu import serialization
from kombu.utils import json as kombu_json

from .errors import DebounceConfigError, DebounceKeyError, DebouncePayloadError
from .keys import digest_key, resolve, shard_of, window_ident
from .options import DebounceSpec
from .settings import Settings

#: Options that only make sense at call time and are never stored.
_DROPPED = frozenset({"producer", "connection", "publisher", "router", "add_to_parent"})


class PreparedCall(NamedTuple):
    """Everything ``gate.lua`` needs for one call (a tuple: cheap to build per call)."""

    task_name: str
    key: str
    ident: str
    shard: int
    task_id: str
    spec: DebounceSpec
    content_type: str
    payload: bytes
    options_json: str


def prepare_call(
    settings: Settings,
    task_name: str,
    spec: DebounceSpec,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: dict[str, Any],
    signature: inspect.Signature | None,
    serializer: str,
    task_id: str | None = None,
) -> PreparedCall:
    """Validate and encode a call; raises before anything is written."""
    args = tuple(args or ())
    kwargs = dict(kwargs or {})
    if options:
        refuse_schedule(options)
    positional, named = bind_arguments(signature, args, kwargs)
    if spec.key is not None:
        key = resolve(spec.key, positional, named)
    else:
        _, canonical = encode([list(positional), sorted(named.items())], serializer)
        key = digest_key(canonical)
    if len(key) > settings.max_key_length:
        raise DebounceKeyError(
            f"debounce_key resolved to {len(key)} characters ({key[:40]!r}...), above "
            f"debounce_max_key_length={settings.max_key_length}"
        )
    content_type, payload = encode([list(args), kwargs], serializer)
    if len(payload) > settings.max_payload_bytes:
        raise DebouncePayloadError(
            f"{task_name}: arguments serialize to {len(payload)} bytes, above "
            f"debounce_max_payload_bytes={settings.max_payload_bytes}"
        )
    ident = window_ident(task_name, key)
    return PreparedCall(
        task_name,
        key,
        ident,
        shard_of(ident, settings.shards),
        task_id or new_task_id(),
        spec,
        content_type,
        payload,
        encode_options(options) if options else "{}",
    )


def new_task_id() -> str:
    """A random (version 4) UUID as text, like ``str(uuid.uuid4())`` at a third of the cost."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def encode(data: Any, serializer: str) -> tuple[str, bytes]:
    """``(content type, bytes)`` of ``data``, as kombu's ``dumps`` would encode it."""
    codec = _codecs.get(serializer)
    if codec is None:
        codec = serialization.registry._encoders.get(serializer)
        if codec is None or serializer == "raw":
            dumps: Any = serialization.dumps
            content_type, _, raw = dumps(data, serializer=serializer)
            return content_type, raw if isinstance(raw, bytes) else raw.encode("utf-8")
        if codec.encoder is kombu_json.dumps:  # kombu's JSON: one encoder, not one per call
            codec = codec._replace(encoder=kombu_json.JSONEncoder().encode)
        _codecs[serializer] = codec
    try:
        out = codec.encoder(data)
    except Exception:
        kombu_dumps: Any = serialization.dumps
        kombu_dumps(data, serializer=serializer)  # raises kombu's EncodeError
        raise
    return codec.content_type, out if isinstance(out, bytes) else out.encode("utf-8")


_codecs: dict[str, Any] = {}

#: (signature, parameter names, defaults) of a signature with positional-or-keyword
#: parameters only; such calls are bound without ``Signature.bind``.
_Simple = tuple[inspect.Signature, tuple[str, ...], dict[str, Any]]
_simple: dict[int, _Simple | None] = {}


def _simple_signature(signature: inspect.Signature) -> _Simple | None:
    key = id(signature)
    if key in _simple:
        entry = _simple[key]
        if entry is None or entry[0] is signature:
            return entry
    params = signature.parameters.values()
    entry = None
    if all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params):
        entry = (
            signature,
            tuple(p.name for p in params),
            {p.name: p.default for p in params if p.default is not p.empty},
        )
    if len(_simple) > 4096:
        _simple.clear()
    _simple[key] = entry
    return entry


def refuse_schedule(options: Mapping[str, Any]) -> None:
    """``countdown``/``eta`` cannot be combined with debounce: the window decides."""
    for name in ("countdown", "eta"):
        if options.get(name) is not None:
            raise DebounceConfigError(
                f"{name}={options[name]!r}: cannot be combined with debounce; the window "
                "decides when the task runs (use debounce=False on this call to bypass it)"
            )


def bind_arguments(
    signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments by signature position and by name, defaults applied."""
    if signature is None:
        return args, kwargs
    simple = _simple_signature(signature)
    if simple is not None and len(args) <= len(simple[1]):
        names, defaults = simple[1], simple[2]
        fast = dict(zip(names, args, strict=False))
        used = 0
        for name in names[len(args):]:
            if name in kwargs:
                fast[name] = kwargs[name]
                used += 1
            elif name in defaults:
                fast[name] = defaults[name]
            else:
                break
        else:
            if used == len(kwargs):
                return tuple(fast.values()), fast
        # missing, duplicate or unknown arguments: let inspect raise its usual error
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    positional: list[Any] = []
    named: dict[str, Any] = {}
    for param in signature.parameters.values():
        value = bound.arguments.get(param.name)
        if param.kind is param.VAR_POSITIONAL:
            positional.extend(value or ())
        elif param.kind is param.VAR_KEYWORD:
            named.update(value or {})
        else:
            if param.kind is not param.KEYWORD_ONLY:
                positional.append(value)
            named[param.name] = value
    return tuple(positional), named


def encode_options(options: Mapping[str, Any]) -> str:
    """The opener's Celery options as JSON, stored with the window."""
    if not options:
        return "{}"
    stored: dict[str, Any] = {}
    for name, value in options.items():
        if name in _DROPPED or value is None:
            continue
        if name in ("queue", "exchange") and not isinstance(value, str):
            value = getattr(value, "name", value)
        elif name == "expires":
            if isinstance(value, datetime):
                stored["expires_at"] = value.isoformat()
                continue
            if isinstance(value, timedelta):
                value = value.total_seconds()
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise DebounceConfigError(
                    f"expires={value!r}: expected seconds, a timedelta or a datetime"
                )
        elif name in ("link", "link_error"):
            items = value if isinstance(value, (list, tuple)) else [value]
            if not all(isinstance(s, Mapping) for s in items):
                raise DebounceConfigError(
                    f"{name}={value!r}: expected a signature or a list of them"
                )
            value = [dict(s) for s in items] if isinstance(value, (list, tuple)) else dict(value)
        elif name == "headers" and not isinstance(value, Mapping):
            raise DebounceConfigError(f"headers={value!r}: expected a mapping")
        stored[name] = value
    try:
        return json.dumps(stored, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError) as exc:
        bad = next((n for n, v in stored.items() if not _json_ok(v)), "?")
        raise DebounceConfigError(
            f"{bad}={stored.get(bad)!r}: a debounced call's options are stored until the "
            f"window runs and must be JSON-serializable ({exc})"
        ) from None


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
