"""Turn one call into what the gate stores: window ident, payload and opener's options."""

from __future__ import annotations

import inspect
import io
import json as _json
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from celery import Celery
from celery.app.routes import MapRoute
from kombu import serialization
from kombu.exceptions import EncodeError
from kombu.utils import json as kombu_json

from ..errors import DebounceConfigError, DebounceKeyError, DebouncePayloadError
from ..headers import COLLECT_HEADER, EXCLUSIVE_HEADER
from ..settings import Settings
from ..store.idents import shard_of, window_ident
from ..stored_call import DEFAULT_CONTENT_TYPE, new_task_id
from .collect import BODY_OVERHEAD, TIME_PREFIX, call_element
from .key_templates import digest_key, resolve
from .message import call_options, encode_stored
from .options import DebounceSpec


class PreparedCall(NamedTuple):
    """Everything ``gate.lua`` needs for one call (a tuple: cheap to build per call).

    ``payload`` is the Celery protocol-2 body ``[args, kwargs, embed]`` serialized
    with the task's serializer; the dispatcher publishes it as it is.
    """

    task_name: str
    key: str
    ident: str
    shard: int
    task_id: str
    spec: DebounceSpec
    content_type: str
    payload: bytes
    options_json: str
    #: a debounce_collect call: the protocol-2 embed (JSON) the window's run gets if
    #: this call opens it; ``payload`` is then the call's element (collect.py)
    collect_embed: str = ""
    #: a call whose payload is not JSON: its protocol-2 embed as JSON, so that a
    #: replacing join can tell whether its body carries the window's embed (gate.lua)
    embed_json: str = ""


#: The protocol-2 embed of a call without links, chain or chord.
_NO_EMBED: dict[str, Any] = {}


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
    *,
    app: Celery | None = None,
    task_type: Any = None,
    static: dict[str, str] | None = None,
) -> PreparedCall:
    """Validate and encode a call; raises before anything is written.

    ``options`` (consumed) are the call's Celery options with the task's own
    defaults merged in. With ``app``, the route is resolved here as
    ``app.send_task`` would (``task_type`` is the task, when registered). Pass
    ``static`` (see :func:`static_routing`) only for a call that has no options of
    its own: its stored options are then computed once per task and reused.
    """
    args, kwargs = _checked_arguments(args, kwargs)
    embed, options_json = stored_options(
        app, task_name, task_type, spec, args, kwargs, options, static
    )
    try:
        positional, named = bind_arguments(signature, tuple(args), kwargs)
    except TypeError as exc:  # typing=False: Celery publishes calls the signature refuses
        if spec.key is not None:
            raise DebounceKeyError(
                f"{task_name}: debounce_key {spec.key.source!r} cannot be resolved: the "
                f"arguments do not match the task's signature ({exc})"
            ) from None
        positional, named = tuple(args), kwargs
    if spec.key is not None:  # a template error names the placeholder: report it first
        key = resolve(spec.key, positional, named)
    collect_embed = embed_json = ""
    if spec.collect:
        content_type, payload, collect_embed = _collect_payload(
            settings, task_name, args, kwargs, embed, serializer, task_id
        )
    else:
        try:  # inline, not encode_call: this is every call's hot path
            content_type, payload = encode([args, kwargs, embed], serializer)
        except EncodeError as exc:
            raise encode_refused(task_name, args, kwargs, serializer, exc) from exc
        if content_type != DEFAULT_CONTENT_TYPE:
            embed_json = encode_stored(embed) if embed else "{}"
        if len(payload) > settings.max_payload_bytes:
            raise DebouncePayloadError(
                f"{task_name}: arguments serialize to {len(payload)} bytes, above "
                f"debounce_max_payload_bytes={settings.max_payload_bytes}"
            )
    if spec.key is None:  # after the payload: unserializable arguments raise EncodeError
        key = _digest(task_name, positional, named, serializer)
    _check_length(settings, key)
    # a templated key is checked for UTF-8 in key_templates.resolve, the task name in
    # keys.ident_prefix; a digest key is ASCII
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
        options_json,
        collect_embed,
        embed_json,
    )


def _digest(task_name: str, positional: Any, named: Any, serializer: str) -> str:
    """The default key: a digest of the bound arguments."""
    try:
        return digest_key(canonical_arguments(positional, named, serializer))
    except RecursionError:
        raise DebounceKeyError(
            f"{task_name}: the arguments refer to themselves; the default key cannot "
            "digest them: pass debounce_key="
        ) from None


def _check_length(settings: Settings, key: str) -> None:
    """Refuse a key longer than ``debounce_max_key_length``."""
    if len(key) > settings.max_key_length:
        raise DebounceKeyError(
            f"debounce_key resolved to {len(key)} characters ({key[:40]!r}...), above "
            f"debounce_max_key_length={settings.max_key_length}"
        )


def _checked_arguments(
    args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None
) -> tuple[Sequence[Any], dict[str, Any]]:
    """``args`` and ``kwargs`` as Celery takes them (None: none), or refused."""
    if args is None:
        args = ()
    elif not isinstance(args, (list, tuple)):
        raise DebounceConfigError(f"args={_short(args)}: task args must be a list or tuple")
    if kwargs is None:
        return args, {}
    if not isinstance(kwargs, Mapping):
        raise DebounceConfigError(
            f"kwargs={_short(kwargs)}: task keyword arguments must be a mapping"
        )
    return args, dict(kwargs)


def stored_options(
    app: Celery | None,
    task_name: str,
    task_type: Any,
    spec: DebounceSpec,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    options: dict[str, Any],
    static: dict[str, str] | None,
) -> tuple[dict[str, Any], str]:
    """The call's protocol-2 embed and its stored options as JSON: from ``static``
    (per task) for a call with no options of its own, else computed (and kept there
    when they are the task's alone)."""
    if (
        static is not None
        and task_name in static
        and not spec.exclusive
        and (app is None or app.current_worker_task is None)
    ):
        return _NO_EMBED, static[task_name]
    if options:
        refuse_schedule(options)
    embed, stored = call_options(app, task_name, task_type, args, kwargs, options)
    if spec.collect:  # the worker knows the body's shape (headers.COLLECT_HEADER)
        stored["headers"] = {**stored.get("headers", {}), COLLECT_HEADER: 1}
    if spec.exclusive:  # take.lua holds it while a run of its key is in progress
        stored["headers"] = {**stored.get("headers", {}), EXCLUSIVE_HEADER: 1}
    options_json = encode_stored(stored)
    if static is not None and "parent_id" not in stored and not spec.exclusive:
        static[task_name] = options_json  # per task: an exclusive call's (per call) differ
    return embed, options_json


def _collect_payload(
    settings: Settings,
    task_name: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    embed: dict[str, Any],
    serializer: str,
    task_id: str | None,
) -> tuple[str, bytes, str]:
    """``(content type, the call's element, embed JSON)`` of a debounce_collect call.

    Refused when the serializer is not JSON (the run's body is spliced from the
    elements as bytes) or when the call alone would make a body above
    ``debounce_max_payload_bytes`` (a window holds calls up to that many bytes).
    """
    if serializer != "json":
        raise DebounceConfigError(
            f"{task_name}: debounce_collect=True needs serializer='json' (got "
            f"serializer={serializer!r}): the run's body is spliced from the calls' JSON"
        )
    content_type, element = encode_call(
        task_name, call_element(args, kwargs, task_id), args, kwargs, serializer
    )
    embed_json = encode_stored(embed) if embed else "{}"
    size = BODY_OVERHEAD + len(embed_json.encode("utf-8")) + len(element) + TIME_PREFIX
    if size > settings.max_payload_bytes:
        raise DebouncePayloadError(
            f"{task_name}: this call makes a body of {size} bytes on its own, above "
            f"debounce_max_payload_bytes={settings.max_payload_bytes}"
        )
    return content_type, element, embed_json


def call_key(
    settings: Settings,
    task_name: str,
    spec: DebounceSpec,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    signature: inspect.Signature | None,
    serializer: str,
) -> str:
    """The window key a call with these arguments resolves to: :func:`prepare_call`
    itself (same checks, binding, template or digest, limits), with no options of
    its own and nothing written. Used to steer a window by the task's arguments."""
    return prepare_call(
        settings, task_name, spec, args, kwargs, {}, signature, serializer, static={task_name: "{}"}
    ).key


def static_routing(app: Celery) -> dict[str, str] | None:
    """A per-app cache for option-less calls, or None when routes may look at arguments.

    ``task_routes`` made only of mappings/globs (``MapRoute``) route by task name,
    so the stored options of a call without options depend only on the task.
    """
    cached: tuple[Any, dict[str, str] | None] | None = app.__dict__.get("_debounce_static")
    routes = cached_attribute(cached_attribute(app, "amqp"), "routes")
    if cached is not None and cached[0] is routes:
        return cached[1]
    static: dict[str, str] | None = {} if all(isinstance(r, MapRoute) for r in routes) else None
    app._debounce_static = (routes, static)  # type: ignore[attr-defined, unused-ignore]
    return static


def cached_attribute(obj: Any, name: str) -> Any:
    """``getattr(obj, name)`` for a kombu ``cached_property`` (``app.amqp``,
    ``amqp.routes``, ``app.AsyncResult``): its value once computed sits in the
    instance's ``__dict__`` (also after a set), which a read of the attribute reaches
    only through the property's lock."""
    value = obj.__dict__.get(name)
    return getattr(obj, name) if value is None else value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def canonical_arguments(
    positional: Sequence[Any],
    named: Mapping[str, Any],
    serializer: str,
) -> bytes:
    """The bytes the default key digests: equal arguments give equal bytes.

    Mappings count in sorted key order at every depth (``{"a": 1, "b": 2}`` equals
    ``{"b": 2, "a": 1}``). With JSON (the default serializer) the digest is of JSON
    with sorted keys: what the task receives, up to key order (tuples equal lists,
    ``{1: "x"}`` equals ``{"1": "x"}``, ``1`` differs from ``1.0``). Mapping keys of
    mixed types, which Python cannot sort, are compared as the JSON the task
    receives (encoded, parsed back, encoded with sorted keys). With another serializer
    the arguments are rebuilt with mappings as lists of pairs ordered by key type
    and ``repr``, and sets and frozensets in that order too, then encoded with it
    (pickle without its memo, so equal values pickle alike whether shared or not).
    """
    if serializer == "json":
        try:
            return _canonical_json([list(positional), named]).encode("utf-8")
        except TypeError as exc:
            if "not supported between" not in str(exc):
                raise
            # mixed key types: JSON turns every key into a string; compare that
            as_sent = _json.loads(_plain_json([list(positional), named]))
            return _canonical_json(as_sent).encode("utf-8")
    canonical = _canonical([list(positional), named])
    if serializer == "pickle":  # no memo: equal values shared or not pickle alike
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.fast = True
        pickler.dump(canonical)
        return out.getvalue()
    return encode(canonical, serializer)[1]


def _order(value: Any) -> tuple[str, str]:
    return type(value).__qualname__, repr(value)


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return [[k, _canonical(value[k])] for k in sorted(value, key=_order)]
    if isinstance(value, (list, tuple)):
        return type(value)(_canonical(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return [_canonical(v) for v in sorted(value, key=_order)]
    return value


# typed here: kombu < 5.7 has no annotations (mypy --strict on the lowest corner)
_canonical_json: Callable[[Any], str] = kombu_json.JSONEncoder(
    sort_keys=True, separators=(",", ":")
).encode
_plain_json: Callable[[Any], str] = kombu_json.JSONEncoder(separators=(",", ":")).encode


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


def encode_call(
    task_name: str, data: Any, args: Sequence[Any], kwargs: Mapping[str, Any], serializer: str
) -> tuple[str, bytes]:
    """:func:`encode` of a call's ``data``; kombu's ``EncodeError`` (what plain Celery
    raises) names the task and the first argument the serializer refuses."""
    try:
        return encode(data, serializer)
    except EncodeError as exc:
        raise encode_refused(task_name, args, kwargs, serializer, exc) from exc


def encode_refused(
    task_name: str, args: Sequence[Any], kwargs: Mapping[str, Any], serializer: str, exc: Exception
) -> EncodeError:
    """The ``EncodeError`` of a call whose arguments ``serializer`` refused, naming the
    task and the first argument it refuses."""
    return EncodeError(
        f"{task_name}: {_refused_argument(args, kwargs, serializer)} "
        f"cannot be serialized with {serializer!r}: {exc}"
    )


def _refused_argument(args: Sequence[Any], kwargs: Mapping[str, Any], serializer: str) -> str:
    named = [(f"argument {i} (args[{i}]", value) for i, value in enumerate(args)]
    named += [(f"argument {name!r} (kwargs[{name!r}]", value) for name, value in kwargs.items()]
    for label, value in named:
        try:
            encode(value, serializer)
        except Exception:  # any refusal names this argument
            return f"{label}, {type(value).__name__})"
    return "the call"


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
        for name in names[len(args) :]:
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
