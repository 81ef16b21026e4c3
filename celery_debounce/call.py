"""Turn one call into what the gate stores: window ident, payload and opener's options."""

from __future__ import annotations

import inspect
import json
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kombu import serialization

from .errors import DebounceConfigError, DebounceKeyError, DebouncePayloadError
from .keys import digest_key, resolve, window_ident
from .options import DebounceSpec
from .settings import Settings

#: Options that only make sense at call time and are never stored.
_DROPPED = frozenset({"producer", "connection", "publisher", "router", "add_to_parent"})


@dataclass(frozen=True)
class PreparedCall:
    """Everything ``gate.lua`` needs for one call."""

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
    for name in ("countdown", "eta"):
        if options.get(name) is not None:
            raise DebounceConfigError(
                f"{name}={options[name]!r}: cannot be combined with debounce; the window "
                "decides when the task runs (use debounce=False on this call to bypass it)"
            )
    positional, named = bind_arguments(signature, args, kwargs)
    if spec.key is not None:
        key = resolve(spec.key, positional, named)
    else:
        _, _, canonical = serialization.dumps(
            [list(positional), sorted(named.items())], serializer=serializer
        )
        key = digest_key(canonical if isinstance(canonical, bytes) else canonical.encode())
    if len(key) > settings.max_key_length:
        raise DebounceKeyError(
            f"debounce_key resolved to {len(key)} characters ({key[:40]!r}...), above "
            f"debounce_max_key_length={settings.max_key_length}"
        )
    content_type, _encoding, data = serialization.dumps([list(args), kwargs], serializer=serializer)
    payload = data if isinstance(data, bytes) else data.encode("utf-8")
    if len(payload) > settings.max_payload_bytes:
        raise DebouncePayloadError(
            f"{task_name}: arguments serialize to {len(payload)} bytes, above "
            f"debounce_max_payload_bytes={settings.max_payload_bytes}"
        )
    ident = window_ident(task_name, key)
    shard = zlib.crc32(ident.encode("utf-8")) % settings.shards if settings.shards > 1 else 0
    return PreparedCall(
        task_name=task_name,
        key=key,
        ident=ident,
        shard=shard,
        task_id=task_id or str(uuid.uuid4()),
        spec=spec,
        content_type=content_type,
        payload=payload,
        options_json=encode_options(options),
    )


def bind_arguments(
    signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Arguments by signature position and by name, defaults applied."""
    if signature is None:
        return args, kwargs
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
