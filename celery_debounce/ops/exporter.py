"""``celery -A proj debounce exporter``: the store gauges, from a process that does not
die with the workers.

The gauges that say whether debouncing works (open and due windows, how long the most
overdue one waited, in-flight and quarantined windows, which dispatcher last took a
batch and how long ago) describe Redis, not a worker. Exported from a worker, they
vanish with it, and the alert meant for "no dispatcher runs" sees nothing. This
process reads them from Redis at each scrape and nothing else: no broker, no task
code, no dispatcher.

Cost per scrape: one :func:`celery_debounce.ops.admin.read_snapshot` (``TIME`` and one
store snapshot per shard, as a ``top`` refresh), never a scan; scrapes closer together
than ``min_interval`` (and concurrent scrapes) share one reading, so any number of
Prometheus servers cost at most one reading per ``min_interval``. A reading that fails
(Redis down, within ``debounce_redis_timeout``) exports ``celery_debounce_store_up 0``
and no made-up value.

Its own health: Prometheus's ``up`` for its job, plus
``celery_debounce_exporter_reads_total``, ``..._read_errors_total`` and
``..._read_duration_seconds``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..errors import DebounceError
from ..store import store_for
from .admin import Snapshot, read_snapshot

logger = logging.getLogger("celery_debounce.exporter")

#: Default port (next to the worker's conventional 9808 in docs/monitoring.md).
DEFAULT_PORT = 9809
#: Scrapes within this many seconds of a reading reuse it.
DEFAULT_MIN_INTERVAL = 1.0
#: How to install what the exporter needs (the package's ``prometheus`` extra).
INSTALL = "pip install 'celery-debounced[prometheus]'"

#: Listen on every interface by default, as prometheus_client does: Prometheus scrapes
#: from another host.
ALL_INTERFACES = "0.0.0.0"  # noqa: S104


class StoreCollector:
    """Prometheus gauges read from the debounce Redis at each scrape (one
    :func:`read_snapshot`): open, due and in-flight windows, the most overdue
    window's age, quarantined windows, the dispatchers seen and each one's last
    batch, the store's own counters, and ``store_up`` (0 when Redis cannot be read).

    ``min_interval``: seconds a reading is reused (0: every collect reads). Every
    process exporting it exports the same store-wide values: aggregate with ``max``.
    """

    def __init__(
        self, app: Any, namespace: str = "celery_debounce", min_interval: float = 0.0
    ) -> None:
        self.app = app
        self.namespace = namespace
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._last: Snapshot | None = None
        self.reads = 0
        self.read_errors = 0
        self.read_duration = 0.0

    # -- reading ----------------------------------------------------------------------
    def snapshot(self) -> Snapshot | None:
        """A reading no older than ``min_interval`` (None: Redis could not be read)."""
        with self._lock:  # concurrent scrapes wait for one reading
            if time.monotonic() - self._read_at < self.min_interval:
                return self._last
            start = time.monotonic()
            try:
                self._last = read_snapshot(store_for(self.app))
            except DebounceError as exc:
                self.read_errors += 1
                self._last = None
                logger.warning("debounce exporter: cannot read the store: %s", exc)
            except Exception:  # a bug or an odd reply: say store_up 0, keep serving
                self.read_errors += 1
                self._last = None
                logger.exception("debounce exporter: reading the store failed")
            self.reads += 1
            self.read_duration = time.monotonic() - start
            self._read_at = time.monotonic()
            return self._last

    # -- families ---------------------------------------------------------------------
    def _families(self, snap: Snapshot | None, up: float | None) -> list[Any]:
        from prometheus_client.core import GaugeMetricFamily

        ns = self.namespace

        def gauge(name: str, doc: str, value: float | None) -> Any:
            family = GaugeMetricFamily(f"{ns}_{name}", doc)
            if value is not None:
                family.add_metric([], value)
            return family

        labelled, since = self._labelled(snap)

        def value(get: Any) -> float | None:
            return float(get(snap)) if snap is not None else None

        return [
            gauge("store_up", "1 when the debounce Redis answered this scrape.", up),
            gauge("open_windows", "Pending windows.", value(lambda s: s.open)),
            gauge("due_windows", "Pending windows whose deadline passed.", value(lambda s: s.due)),
            gauge(
                "oldest_due_age_seconds",
                "How long the most overdue pending window has been due (0: none due).",
                value(lambda s: s.oldest_due_s or 0.0),
            ),
            gauge(
                "inflight_windows",
                "Windows taken and not finished.",
                value(lambda s: s.leased + s.active),
            ),
            gauge("quarantined_windows", "Windows set aside.", value(lambda s: s.quarantined)),
            gauge(
                "held_windows",
                "debounce_exclusive windows held behind a run of their key.",
                value(lambda s: s.held),
            ),
            gauge(
                "oldest_held_age_seconds",
                "How long the longest held window has been held (0: none held).",
                value(
                    lambda s: max(0.0, s.at - s.held_windows[0].since) if s.held_windows else 0.0
                ),
            ),
            gauge(
                "dispatchers_seen",
                "Dispatchers that took windows within debounce_history_ttl.",
                value(lambda s: len(s.dispatchers)),
            ),
            gauge(
                "seconds_since_last_batch",
                "Seconds since any dispatcher last took "
                "windows (Redis clock; absent when none is recorded).",
                since,
            ),
            *labelled,
        ]

    def _labelled(self, snap: Snapshot | None) -> tuple[list[Any], float | None]:
        """The families labelled by dispatcher or by task, and the seconds since any
        dispatcher last took windows (None: none recorded, or no snapshot)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        ns = self.namespace

        def per(name: str, doc: str, label: str, kind: Any = GaugeMetricFamily) -> Any:
            return kind(f"{ns}_{name}", doc, labels=[label])

        dispatchers = per(
            "dispatcher_last_batch_timestamp_seconds",
            "When each dispatcher last took windows (Redis clock); kept for debounce_history_ttl.",
            "dispatcher",
        )
        ages = per(
            "dispatcher_last_batch_age_seconds",
            "Seconds since each dispatcher last took windows (Redis clock).",
            "dispatcher",
        )
        runs = per(
            "store_runs",
            "Windows taken for a run, counted in Redis (<tag>:stats; `stats --reset` zeroes it).",
            "task",
            CounterMetricFamily,
        )
        calls = per(
            "store_calls",
            "Calls carried by the windows taken, counted in Redis.",
            "task",
            CounterMetricFamily,
        )
        since: float | None = None
        if snap is not None:
            for name, at in sorted(snap.dispatchers.items()):
                dispatchers.add_metric([name], at)
                ages.add_metric([name], max(0.0, snap.at - at))
            if snap.dispatchers:
                since = max(0.0, snap.at - max(snap.dispatchers.values()))
            for task, row in sorted(snap.tasks.items()):
                runs.add_metric([task], row.runs)
                calls.add_metric([task], row.calls)
        return [dispatchers, ages, runs, calls], since

    def describe(self) -> list[Any]:
        """The metric names, without reading Redis (called at registration)."""
        return self._families(None, None)

    def collect(self) -> Iterable[Any]:
        snap = self.snapshot()
        return self._families(snap, float(snap is not None))


class ExporterHealth:
    """The exporter's own series: readings made, failed, and the last one's duration."""

    def __init__(self, store: StoreCollector, namespace: str = "celery_debounce") -> None:
        self.store = store
        self.namespace = namespace

    def describe(self) -> list[Any]:
        return self.collect()

    def collect(self) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        ns = f"{self.namespace}_exporter"
        return [
            CounterMetricFamily(
                f"{ns}_reads",
                "Readings of the store (one per scrape, or per min_interval).",
                value=self.store.reads,
            ),
            CounterMetricFamily(
                f"{ns}_read_errors",
                "Readings that failed (Redis unreachable or refusing).",
                value=self.store.read_errors,
            ),
            GaugeMetricFamily(
                f"{ns}_read_duration_seconds",
                "How long the last reading took.",
                value=self.store.read_duration,
            ),
        ]


def exporter_registry(
    app: Any, min_interval: float = DEFAULT_MIN_INTERVAL, namespace: str = "celery_debounce"
) -> Any:
    """A registry holding the store gauges and the exporter's health (nothing else:
    no process or platform collector, so two exporters export the same names)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    store = StoreCollector(app, namespace, min_interval=min_interval)
    registry.register(store)
    registry.register(ExporterHealth(store, namespace))
    return registry


def serve(
    app: Any,
    port: int = DEFAULT_PORT,
    addr: str = ALL_INTERFACES,
    min_interval: float = DEFAULT_MIN_INTERVAL,
) -> Any:
    """Start the HTTP server in a thread; returns the server (``shutdown()`` stops it)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(
        port, addr=addr, registry=exporter_registry(app, min_interval)
    )
    return server


def run(
    app: Any,
    port: int = DEFAULT_PORT,
    addr: str = ALL_INTERFACES,
    min_interval: float = DEFAULT_MIN_INTERVAL,
    name: str = "exporter",
) -> None:
    """Serve until SIGTERM or SIGINT (the main thread waits; scrapes run in the server's)."""
    import signal

    from ..settings import settings_for

    settings = settings_for(app)  # a configuration error stops it here, not at a scrape
    stop = threading.Event()

    def _shutdown(signum: int, _frame: Any) -> None:
        logger.info("debounce: %s: %s received, stopping", name, signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _shutdown)
    signal.signal(signal.SIGINT, _shutdown)
    server = serve(app, port, addr, min_interval)
    logger.info(
        "debounce: %s serving the store gauges on http://%s:%d/metrics (prefix %r, "
        "%d shard(s), a reading at most every %gs)",
        name,
        addr or ALL_INTERFACES,
        server.server_port,
        settings.key_prefix,
        settings.shards,
        min_interval,
    )
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        server.server_close()
    logger.info("debounce: %s stopped", name)


def _command() -> Any:
    import click
    from celery.bin.base import CeleryCommand, CeleryOption

    @click.command(name="exporter", cls=CeleryCommand)
    @click.option(
        "--port",
        type=click.IntRange(0, 65535),
        default=DEFAULT_PORT,
        show_default=True,
        cls=CeleryOption,
        help_group="Exporter",
        help="TCP port of the /metrics endpoint (0: any free port, logged).",
    )
    @click.option(
        "--addr",
        default=ALL_INTERFACES,
        show_default=True,
        cls=CeleryOption,
        help_group="Exporter",
        help="Address to listen on.",
    )
    @click.option(
        "--min-interval",
        type=click.FloatRange(min=0),
        default=DEFAULT_MIN_INTERVAL,
        show_default=True,
        cls=CeleryOption,
        help_group="Exporter",
        help="Scrapes closer together than this many seconds share one reading of Redis.",
    )
    @click.option(
        "-l",
        "--loglevel",
        default="INFO",
        cls=CeleryOption,
        help_group="Exporter",
        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
        help="Logging level.",
    )
    @click.pass_context
    def exporter(
        ctx: click.Context, port: int, addr: str, min_interval: float, loglevel: str
    ) -> None:
        """Export the store gauges to Prometheus until SIGTERM or SIGINT.

        Open, due and quarantined windows, the most overdue window's age, the
        dispatchers seen and their last batch, read from Redis at each scrape (a
        few O(1)/O(log N) commands per shard, as a `top` refresh). It needs only
        Redis, so it keeps answering when every worker is dead: run one (or two)
        per deployment and alert on it (`celery debounce alerts`).
        """
        try:
            import prometheus_client  # noqa: F401
        except ImportError as exc:
            raise click.ClickException(f"the exporter needs prometheus_client: {INSTALL}") from exc
        app: Any = ctx.obj.app
        app.log.setup(loglevel=loglevel.upper(), redirect_stdouts=False)
        try:
            store_for(app)  # a misconfigured store refuses here, before the port opens
            run(app, port, addr, min_interval)
        except DebounceError as exc:
            raise click.ClickException(str(exc)) from exc
        except OSError as exc:  # the port is taken
            raise click.ClickException(f"cannot listen on {addr}:{port}: {exc}") from exc

    return exporter


exporter_command = _command()
