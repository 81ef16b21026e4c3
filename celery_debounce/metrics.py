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

:func:`enable_store_gauges` adds gauges read from Redis at each scrape (open,
due, in-flight and quarantined windows, dispatchers' last batch): see
:class:`celery_debounce.top.StoreCollector`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layout import LATE_BUCKETS_MS
from .signals import (
    call_absorbed,
    call_suppressed,
    duplicate_skipped,
    leading_run,
    window_cancelled,
    window_closed_by_cap,
    window_dispatched,
    window_forced_by_max_wait,
    window_held,
    window_opened,
)

#: The signals :func:`enable` connects, in the order of ``Metrics.receivers``.
_SIGNALS = (window_opened, call_absorbed, window_dispatched, window_forced_by_max_wait,
            window_cancelled, window_closed_by_cap, leading_run, call_suppressed,
            duplicate_skipped, window_held)

#: The histogram's bounds in seconds: the store's lateness buckets (layout.LATE_BUCKETS_MS).
LATENESS_BUCKETS = tuple(ms / 1000 for ms in LATE_BUCKETS_MS)


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
    duplicates_skipped: Any = None
    held: Any = None
    held_seconds: Any = None

    def disable(self) -> None:
        """Disconnect the signal receivers (the metrics stay registered)."""
        for signal, receiver in zip(_SIGNALS, self.receivers, strict=True):
            signal.disconnect(receiver)


def enable(registry: Any = None, namespace: str = "celery_debounce") -> Metrics:
    """Create the metrics in ``registry`` (default: prometheus_client's global one)
    and connect them to the debounce signals."""
    try:
        from prometheus_client import REGISTRY, Counter, Histogram
    except ImportError as exc:  # pragma: no cover - depends on the extra
        raise ImportError(
            "celery_debounce.metrics needs prometheus-client: "
            "pip install 'celery-debounced[prometheus]'") from exc
    registry = REGISTRY if registry is None else registry

    def counter(name: str, doc: str) -> Any:
        return Counter(name, doc, ["task"], namespace=namespace, registry=registry)

    opened = counter("windows_opened", "Debounce windows opened by producers.")
    absorbed = counter("calls_absorbed", "Calls that joined an already open window.")
    dispatched = counter("windows_dispatched", "Debounce windows published to the broker.")
    forced = counter("windows_forced_by_max_wait",
                     "Published windows whose deadline was set by the max wait.")
    cancelled = counter("windows_cancelled", "Debounce windows cancelled by an operator.")
    closed_by_cap = counter("windows_closed_by_cap",
                            "Debounce windows closed by their call cap (debounce_max_calls).")
    leading_runs = counter("leading_runs",
                           "Leading runs (debounce_leading=True), published at their first call.")
    suppressed = counter("calls_suppressed",
                         "Calls suppressed by the quiet period after a leading run "
                         "(debounce_leading=True, debounce_trailing=False).")
    duplicates = counter("duplicates_skipped",
                         "Duplicate deliveries of a finished or running window, skipped "
                         "before the task's code.")
    held = counter("windows_held", "debounce_exclusive windows held behind a run of their key.")
    held_seconds = counter("held_seconds",
                           "Seconds debounce_exclusive windows were held behind a run.")
    dispatched_calls = counter("dispatched_calls", "Calls carried by published windows.")
    lateness = Histogram("dispatch_lateness_seconds",
                         "Time from a window's deadline to its take by a dispatcher.",
                         ["task"], namespace=namespace, registry=registry,
                         buckets=LATENESS_BUCKETS)

    def on_opened(sender: str, **_: Any) -> None:
        opened.labels(task=sender).inc()

    def on_absorbed(sender: str, **_: Any) -> None:
        absorbed.labels(task=sender).inc()

    def on_dispatched(sender: str, calls: int = 1, lateness: float = 0.0, **_: Any) -> None:
        dispatched.labels(task=sender).inc()
        dispatched_calls.labels(task=sender).inc(calls)
        lateness_metric.labels(task=sender).observe(lateness)

    def on_forced(sender: str, **_: Any) -> None:
        forced.labels(task=sender).inc()

    def on_cancelled(sender: str, **_: Any) -> None:
        cancelled.labels(task=sender).inc()

    def on_closed_by_cap(sender: str, **_: Any) -> None:
        closed_by_cap.labels(task=sender).inc()

    def on_leading(sender: str, **_: Any) -> None:
        leading_runs.labels(task=sender).inc()

    def on_suppressed(sender: str, **_: Any) -> None:
        suppressed.labels(task=sender).inc()

    def on_duplicate(sender: str, **_: Any) -> None:
        duplicates.labels(task=sender).inc()

    def on_held(sender: str, held: float = 0.0, **_: Any) -> None:
        held_metric.labels(task=sender).inc()
        held_seconds.labels(task=sender).inc(held)

    held_metric = held
    lateness_metric = lateness
    receivers = (on_opened, on_absorbed, on_dispatched, on_forced, on_cancelled,
                 on_closed_by_cap, on_leading, on_suppressed, on_duplicate, on_held)
    for signal, receiver in zip(_SIGNALS, receivers, strict=True):
        signal.connect(receiver, weak=False)
    return Metrics(opened, absorbed, dispatched, forced, cancelled, dispatched_calls, lateness,
                   receivers, closed_by_cap, leading_runs, suppressed, duplicates, held,
                   held_seconds)


def enable_store_gauges(app: Any, registry: Any = None, namespace: str = "celery_debounce") -> Any:
    """Register gauges read from the app's debounce Redis at each scrape (a few
    O(1)/O(log N) commands per shard, no scan); returns the collector."""
    from prometheus_client import REGISTRY

    from .top import StoreCollector

    collector = StoreCollector(app, namespace)
    (REGISTRY if registry is None else registry).register(collector)
    return collector
