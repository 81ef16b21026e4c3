"""A window's Celery message as the dispatcher publishes it: headers and properties
built around the body stored at call time (:mod:`celery_debounce.producer.message`
checks and stores it), which is never deserialized here.

Every message header of the package is named here: where the record is
(:data:`TAG_HEADER`, :data:`SHARD_HEADER`, :data:`IDENT_HEADER`), a delivery sent
again (:data:`DEFERRED_HEADER`), an exclusive window (:data:`EXCLUSIVE_HEADER`) and
what the run stands for (:data:`CALLS_HEADER`, :data:`COLLECT_HEADER`). Shared
by the producer (which stores them with a window or sends them with a plain call), the
dispatcher and the worker: it imports none of them.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.amqp import task_message
from celery.utils.nodenames import anon_nodename
from celery.utils.saferepr import saferepr
from celery.utils.time import maybe_make_aware

from .compat import add_seconds_to_datetime, subtract_datetimes
from .stored_call import decode_options

#: Header that marks a published window and names where its record is: the shard's
#: whole tag (``<prefix>:{<tag>}``, :func:`shard_tag`, :func:`cluster_shard_tags`), so
#: a worker finds the record whatever its own ``debounce_shards``.
TAG_HEADER = "debounce_tag"

#: Header of 0.2 (still sent, for 0.2 workers during a rolling upgrade, and read from
#: messages without :data:`TAG_HEADER`): the window's shard *number*, which names the
#: record only for a reader with the writer's ``debounce_shards``.
SHARD_HEADER = "debounce_shard"

#: Header sent with ``debounce_redis_wait_replicas`` only: the window's ident, so that a
#: worker whose claim finds no record but the window still open under its id there
#: (the take was lost with a failover) skips the delivery (``claim.lua`` ARGV[6]).
IDENT_HEADER = "debounce_ident"

#: Header of a delivery a worker sent through the broker again because too few
#: replicas acknowledged its claim (``debounce_redis_wait_replicas``): how many times.
DEFERRED_HEADER = "debounce_deferred"

#: Header (in the stored options) of a ``debounce_exclusive`` window: ``take.lua`` finds
#: it in the options JSON (``"debounce_exclusive"``) and holds the window while a run of
#: its (task, key) is in progress (key :func:`run_key`).
EXCLUSIVE_HEADER = "debounce_exclusive"

#: The header that tells a debounced run how many calls its window absorbed
#: (``self.request.debounce_calls`` in the task; the calls the run stands for).
CALLS_HEADER = "debounce_calls"

#: Message header of a run whose body is a list of calls (a collect window, or one
#: call of a collect task published without a window): the worker knows the body's
#: shape even where the task is not ``debounce_collect`` (a rolling deploy).
COLLECT_HEADER = "debounce_collect"


def _window_headers(
    calls: int, shard: int | str, tag: str | None, ident: str | None
) -> dict[str, Any]:
    """The package's own headers of a window's message (see :meth:`WindowMessage.build`)."""
    headers: dict[str, Any] = {CALLS_HEADER: calls}
    if isinstance(shard, int):
        headers[SHARD_HEADER] = shard
    if tag is not None or isinstance(shard, str):
        headers[TAG_HEADER] = tag if tag is not None else shard
    if ident is not None:
        headers[IDENT_HEADER] = ident
    return headers


class WindowMessage:
    """What a dispatcher needs to publish windows of one app (built once per dispatcher)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.origin = anon_nodename()
        self.reply_to = app.thread_oid
        self.encodings: dict[str, str] = {}

    def content_encoding(self, content_type: str) -> str:
        enc = self.encodings.get(content_type)
        if enc is None:
            from kombu.serialization import registry

            name = registry.type_to_name.get(content_type)
            codec = registry._encoders.get(name) if name else None
            enc = (
                codec.content_encoding
                if codec is not None
                else (
                    "utf-8" if content_type.startswith(("application/json", "text/")) else "binary"
                )
            )
            self.encodings[content_type] = enc
        return enc

    def build(
        self,
        task_name: str,
        task_id: str,
        shard: int | str,
        calls: int,
        content_type: str,
        body: bytes,
        options_json: str,
        tag: str | None = None,
        arguments: tuple[list[Any], dict[str, Any]] | None = None,
        ident: str | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """``(task_message, send_task_message options)`` for one window; no deserializing.

        ``arguments``: the run's ``(args, kwargs)`` when the dispatcher parsed a JSON body
        (it checks their shape anyway): sent as ``argsrepr``/``kwargsrepr`` truncated as
        Celery truncates a plain call's (``app.amqp.argsrepr_maxsize``), so ``celery
        events`` and Flower show the arguments the run gets. Bodies of other content
        types are never deserialized here: their repr says ``<debounced: N calls>``.
        The calls absorbed go in the :data:`CALLS_HEADER` header either way.

        ``tag``: the shard's tag, sent as :data:`TAG_HEADER` (where the worker finds the
        record); ``shard`` (a number) is also sent as 0.2's :data:`SHARD_HEADER` for
        0.2 workers; a tag as ``shard`` (a layout drained, not this process's) is sent
        only as the tag. ``ident``: sent as :data:`IDENT_HEADER` (only with
        ``debounce_redis_wait_replicas``)."""
        opts = decode_options(options_json)
        pop = opts.pop
        expires = self._expires(opts)
        stamped = pop("stamped_headers", None)
        argsrepr, kwargsrepr = self._reprs(calls, arguments)
        headers = {
            "lang": "py",
            "task": task_name,
            "id": task_id,
            "shadow": pop("shadow", None),
            "eta": None,
            "expires": expires,
            "group": pop("group_id", None),
            "group_index": pop("group_index", None),
            "retries": 0,
            "timelimit": [pop("time_limit", None), pop("soft_time_limit", None)],
            "root_id": pop("root_id", None) or task_id,
            "parent_id": pop("parent_id", None),
            "argsrepr": argsrepr,
            "kwargsrepr": kwargsrepr,
            "origin": self.origin,
            "replaced_task_nesting": pop("replaced_task_nesting", 0),
            "stamped_headers": stamped,
            "stamps": pop("stamps", None) or {},
        }
        ignore = pop("ignore_result", None)
        if ignore is not None:  # absent: the worker's task decides (a header overrides it)
            headers["ignore_result"] = ignore
        extra = pop("headers", None)
        if extra:
            headers.update(extra)
        headers.update(_window_headers(calls, shard, tag, ident))
        properties = {
            "correlation_id": task_id,
            "reply_to": pop("reply_to", None) or self.reply_to,
            "content_type": content_type,
            "content_encoding": self.content_encoding(content_type),
        }
        opts["retry"] = False
        sent_event = None
        if self.app.conf.task_send_sent_event:  # as a plain apply_async would announce it
            sent_event = {
                "uuid": task_id,
                "root_id": headers["root_id"],
                "parent_id": headers["parent_id"],
                "name": task_name,
                "args": argsrepr,
                "kwargs": kwargsrepr,
                "retries": 0,
                "eta": None,
                "expires": expires,
            }
        return task_message(headers, properties, body, sent_event), opts

    def _expires(self, opts: dict[str, Any]) -> str | None:
        """The message's ``expires`` header from the stored ``expires`` (seconds from
        now) or ``expires_at`` (a time), both taken out of ``opts``, which gets the AMQP
        ``expiration`` (seconds left) in their place."""
        rel = opts.pop("expires", None)
        at = opts.pop("expires_at", None)
        if rel is not None:
            when = maybe_make_aware(
                add_seconds_to_datetime(self.app.now(), float(rel)), tz=self.app.timezone
            )
            opts["expiration"] = max(0.0, float(rel))
            return str(when.isoformat())
        if at is not None:
            from dateutil.parser import isoparse

            when = isoparse(at) if isinstance(at, str) else at
            left = subtract_datetimes(when, self.app.now()).total_seconds()
            opts["expiration"] = max(0.0, left)
            return str(when.isoformat())
        return None

    def _reprs(
        self, calls: int, arguments: tuple[list[Any], dict[str, Any]] | None
    ) -> tuple[str, str]:
        """``argsrepr`` and ``kwargsrepr``: the run's arguments truncated as Celery
        truncates a plain call's, or, for a body not parsed, the number of calls."""
        if arguments is not None:
            amqp = self.app.amqp
            levels = self.app.conf.get("task_repr_maxlevels") or 3
            argsrepr = saferepr(arguments[0], amqp.argsrepr_maxsize, maxlevels=levels)
            kwargsrepr = saferepr(arguments[1], amqp.kwargsrepr_maxsize, maxlevels=levels)
            return argsrepr, kwargsrepr
        return f"<debounced: {calls} call{'s' if calls != 1 else ''}>", "<debounced>"
