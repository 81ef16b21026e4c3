"""Optional Prometheus metrics (``pip install celery-debounced[prometheus]``).

Call :func:`enable` once in each process whose events you want counted
(producers for opened/absorbed, dispatchers for dispatched/forced/lateness, the
process that cancels for cancelled), then expose the registry as usual (e.g.
``prometheus_client.start_http_server``). Every metric has a ``task`` label.

Metrics (all labelled ``task``; see docs/operations.md):

* ``celery_debounce_windows_opened_total``: windows opened (producers)
* ``celery_debounce_calls_absorbed_total``: calls that joined an open window
* ``celery_debounce_windows_dispatched_total``: windows published
* ``celery_debounce_windows_forced_by_max_wait_total``: of those, deadline set by max wait
* ``celery_debounce_windows_cancelled_total``: windows cancelled
* ``celery_debounce_windows_closed_by_cap_total``: windows closed by ``debounce_max_calls``
  (dispatchers, when first taken)
* ``celery_debounce_leading_runs_total``: leading runs (``debounce_leading=True``;
  dispatchers, when first taken)
* ``celery_debounce_calls_suppressed_total``: calls a leading-only quiet period
  suppressed (producers)
* ``celery_debounce_duplicates_skipped_total``: duplicate deliveries of a finished or
  running window that a worker skipped (workers)
* ``celery_debounce_windows_held_total``, ``celery_debounce_held_seconds_total``:
  ``debounce_exclusive`` windows held behind a run of their key, and how long (dispatchers)
* ``celery_debounce_dispatched_calls_total``: calls carried by published windows
* ``celery_debounce_dispatch_lateness_seconds``: histogram, deadline to take
* ``celery_debounce_call_duration_seconds``: histogram, one call's round trip to the
  gate (``.delay()``/``apply_async``; producers)
* ``celery_debounce_call_errors_total{task,error}``: calls the gate could not take
  (``DebounceBackendError``, ``DebounceOutcomeUnknown``; producers)
* ``celery_debounce_outage_fallbacks_total{task,reason}``: calls published plainly
  because the windows' Redis could not take them (``debounce_on_outage="publish"``;
  ``reason``: unreachable, unknown, refused, breaker; producers)
* ``celery_debounce_calls_total{task,outcome}``: every call the gate took, by outcome
  (``opened``, ``absorbed``, ``suppressed``): "calls in" is one selector over it
* ``celery_debounce_publish_failures_total{task,kind}``: windows a dispatcher pass took
  but could not publish (``kind``: message, broker, uncertain, suspect, see
  signals.py; ``nack``: a message an AMQP broker refused)
* ``celery_debounce_windows_quarantined_total{task,kind}``: windows set aside (``kind``:
  message, publish_failed, record)
* ``celery_debounce_max_wait_violations_total``: runs that started later than their
  window's ceiling (first call + max wait) plus a tolerance (workers)

:func:`enable` is idempotent: called again with the same registry and namespace it
returns the same :class:`Metrics` (connected again if it was disabled), so a second
call never raises ``Duplicated timeseries``.

Prefork pool children and gunicorn workers count in their own memory: set
``PROMETHEUS_MULTIPROC_DIR`` (an empty directory, before anything imports
prometheus_client) and expose :func:`exposition_registry` (or call :func:`serve`),
which reads every process's values from that directory (docs/monitoring.md).

:func:`enable_store_gauges` adds gauges read from Redis at each scrape (open,
due, in-flight and quarantined windows, dispatchers' last batch): see
:class:`celery_debounce.ops.exporter.StoreCollector`. ``celery debounce exporter``
serves them from a process of their own, which does not die with the workers.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

from ..signals import (
    call_absorbed,
    call_failed,
    call_suppressed,
    duplicate_skipped,
    leading_run,
    max_wait_exceeded,
    outage_fallback,
    publish_failed,
    publish_refused,
    window_cancelled,
    window_closed_by_cap,
    window_dispatched,
    window_forced_by_max_wait,
    window_held,
    window_opened,
    window_quarantined,
)
from ..store.records import LATE_BUCKETS_MS

#: The signals :func:`enable` connects, in the order of ``Metrics.receivers``.
_SIGNALS = (
    window_opened,
    call_absorbed,
    window_dispatched,
    window_forced_by_max_wait,
    window_cancelled,
    window_closed_by_cap,
    leading_run,
    call_suppressed,
    call_failed,
    publish_failed,
    publish_refused,
    window_quarantined,
    duplicate_skipped,
    window_held,
    outage_fallback,
    max_wait_exceeded,
)

#: The histogram's bounds in seconds: the store's lateness buckets (records.LATE_BUCKETS_MS).
LATENESS_BUCKETS = tuple(ms / 1000 for ms in LATE_BUCKETS_MS)

#: Bounds (s) of the call-duration histogram: a loopback round trip is ~0.1-0.5 ms, a
#: call that times out takes debounce_redis_timeout (default 5 s).
CALL_DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

#: The environment variable of prometheus_client's multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True)
class Metrics:
    """The metric objects :func:`enable` registered."""

    opened: Any
    absorbed: Any
    dispatched: Any
    forced: Any
    cancelled: Any
    dispatched_calls: Any
    lateness: Any
    receivers: tuple[Any, ...]
    closed_by_cap: Any = None
    leading_runs: Any = None
    suppressed: Any = None
    call_duration: Any = None
    call_errors: Any = None
    publish_failures: Any = None
    quarantined: Any = None
    calls: Any = None
    duplicates_skipped: Any = None
    held: Any = None
    held_seconds: Any = None
    outage_fallbacks: Any = None
    max_wait_violations: Any = None

    def connect(self) -> None:
        """Connect the signal receivers (again, after :meth:`disable`)."""
        for signal, receiver in zip(_SIGNALS, self.receivers, strict=True):
            signal.connect(receiver, weak=False)

    def disable(self) -> None:
        """Disconnect the signal receivers (the metrics stay registered)."""
        for signal, receiver in zip(_SIGNALS, self.receivers, strict=True):
            signal.disconnect(receiver)


#: registry -> namespace -> what enable() registered there (enable() is idempotent)
_ENABLED: weakref.WeakKeyDictionary[Any, dict[str, Metrics]] = weakref.WeakKeyDictionary()


#: The counters enable() registers: (Metrics field, name, help, labels after ``task``).
_COUNTERS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("opened", "windows_opened", "Debounce windows opened by producers.", ()),
    ("absorbed", "calls_absorbed", "Calls that joined an already open window.", ()),
    ("dispatched", "windows_dispatched", "Debounce windows published to the broker.", ()),
    (
        "forced",
        "windows_forced_by_max_wait",
        "Published windows whose deadline was set by the max wait.",
        (),
    ),
    ("cancelled", "windows_cancelled", "Debounce windows cancelled by an operator.", ()),
    (
        "closed_by_cap",
        "windows_closed_by_cap",
        "Debounce windows closed by their call cap (debounce_max_calls).",
        (),
    ),
    (
        "leading_runs",
        "leading_runs",
        "Leading runs (debounce_leading=True), published at their first call.",
        (),
    ),
    (
        "suppressed",
        "calls_suppressed",
        "Calls suppressed by the quiet period after a leading run "
        "(debounce_leading=True, debounce_trailing=False).",
        (),
    ),
    (
        "duplicates_skipped",
        "duplicates_skipped",
        "Duplicate deliveries of a finished or running window, skipped before the task's code.",
        (),
    ),
    ("held", "windows_held", "debounce_exclusive windows held behind a run of their key.", ()),
    (
        "held_seconds",
        "held_seconds",
        "Seconds debounce_exclusive windows were held behind a run.",
        (),
    ),
    ("dispatched_calls", "dispatched_calls", "Calls carried by published windows.", ()),
    (
        "call_errors",
        "call_errors",
        "Calls the gate could not take (Redis errors), by exception class.",
        ("error",),
    ),
    (
        "publish_failures",
        "publish_failures",
        "Windows a dispatcher took but could not "
        "publish, by kind (message, broker, uncertain, suspect, nack).",
        ("kind",),
    ),
    (
        "calls",
        "calls",
        "Calls the gate took, by outcome (opened, absorbed, suppressed).",
        ("outcome",),
    ),
    (
        "outage_fallbacks",
        "outage_fallbacks",
        "Calls published plainly because the "
        "windows' Redis could not take them (debounce_on_outage="
        "'publish'), by reason (unreachable, unknown, refused, "
        "breaker).",
        ("reason",),
    ),
    (
        "quarantined",
        "windows_quarantined",
        "Windows set aside, by kind (message, publish_failed, record).",
        ("kind",),
    ),
    (
        "max_wait_violations",
        "max_wait_violations",
        "Runs that started later than their "
        "window's ceiling (first call + max wait) plus a tolerance.",
        (),
    ),
)


#: The histograms enable() registers, labelled ``task``: (Metrics field, name, help,
#: bucket bounds in seconds).
_HISTOGRAMS: tuple[tuple[str, str, str, tuple[float, ...]], ...] = (
    (
        "lateness",
        "dispatch_lateness_seconds",
        "Time from a window's deadline to its take by a dispatcher.",
        LATENESS_BUCKETS,
    ),
    (
        "call_duration",
        "call_duration_seconds",
        "One call's round trip to the gate (.delay()/apply_async), failed calls included.",
        CALL_DURATION_BUCKETS,
    ),
)


def enable(registry: Any = None, namespace: str = "celery_debounce") -> Metrics:
    """Create the metrics in ``registry`` (default: prometheus_client's global one)
    and connect them to the debounce signals.

    Idempotent: a second call with the same registry and namespace connects the
    same metrics (if :meth:`Metrics.disable` disconnected them) and returns them."""
    try:
        from prometheus_client import REGISTRY, Counter, Histogram
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError(
            "celery_debounce.ops.metrics needs prometheus-client: "
            "pip install 'celery-debounced[prometheus]'"
        ) from exc
    registry = REGISTRY if registry is None else registry
    done = _ENABLED.setdefault(registry, {})
    if namespace in done:
        done[namespace].connect()
        return done[namespace]
    made: dict[str, Any] = {
        field: Counter(name, doc, ["task", *labels], namespace=namespace, registry=registry)
        for field, name, doc, labels in _COUNTERS
    }
    for field, name, doc, buckets in _HISTOGRAMS:
        made[field] = Histogram(
            name, doc, ["task"], namespace=namespace, registry=registry, buckets=buckets
        )
    enabled = Metrics(receivers=_receivers(made), **made)
    enabled.connect()
    done[namespace] = enabled
    return enabled


def _receivers(m: dict[str, Any]) -> tuple[Any, ...]:
    """The signal receivers that count in the metrics ``m``, in :data:`_SIGNALS`' order."""
    #: (task, outcome) -> the labelled children a producer's call bumps: looked up
    #: once per task, so a call pays two increments and one observation
    producer_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

    def on_call(sender: str, outcome: str, own: Any, latency: float | None) -> None:
        children = producer_children.get((sender, outcome))
        if children is None:
            children = producer_children[(sender, outcome)] = (
                own.labels(task=sender),
                m["calls"].labels(task=sender, outcome=outcome),
                m["call_duration"].labels(task=sender),
            )
        children[0].inc()
        children[1].inc()
        if latency is not None:
            children[2].observe(latency)

    def on_opened(sender: str, latency: float | None = None, **_: Any) -> None:
        on_call(sender, "opened", m["opened"], latency)

    def on_absorbed(sender: str, latency: float | None = None, **_: Any) -> None:
        on_call(sender, "absorbed", m["absorbed"], latency)

    def on_dispatched(sender: str, calls: int = 1, lateness: float = 0.0, **_: Any) -> None:
        m["dispatched"].labels(task=sender).inc()
        m["dispatched_calls"].labels(task=sender).inc(calls)
        m["lateness"].labels(task=sender).observe(lateness)

    def on_suppressed(sender: str, latency: float | None = None, **_: Any) -> None:
        on_call(sender, "suppressed", m["suppressed"], latency)

    def on_call_failed(
        sender: str, error: str = "DebounceBackendError", latency: float | None = None, **_: Any
    ) -> None:
        m["call_errors"].labels(task=sender, error=error).inc()
        if latency is not None:
            m["call_duration"].labels(task=sender).observe(latency)

    def on_held(sender: str, held: float = 0.0, **_: Any) -> None:
        m["held"].labels(task=sender).inc()
        m["held_seconds"].labels(task=sender).inc(held)

    def counts(field: str, **fixed: str) -> Any:
        """A receiver that adds one to ``field`` (labels: the task, ``fixed``)."""

        def on_signal(sender: str, **_: Any) -> None:
            m[field].labels(task=sender, **fixed).inc()

        return on_signal

    def by(field: str, label: str, default: str) -> Any:
        """A receiver that adds one to ``field`` under the signal's ``label``."""

        def on_signal(sender: str, **kwargs: Any) -> None:
            m[field].labels(task=sender, **{label: kwargs.get(label, default)}).inc()

        return on_signal

    return (
        on_opened,
        on_absorbed,
        on_dispatched,
        counts("forced"),
        counts("cancelled"),
        counts("closed_by_cap"),
        counts("leading_runs"),
        on_suppressed,
        on_call_failed,
        by("publish_failures", "kind", "message"),
        counts("publish_failures", kind="nack"),
        by("quarantined", "kind", "message"),
        counts("duplicates_skipped"),
        on_held,
        by("outage_fallbacks", "reason", "unreachable"),
        counts("max_wait_violations"),
    )


def multiprocess_dir() -> str | None:
    """The multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``), or None."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


def exposition_registry() -> Any:
    """The registry to expose: prometheus_client's global one, or, in multiprocess
    mode (``PROMETHEUS_MULTIPROC_DIR`` set), a registry that reads the values every
    process of the host wrote there (prefork children, gunicorn workers, this one)."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    path = multiprocess_dir()
    if path is None:
        return REGISTRY
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call, unused-ignore]
    return registry


def serve(port: int, addr: str = "0.0.0.0") -> Any:  # noqa: S104 (as prometheus_client)
    """``prometheus_client.start_http_server`` on :func:`exposition_registry`; call it
    in one process per host (a worker's main process, gunicorn's master or a sidecar).
    Returns the server."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=addr, registry=exposition_registry())
    return server


def enable_store_gauges(app: Any, registry: Any = None, namespace: str = "celery_debounce") -> Any:
    """Register gauges read from the app's debounce Redis at each scrape (a few
    O(1)/O(log N) commands per shard, no scan); returns the collector. Prefer
    ``celery debounce exporter``, which keeps exporting them when every worker is
    dead (docs/monitoring.md)."""
    from prometheus_client import REGISTRY

    from .exporter import StoreCollector

    collector = StoreCollector(app, namespace)
    (REGISTRY if registry is None else registry).register(collector)
    return collector
