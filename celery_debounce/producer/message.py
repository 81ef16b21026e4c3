"""A window's Celery message: built and checked at call time, published as stored.

At call time (:func:`call_options`) the opener's options go through the same
steps ``Task.apply_async`` -> ``app.send_task`` -> ``amqp.send_task_message`` ->
``Producer.publish`` put them through (routing with ``task_routes`` and router
functions, ``expires`` arithmetic, compression and delivery-mode lookups, the
retry-policy merge, JSON encoding of everything the Redis transport encodes), so
a call is refused at once, with nothing written, exactly where plain Celery would
refuse it. What survives is stored with the window: the protocol-2 *embed*
(callbacks, errbacks, chain, chord) goes into the body ``[args, kwargs, embed]``
serialized with the task's serializer (record field ``p``), everything else into
the options JSON (field ``o``), the route already resolved and stored by name.

At dispatch the dispatcher only builds headers and properties around the stored body
(:class:`celery_debounce.headers.WindowMessage`); it never deserializes it.
"""

from __future__ import annotations

import numbers
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from celery import Celery
from celery.utils.time import maybe_make_aware
from kombu import compression
from kombu.entity import Exchange, Queue, maybe_delivery_mode
from kombu.utils import json as kombu_json
from kombu.utils.functional import maybe_list

from ..compat import add_seconds_to_datetime, subtract_datetimes
from ..errors import DebounceConfigError
from ..stored_call import encode_options

#: Call options used while publishing a call and never stored: the dispatcher
#: publishes on its own producer with its own retry policy (``retry=False``, the
#: window is retried by lease) and declares the routed queue itself.
CALL_ONLY = frozenset(
    {
        "producer",
        "connection",
        "publisher",
        "router",
        "add_to_parent",
        "retry",
        "retry_policy",
        "declare",
        "timeout",
        "confirm_timeout",
        "content_encoding",
        "result_cls",
        "task_type",
        "route_name",
        "serializer",
        "retries",  # a window's run starts at retries=0
    }
)

#: Call option -> key of the protocol-2 embed (the third element of the body).
EMBED = {"link": "callbacks", "link_error": "errbacks", "chain": "chain", "chord": "chord"}

#: Stored options that become message headers rather than publish arguments.
HEADER_OPTIONS = frozenset(
    {
        "shadow",
        "time_limit",
        "soft_time_limit",
        "group_id",
        "group_index",
        "root_id",
        "parent_id",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
        "reply_to",
        "expires",
        "expires_at",
        "headers",
    }
)

_EMPTY_EMBED: dict[str, Any] = {}


def refuse(option: str, value: Any, why: str) -> DebounceConfigError:
    return DebounceConfigError(f"{option}={_short(value)}: {why}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def call_options(
    app: Celery | None,
    task_name: str,
    task_type: Any,
    args: Any,
    kwargs: Any,
    options: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(embed, stored options)`` of one call; raises where Celery would refuse it.

    ``options`` are the call's Celery options (the task's own defaults merged in,
    debounce options already removed); it is consumed.
    """
    policy = options.get("retry_policy")
    if policy:
        _check_retry_policy(app, policy, options.get("retry"))
    if options.get("content_type") is not None:
        raise refuse(
            "content_type",
            options["content_type"],
            "the body is serialized with the task's serializer; pass serializer= instead "
            "(Celery fails to publish such a call too)",
        )
    router = options.get("router")
    embed = _EMPTY_EMBED
    stored: dict[str, Any] = {}
    for name, value in options.items():
        if value is None or name in CALL_ONLY:
            continue
        if name in EMBED:
            if embed is _EMPTY_EMBED:
                embed = {}
            # as app.send_task: maybe_list(link), maybe_list(link_error)
            embed[EMBED[name]] = maybe_list(value) if name.startswith("link") else value
            continue
        stored[name] = value
    if "expires" in stored:
        stored.pop("expiration", None)  # app.send_task sets it from expires
        _expires(app, stored)
    headers = stored.get("headers")
    if not headers:  # amqp.send_task_message: `if headers: headers2.update(headers)`
        stored.pop("headers", None)
    else:
        try:
            stored["headers"] = dict(headers)
        except (TypeError, ValueError) as exc:
            raise refuse("headers", headers, f"expected a mapping ({exc})") from None
    _check_properties(stored)
    stamped = stored.get("stamped_headers")
    if stamped:
        try:
            stored["stamps"] = {h: options[h] for h in stamped}
        except (KeyError, TypeError) as exc:
            raise refuse(
                "stamped_headers", stamped, f"each stamp needs its option ({exc})"
            ) from None
        for h in stamped:  # as app.send_task: a stamp is a header, not a property
            stored.pop(h, None)
    if app is not None:
        _route(app, router, task_name, task_type, args, kwargs, stored)
        parent = app.current_worker_task
        if parent is not None:  # as app.send_task: the caller's task is the parent
            if not stored.get("root_id"):
                stored["root_id"] = parent.request.root_id or parent.request.id
            if not stored.get("parent_id"):
                stored["parent_id"] = parent.request.id
    return embed, stored


def _check_retry_policy(app: Celery | None, policy: Any, retry: Any) -> None:
    """Refuse a ``retry_policy`` Celery would fail to publish with."""
    try:  # amqp.send_task_message: dict(default_policy, **retry_policy)
        dict({}, **policy)
    except TypeError as exc:
        raise refuse("retry_policy", policy, f"expected a mapping of str keys ({exc})") from None
    if retry is None and app is not None:
        retry = app.conf.task_publish_retry
    unknown = set(policy) - _ensure_parameters()
    if retry and unknown:  # kombu's Connection.ensure(**policy) refuses them
        raise refuse(
            "retry_policy",
            policy,
            f"unknown key(s) {', '.join(sorted(map(str, unknown)))} (known: "
            f"{', '.join(sorted(_ensure_parameters()))})",
        )


def _check_properties(stored: dict[str, Any]) -> None:
    """Refuse an ``expiration``, ``compression`` or ``delivery_mode`` kombu would fail
    to publish with."""
    if "expiration" in stored and "expires" not in stored and "expires_at" not in stored:
        try:  # kombu's Producer.publish: str(int(expiration * 1000))
            str(int(stored["expiration"] * 1000))
        except (TypeError, ValueError, OverflowError) as exc:
            raise refuse("expiration", stored["expiration"], f"expected seconds ({exc})") from None
    if stored.get("compression"):
        try:
            compression.get_encoder(stored["compression"])
        except (KeyError, TypeError):
            raise refuse(
                "compression",
                stored["compression"],
                f"unknown compression (known: {', '.join(sorted(compression.encoders()))})",
            ) from None
    if stored.get("delivery_mode"):
        try:
            maybe_delivery_mode(stored["delivery_mode"])
        except (KeyError, TypeError):
            raise refuse(
                "delivery_mode",
                stored["delivery_mode"],
                "expected 1, 2, 'transient' or 'persistent'",
            ) from None


@lru_cache(maxsize=1)
def _ensure_parameters() -> frozenset[str]:
    """The keyword arguments a retry policy may carry (``kombu.Connection.ensure``)."""
    import inspect

    from kombu.connection import Connection

    params = inspect.signature(Connection.ensure).parameters
    return frozenset(
        n
        for n, p in params.items()
        if p.kind is p.KEYWORD_ONLY
        or (p.default is not p.empty and n not in ("self", "obj", "fun"))
    )


def _expires(app: Celery | None, stored: dict[str, Any]) -> None:
    """Check ``expires`` as ``app.send_task``/``as_task_v2`` would; keep it relative.

    A number (seconds) stays relative and counts from the publish (the window's
    deadline), not from the call; a datetime or ISO string is an absolute time.
    A ``timedelta`` (which plain Celery refuses) is accepted as seconds.
    """
    value = stored.pop("expires")
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, numbers.Real):
        try:
            now = app.now() if app is not None else datetime.now().astimezone()
            maybe_make_aware(add_seconds_to_datetime(now, value))
            seconds = float(value)
        except (ValueError, OverflowError, TypeError) as exc:
            raise refuse("expires", value, f"not a usable number of seconds ({exc})") from None
        stored["expires"] = seconds
        return
    try:  # app.send_task: subtract_datetimes(expires, now), isoparse for a string
        if isinstance(value, datetime):
            subtract_datetimes(value, datetime.now().astimezone())
            stored["expires_at"] = value.isoformat()
            return
        if isinstance(value, str):
            from dateutil.parser import isoparse

            subtract_datetimes(isoparse(value), datetime.now().astimezone())
            stored["expires_at"] = value
            return
    except (ValueError, OverflowError, TypeError) as exc:
        raise refuse("expires", value, f"not a usable time ({exc})") from None
    raise refuse("expires", value, "expected seconds, a datetime or an ISO 8601 string")


def _route(
    app: Celery,
    router: Any,
    name: str,
    task_type: Any,
    args: Any,
    kwargs: Any,
    stored: dict[str, Any],
) -> None:
    """Resolve the route as ``app.send_task`` would and keep it by name."""
    routed_in = {k: v for k, v in stored.items() if k not in HEADER_OPTIONS}
    try:
        routed = (router or app.amqp.router).route(routed_in, name, args, kwargs, task_type)
    except Exception as exc:
        raise DebounceConfigError(
            f"{name}: routing refused the call ({type(exc).__name__}: {exc}); "
            "check queue=/exchange=/routing_key= and task_routes"
        ) from None
    queue = routed.pop("queue", None)
    name = queue.name if isinstance(queue, Queue) else queue
    if name is not None and not isinstance(name, str):
        raise refuse("queue", name, "expected a queue name (str) or a kombu Queue")
    if name is not None and (
        name != app.conf.task_default_queue or "exchange" in routed or "routing_key" in routed
    ):
        stored["queue"] = name
    else:  # the default queue: the dispatcher's default, not stored (saves bytes per window)
        stored.pop("queue", None)
    for key, value in routed.items():
        if key in ("exchange",) and isinstance(value, Exchange):
            value = value.name
        if value is not None:
            stored[key] = value


def encode_stored(stored: dict[str, Any]) -> str:
    """The stored options as JSON (stored_call.encode_options), refused with the option named."""
    try:
        return encode_options(stored)
    except (TypeError, ValueError) as exc:
        bad = next((n for n, v in stored.items() if not _json_ok(v)), "?")
        raise refuse(
            bad,
            stored.get(bad),
            f"a debounced call's options are stored until the window runs and must be "
            f"JSON-serializable, as the Redis broker would encode them ({exc})",
        ) from None


def _json_ok(value: Any) -> bool:
    try:
        kombu_json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True
