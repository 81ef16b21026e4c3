"""celery_debounce.compat: each helper matches the installed Celery's own behaviour.

These tests run on whatever Celery/kombu is installed (the CI corners run them on
5.3, 5.5 and 5.7).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import celery.utils.time as celery_time
import pytest
from helpers import make_app

from celery_debounce import compat

HAS_57_HELPERS = hasattr(celery_time, "add_seconds_to_datetime")


def test_the_package_imports_without_celery_57_time_helpers() -> None:
    """Celery 5.3-5.6 lack add_seconds_to_datetime/subtract_datetimes (an ImportError
    on ``import celery_debounce`` before the compat module)."""
    code = textwrap.dedent("""
        import celery.app.amqp, celery.app.base, celery.schedules  # they import them on 5.7
        import celery.utils.time as t
        for name in ("add_seconds_to_datetime", "subtract_datetimes"):
            if hasattr(t, name):
                delattr(t, name)
        import celery_debounce, celery_debounce.producer.message, celery_debounce.ops.cli
        import celery_debounce.headers
        from celery_debounce import compat
        from datetime import datetime, timedelta, timezone
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        assert compat.add_seconds_to_datetime(now, 5) == now + timedelta(seconds=5)
        assert compat.subtract_datetimes(now + timedelta(seconds=5), now) == timedelta(seconds=5)
        print("ok")
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_helpers_are_celerys_own_where_it_has_them() -> None:
    if not HAS_57_HELPERS:
        pytest.skip("this Celery has no add_seconds_to_datetime (5.3-5.6): the backfill runs")
    assert compat.add_seconds_to_datetime is celery_time.add_seconds_to_datetime
    assert compat.subtract_datetimes is celery_time.subtract_datetimes


@pytest.mark.parametrize("tz", [timezone.utc, ZoneInfo("Europe/Paris"), ZoneInfo("Asia/Kolkata")])
@pytest.mark.parametrize("seconds", [0, 1.5, 30, 3600, -2, 86400 * 3])
def test_add_seconds_matches_celery_outside_dst_changes(tz: timezone, seconds: float) -> None:
    """Where no DST change lies between, every Celery adds seconds the same way:
    5.3-5.6 as ``now + timedelta(seconds=...)``, 5.7 with add_seconds_to_datetime."""
    now = datetime(2026, 6, 10, 12, 0, 0, 123456, tzinfo=tz)
    got = compat.add_seconds_to_datetime(now, seconds)
    assert got == now + timedelta(seconds=seconds)
    assert got.isoformat() == (now + timedelta(seconds=seconds)).isoformat()
    assert got.tzinfo is now.tzinfo
    naive = now.replace(tzinfo=None)
    assert compat.add_seconds_to_datetime(naive, seconds) == naive + timedelta(seconds=seconds)


def test_add_seconds_counts_elapsed_time_across_a_dst_change() -> None:
    """Across a DST change the helper counts elapsed seconds, as Celery 5.7 does (5.3-5.6's
    plain ``+`` adds wall-clock time there: the documented difference, docs/deployment.md)."""
    paris = ZoneInfo("Europe/Paris")
    before = datetime(2026, 3, 29, 1, 30, tzinfo=paris)  # 02:00 -> 03:00 that night
    after = compat.add_seconds_to_datetime(before, 3600)
    assert after.isoformat() == "2026-03-29T03:30:00+02:00"
    assert compat.subtract_datetimes(after, before) == timedelta(hours=1)


@pytest.mark.parametrize(
    ("end", "start", "delta"),
    [
        (
            datetime(2026, 1, 1, 0, 0, 10, tzinfo=timezone.utc),
            datetime(2026, 1, 1, tzinfo=timezone.utc),
            timedelta(seconds=10),
        ),
        (
            datetime(2026, 1, 1, 1, 0, 0, tzinfo=ZoneInfo("Europe/Paris")),
            datetime(2026, 1, 1, tzinfo=timezone.utc),
            timedelta(0),
        ),
        (
            datetime(2026, 1, 1, 0, 0, 5),  # naive counts as UTC
            datetime(2026, 1, 1, tzinfo=timezone.utc),
            timedelta(seconds=5),
        ),
        (
            datetime(2026, 1, 1, tzinfo=timezone.utc),
            datetime(2026, 1, 1, 0, 1, tzinfo=timezone.utc),
            timedelta(seconds=-60),
        ),
    ],
)
def test_subtract_datetimes(end: datetime, start: datetime, delta: timedelta) -> None:
    assert compat.subtract_datetimes(end, start) == delta
    if end.tzinfo is not None:  # Celery 5.3-5.6: `(expires - now).total_seconds()`
        assert compat.subtract_datetimes(end, start) == end - start


# -- what the package borrows from Celery/kombu, checked on the installed version -----
# Each test names the module that relies on it. They pass on 5.3.6, 5.4.0, 5.5.3,
# 5.6.3 and 5.7.0 (docs/deployment.md, "Versions"); a new Celery that changes one
# fails here, not in a worker.


#: The apps here reach no server (an in-memory broker): messages are built, never sent.
NOWHERE = "redis://unused"


def test_task_message_fields() -> None:
    """headers.WindowMessage.build returns ``task_message(headers, properties, body, None)``."""
    from celery.app.amqp import task_message

    assert task_message._fields == ("headers", "properties", "body", "sent_event")


def _window_and_celery_headers(
    options: dict[str, Any],
    now: datetime,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Headers and properties of a window built from ``options`` and of
    ``app.amqp.as_task_v2`` given the same options, both at ``now``."""
    from celery_debounce.headers import SHARD_HEADER, WindowMessage
    from celery_debounce.producer.message import call_options, encode_stored

    app = make_app(NOWHERE, "compat", broker_url="memory://")
    app.now = lambda: now  # type: ignore[method-assign]
    _, stored = call_options(app, "compat.task", None, (), {}, dict(options))
    wm = WindowMessage(app)
    message, publish = wm.build(
        "compat.task",
        "tid-1",
        3,
        2,
        "application/json",
        b"[[], {}, {}]",
        encode_stored(stored),
    )
    stamped = options.get("stamped_headers")
    theirs = app.amqp.as_task_v2(
        "tid-1",
        "compat.task",
        (),
        {},
        expires=options.get("expires"),
        group_id=options.get("group_id"),
        group_index=options.get("group_index"),
        time_limit=options.get("time_limit"),
        soft_time_limit=options.get("soft_time_limit"),
        root_id=options.get("root_id"),
        parent_id=options.get("parent_id"),
        shadow=options.get("shadow"),
        replaced_task_nesting=options.get("replaced_task_nesting", 0),
        stamped_headers=stamped,
        origin=wm.origin,
        now=now,
        timezone=app.timezone,
        argsrepr="<debounced: 2 calls>",
        kwargsrepr="<debounced>",
        reply_to=options.get("reply_to") or app.thread_oid,
        **{h: options[h] for h in stamped or ()},
    )
    ours = dict(message.headers)
    assert ours.pop(SHARD_HEADER) == 3
    assert ours.pop("debounce_calls") == 2
    return ours, dict(theirs.headers), dict(message.properties), publish


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"expires": 30},
        {"expires": 2.5, "shadow": "alias", "time_limit": 10, "soft_time_limit": 5},
        {"expires": "2026-06-10T12:05:00+00:00", "group_id": "g", "group_index": 1},
        {"root_id": "r", "parent_id": "p", "replaced_task_nesting": 2, "reply_to": "me"},
        {"stamped_headers": ["color"], "color": "blue"},
    ],
)
def test_window_headers_are_as_task_v2s(options: dict[str, Any]) -> None:
    """The dispatcher builds a window's headers by hand (around a body it never
    deserializes); they are the headers ``app.amqp.as_task_v2`` builds on this Celery,
    but for ``ignore_result``, which is left out unless the call set it (so the
    worker's task decides), and the shard header."""
    now = datetime(2026, 6, 10, 12, 0, 0, 250000, tzinfo=timezone.utc)
    ours, theirs, properties, publish = _window_and_celery_headers(options, now)
    assert "ignore_result" not in ours
    theirs.pop("ignore_result")
    assert ours == theirs
    assert list(ours) == list(theirs)  # same order: the same bytes on the wire
    assert properties["correlation_id"] == "tid-1"
    if isinstance(options.get("expires"), (int, float)):
        assert publish["expiration"] == float(options["expires"])


def test_window_ignore_result_header_when_the_call_sets_it() -> None:
    now = datetime(2026, 6, 10, 12, 0, tzinfo=timezone.utc)
    ours, _, _, _ = _window_and_celery_headers({"ignore_result": True}, now)
    assert ours["ignore_result"] is True


def test_task_exec_options() -> None:
    """task.exec_defaults: ``Task._get_exec_options()``, a mapping of option -> value."""
    app = make_app(NOWHERE, "compat", broker_url="memory://")

    @app.task(shared=False, time_limit=3, soft_time_limit=2)
    def work() -> None: ...

    got = work._get_exec_options()
    assert got["time_limit"] == 3 and got["soft_time_limit"] == 2
    assert {"queue", "routing_key", "exchange", "priority", "serializer"} <= set(got)
    assert hasattr(work, "typing")  # task.check_arguments


def test_kombu_serialization_registry() -> None:
    """call.encode and WindowMessage.content_encoding read kombu's registry directly."""
    from kombu.serialization import registry

    assert registry.type_to_name["application/json"] == "json"
    codec = registry._encoders["json"]
    assert codec.content_type == "application/json"
    assert codec.content_encoding == "utf-8"
    assert callable(codec.encoder)
    assert hasattr(codec, "_replace")


def test_kombu_compression_and_delivery_mode() -> None:
    """message.call_options checks compression= and delivery_mode= as kombu would."""
    from kombu import compression
    from kombu.entity import maybe_delivery_mode

    compression.get_encoder("zlib")
    with pytest.raises(KeyError):
        compression.get_encoder("no-such-codec")
    assert maybe_delivery_mode("persistent") == 2
    assert maybe_delivery_mode(1) == 1


def test_kombu_connection_ensure_takes_the_retry_policy_keys() -> None:
    """message._ensure_parameters: the keys a retry policy may hold, read from
    ``Connection.ensure``; Celery's own default policy must pass."""
    from celery_debounce.producer.message import _ensure_parameters

    app = make_app(NOWHERE, "compat", broker_url="memory://")
    assert set(app.conf.task_publish_retry_policy) <= _ensure_parameters()


def test_send_task_message_takes_what_the_dispatcher_passes() -> None:
    """MessageSender.send: ``app.amqp.send_task_message(producer, name, message, **opts)``
    with the stored options; an unknown keyword would become a message property."""
    import inspect

    app = make_app(NOWHERE, "compat", broker_url="memory://")
    params = inspect.signature(app.amqp.send_task_message).parameters
    for name in (
        "producer",
        "name",
        "message",
        "exchange",
        "routing_key",
        "queue",
        "retry",
        "retry_policy",
        "declare",
        "headers",
    ):
        assert name in params, name


def test_router_route_signature() -> None:
    """message._route: ``router.route(options, name, args, kwargs, task_type)``."""
    app = make_app(NOWHERE, "compat", broker_url="memory://")
    app.conf.task_routes = {"compat.*": {"queue": "elsewhere"}}
    routed = app.amqp.router.route({}, "compat.task", (), {}, None)
    assert routed["queue"].name == "elsewhere"
    from celery.app.routes import MapRoute

    assert all(isinstance(r, MapRoute) for r in app.amqp.routes)  # call.static_routing


def test_app_attributes_the_package_reads() -> None:
    app = make_app(NOWHERE, "compat", broker_url="memory://")
    assert isinstance(app.thread_oid, str)  # WindowMessage.reply_to
    assert app.current_worker_task is None  # message.call_options (parent ids)
    assert callable(app.producer_or_acquire) and callable(app.connection_for_write)
    assert callable(app.amqp.Producer)  # confirms.ConfirmingPublisher
    assert isinstance(app.steps["worker"], set)  # bootstep.install: .add(DispatcherStep)


def test_signal_with_providing_args() -> None:
    """signals.py builds its signals with ``Signal(name=..., providing_args=...)``."""
    import warnings

    from celery.utils.dispatch import Signal

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sig = Signal(name="probe", providing_args={"task_id"})
    got: list[Any] = []
    sig.connect(lambda sender, **kw: got.append(kw), weak=False)
    sig.send(sender=None, task_id="x")
    assert got == [{"signal": sig, "task_id": "x"}]


def test_celery_option_takes_a_help_group() -> None:
    """cli.py and top.py declare options with ``cls=CeleryOption, help_group=...``."""
    import click
    from celery.bin.base import CeleryCommand, CeleryOption

    @click.command(cls=CeleryCommand)
    @click.option("--x", cls=CeleryOption, help_group="G", help="x")
    def cmd(x: Any) -> None: ...

    assert cmd.params[0].help_group == "G"


def test_context_and_backend_marks_take_a_request() -> None:
    """aliases.resolve_aliases: ``Context(...)`` and ``backend.mark_as_*(..., request=)``."""
    import inspect

    from celery.app.task import Context
    from celery.backends.base import Backend

    ctx = Context(id="a", task="t", group=None, chord=None, ignore_result=False)
    assert ctx.id == "a" and ctx.task == "t"
    assert "request" in inspect.signature(Backend.mark_as_done).parameters
    assert "call_errbacks" in inspect.signature(Backend.mark_as_failure).parameters
    assert "request" in inspect.signature(Backend.mark_as_revoked).parameters


def test_worker_signals_the_package_connects_to() -> None:
    """worker/receivers.py: the consumer sends task_unknown/task_rejected with
    ``message`` (and ``name``/``id`` for unknown); task_revoked with ``request``."""
    import inspect

    import celery.worker.consumer.consumer as consumer
    import celery.worker.request as request

    source = inspect.getsource(consumer)
    assert "signals.task_rejected.send(sender=self, message=message" in source
    assert "signals.task_unknown.send(" in source
    unknown = source[source.index("signals.task_unknown.send(") :][:200]
    for arg in ("message=", "name=", "id="):
        assert arg in unknown, arg
    assert "send_revoked(self.task, request=self._context" in inspect.getsource(request)


def test_persistent_scheduler_tick_returns_seconds() -> None:
    """beat.DebounceSchedulerMixin.tick wraps ``PersistentScheduler.tick`` (a number)."""
    import inspect

    from celery.beat import PersistentScheduler, Scheduler

    assert PersistentScheduler.tick is Scheduler.tick
    params = inspect.signature(Scheduler.tick).parameters
    assert list(params)[:2] == ["self", "event_t"]


def test_what_the_dispatcher_process_borrows() -> None:
    """dispatch/process.py forks as Celery's embedded beat does, with its helpers."""
    from billiard.common import reset_signals
    from billiard.context import Process
    from celery.platforms import close_open_fds
    from celery.utils.log import iter_open_logger_fds

    assert callable(reset_signals) and callable(close_open_fds)
    assert all(hasattr(Process, name) for name in ("start", "terminate", "join", "exitcode", "pid"))
    assert isinstance(list(iter_open_logger_fds()), list)
