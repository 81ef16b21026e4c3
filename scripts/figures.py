"""Draw the docs' figures from real runs (``pip install 'celery-debounced[figures]'``).

    python scripts/figures.py [--quick] [--out docs/img]

Starts its own redis-server and a real Celery worker (in this process, solo pool,
with the embedded dispatcher), makes the calls, and plots what happened:

* ``burst.svg``: one key called every 100 ms: the deadline moves with each
  call and the task runs once, a window after the last call.
* ``max-wait.svg``: a key called every 100 ms without pause: the max wait caps
  each window, so the task runs every max wait.
* ``lateness.svg``: windows opened at a steady rate, each due once: how long
  after its deadline each was taken by the dispatcher and started by the worker
  (a small version of the lateness benchmark, docs/performance.md).
* ``exclusive.svg``: a ``debounce_exclusive`` task (a threads worker that could run
  two at once): a burst of calls during a run gathers in one window, held while the
  run lasts and published the moment it ends: one follow-up, after the run.
* ``dashboard.svg``: every panel of dashboards/celery-debounce.json, drawn from
  its own PromQL run against a real Prometheus (Debian's ``prometheus``) that
  scraped this process while a stream of calls ran (skipped, with a note, when
  ``prometheus`` is not installed).

Every time on the plots comes from the run: call times from the producer,
deadlines from the gate's reply (``window_opened``/``call_absorbed`` signals),
takes from ``window_dispatched``, run starts from the task itself. ``--quick``
makes the same figures from shorter runs (tests/system/test_figures.py runs it, so the
figures cannot go stale unnoticed). Prints one summary line per figure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: The figures this script writes (docs link to docs/img/<name>).
FIGURES = ("burst.svg", "max-wait.svg", "lateness.svg", "dashboard.svg", "exclusive.svg")
DASHBOARD = ROOT / "celery_debounce" / "dashboards" / "celery-debounce.json"


@dataclass
class Recorder:
    """What the signals and the task saw, by task id. Times are epoch seconds."""

    calls: list[tuple[float, str, float]] = field(default_factory=list)  # (at, id, deadline)
    taken: dict[str, float] = field(default_factory=dict)  # id -> lateness at take (s)
    runs: dict[str, float] = field(default_factory=dict)  # id -> start

    def on_call(self, sender: str, task_id: str, deadline: float, **_: Any) -> None:
        self.calls.append((time.time(), task_id, deadline))

    def on_dispatched(self, sender: str, task_id: str, lateness: float, **_: Any) -> None:
        self.taken[task_id] = lateness

    def reset(self) -> None:
        self.calls.clear()
        self.taken.clear()
        self.runs.clear()


@contextmanager
def running(recorder: Recorder) -> Iterator[Any]:
    """A redis-server, an app with one debounced task, and a worker running it."""
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    from celery_debounce import DebouncedTask
    from celery_debounce.signals import call_absorbed, window_dispatched, window_opened
    from celery_debounce.testing.servers import LocalRedis

    with LocalRedis() as server:
        app = Celery("figures", set_as_current=False)
        app.conf.update(
            broker_url=f"{server.url}/1",
            result_backend=f"{server.url}/2",
            debounce_redis_url=f"{server.url}/0",
            worker_hijack_root_logger=False,
            broker_connection_retry_on_startup=True,
        )

        @app.task(
            base=DebouncedTask,
            bind=True,
            shared=False,
            name="figures.touch",
            debounce="1s",
            debounce_max_wait="10s",
            debounce_key="k:{0}",
        )
        def touch(self: Any, key: str) -> None:
            recorder.runs[self.request.id] = time.time()

        receivers = (
            (window_opened, recorder.on_call),
            (call_absorbed, recorder.on_call),
            (window_dispatched, recorder.on_dispatched),
        )
        for signal, receiver in receivers:
            signal.connect(receiver, weak=False)
        try:
            with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
                yield touch
        finally:
            for signal, receiver in receivers:
                signal.disconnect(receiver)


@dataclass
class ExclusiveRecorder:
    """The exclusive figure's run: calls (at, id, deadline), runs' (start, end), holds."""

    calls: list[tuple[float, str, float]] = field(default_factory=list)
    runs: dict[str, list[float]] = field(default_factory=dict)  # id -> [start, end]
    held: dict[str, float] = field(default_factory=dict)  # id -> seconds held

    def on_call(self, sender: str, task_id: str, deadline: float, **_: Any) -> None:
        self.calls.append((time.time(), task_id, deadline))

    def on_held(self, sender: str, task_id: str, held: float, **_: Any) -> None:
        self.held[task_id] = held


@contextmanager
def running_exclusive(recorder: ExclusiveRecorder, seconds: float) -> Iterator[Any]:
    """A redis-server and a threads worker (2 at once) running an exclusive task whose
    run takes ``seconds``; the first call of each key runs for that long, later ones
    for a tenth of it."""
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    from celery_debounce import DebouncedTask
    from celery_debounce.signals import call_absorbed, window_held, window_opened
    from celery_debounce.testing.servers import LocalRedis

    with LocalRedis() as server:
        app = Celery("figures-exclusive", set_as_current=False)
        app.conf.update(
            broker_url=f"{server.url}/1",
            result_backend=f"{server.url}/2",
            debounce_redis_url=f"{server.url}/0",
            worker_hijack_root_logger=False,
            broker_connection_retry_on_startup=True,
            debounce_poll_interval=0.1,
        )

        @app.task(
            base=DebouncedTask,
            bind=True,
            shared=False,
            name="figures.rebuild",
            debounce="500ms",
            debounce_max_wait="10s",
            debounce_key="report:{0}",
            debounce_exclusive=True,
        )
        def rebuild(self: Any, report: str) -> None:
            start = time.time()
            recorder.runs[self.request.id] = [start, start]
            time.sleep(seconds if len(recorder.runs) == 1 else seconds / 10)
            recorder.runs[self.request.id][1] = time.time()

        receivers = (
            (window_opened, recorder.on_call),
            (call_absorbed, recorder.on_call),
            (window_held, recorder.on_held),
        )
        for signal, receiver in receivers:
            signal.connect(receiver, weak=False)
        try:
            with start_worker(
                app, pool="threads", concurrency=2, perform_ping_check=False, shutdown_timeout=10
            ):
                yield rebuild
        finally:
            for signal, receiver in receivers:
                signal.disconnect(receiver)


def exclusive_run(rebuild: Any, rec: ExclusiveRecorder, seconds: float) -> dict[str, Any]:
    """One call, then a burst of calls while its run lasts; wait for the follow-up."""
    rebuild.delay("7")
    wait_for(lambda: rec.runs, 15)
    time.sleep(seconds / 6)
    paced(10, 0.1, lambda i: rebuild.delay("7"))
    wait_for(lambda: len(rec.runs) == 2 and all(e > s for s, e in rec.runs.values()), seconds + 15)
    time.sleep(1.0)  # a third run would show up here (there is none)
    return {
        "calls": list(rec.calls),
        "runs": {k: list(v) for k, v in rec.runs.items()},
        "held": dict(rec.held),
        "seconds": seconds,
    }


def wait_for(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"figures: the run did not finish within {timeout}s")
        time.sleep(0.05)


def paced(count: int, every: float, call: Any) -> None:
    start = time.monotonic()
    for i in range(count):
        pause = start + i * every - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        call(i)


# -- the runs ---------------------------------------------------------------------


def burst_run(touch: Any, rec: Recorder, calls: int) -> dict[str, Any]:
    rec.reset()
    paced(
        calls, 0.1, lambda i: touch.apply_async(("burst",), debounce="1s", debounce_max_wait="10s")
    )
    wait_for(lambda: rec.runs, 15)
    time.sleep(1.5)  # a second run would show up here (there is none)
    return {"calls": list(rec.calls), "runs": dict(rec.runs)}


def stream_run(touch: Any, rec: Recorder, seconds: float) -> dict[str, Any]:
    rec.reset()
    paced(
        int(seconds / 0.1),
        0.1,
        lambda i: touch.apply_async(("stream",), debounce="500ms", debounce_max_wait="2s"),
    )
    ids = {tid for _, tid, _ in rec.calls}
    wait_for(lambda: ids <= set(rec.runs), 15)
    return {"calls": list(rec.calls), "runs": dict(rec.runs), "max_wait": 2.0}


def lateness_run(touch: Any, rec: Recorder, rate: int, seconds: float) -> dict[str, Any]:
    rec.reset()
    total = int(rate * seconds)
    paced(
        total,
        1 / rate,
        lambda i: touch.apply_async((f"late-{i}",), debounce="500ms", debounce_max_wait="1s"),
    )
    deadlines = {tid: dl for _, tid, dl in rec.calls}
    # a run can start before its batch's window_dispatched is sent: wait for both
    wait_for(lambda: len(rec.runs) >= total and deadlines.keys() <= rec.taken.keys(), 60)
    taken = [rec.taken[tid] * 1000 for tid in deadlines]
    started = [(rec.runs[tid] - deadlines[tid]) * 1000 for tid in deadlines]
    return {"taken_ms": taken, "started_ms": started, "rate": rate, "seconds": seconds}


# -- the plots ----------------------------------------------------------------------


def _axes(title: str, height: float = 2.6) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, height))
    ax.set_title(title, fontsize=10, loc="left")
    ax.spines[["top", "right"]].set_visible(False)
    return fig, ax


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    if path.suffix == ".png":
        fig.savefig(path, format="png", dpi=110)
    else:
        fig.savefig(path, format="svg", metadata={"Date": None})
    import matplotlib.pyplot as plt

    plt.close(fig)


def plot_burst(data: dict[str, Any], path: Path) -> str:
    calls, runs = data["calls"], data["runs"]
    t0 = calls[0][0]
    fig, ax = _axes(
        f"A burst of {len(calls)} calls to one key (window 1 s) becomes {len(runs)} run"
    )
    ax.vlines([c[0] - t0 for c in calls], 0, 1, color="#4c72b0", lw=1.2, label="call")
    ax.plot(
        [c[2] - t0 for c in calls[:-1]],
        [1.3] * (len(calls) - 1),
        "|",
        color="#f0b27a",
        ms=12,
        mew=1.5,
        label="deadline after each call",
    )
    ax.plot([calls[-1][2] - t0], [1.3], "|", color="#dd8452", ms=18, mew=3, label="final deadline")
    for start in runs.values():
        ax.plot([start - t0], [0.5], "*", color="#c44e52", ms=16, label="the run")
    ax.set_yticks([])
    ax.set_ylim(-0.2, 2.2)
    ax.set_xlabel("seconds since the first call")
    ax.legend(loc="upper left", fontsize=8, frameon=False, ncols=3)
    _save(fig, path)
    start = min(runs.values()) - t0
    return (
        f"burst: {len(calls)} calls -> {len(runs)} run(s), started {start:.2f}s after "
        f"the first call, {start - (calls[-1][0] - t0):.2f}s after the last"
    )


def plot_stream(data: dict[str, Any], path: Path) -> str:
    calls, runs, max_wait = data["calls"], data["runs"], data["max_wait"]
    t0 = calls[0][0]
    fig, ax = _axes(
        f"A key called every 100 ms without pause (window 0.5 s, max wait "
        f"{max_wait:g} s): {len(runs)} runs"
    )
    ax.vlines([c[0] - t0 for c in calls], 0, 1, color="#4c72b0", lw=0.8, label="call")
    opened: dict[str, float] = {}
    for at, tid, _ in calls:
        opened.setdefault(tid, at)
    for i, (tid, first) in enumerate(sorted(opened.items(), key=lambda kv: kv[1])):
        run = runs[tid]
        ax.axvspan(
            first - t0,
            run - t0,
            ymin=0.5,
            ymax=0.62,
            color="#dd8452" if i % 2 == 0 else "#f0b27a",
            alpha=0.8,
            label="one window" if i == 0 else None,
        )
        ax.axvline(
            first + max_wait - t0,
            color="#555555",
            ls=":",
            lw=1,
            label="first call + max wait" if i == 0 else None,
        )
        ax.plot([run - t0], [0.5], "*", color="#c44e52", ms=14, label="run" if i == 0 else None)
    ax.set_yticks([])
    ax.set_ylim(-0.2, 2.4)
    ax.set_xlabel("seconds since the first call")
    ax.legend(loc="upper left", fontsize=8, frameon=False, ncols=4)
    _save(fig, path)
    times = ", ".join(f"+{start - t0:.2f}s" for start in sorted(runs.values()))
    return (
        f"max-wait: {len(calls)} calls in {calls[-1][0] - t0:.1f}s -> {len(runs)} runs, "
        f"started at {times}"
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def plot_lateness(data: dict[str, Any], path: Path) -> str:
    taken, started = data["taken_ms"], data["started_ms"]
    fig, ax = _axes(
        f"Lateness of {len(taken):,} windows opened at {data['rate']}/s, "
        f"each due once (embedded dispatcher, solo worker)",
        height=3.0,
    )
    top = max(max(started), max(taken), 1.0)
    bins = [i * top / 40 for i in range(41)]
    for values, label, colour in (
        (taken, "deadline -> taken by the dispatcher", "#4c72b0"),
        (started, "deadline -> task started", "#dd8452"),
    ):
        ax.hist(
            values,
            bins=bins,
            alpha=0.7,
            color=colour,
            label=f"{label}: p50 {_pct(values, 0.5):.0f} ms, p99 {_pct(values, 0.99):.0f} ms",
        )
    ax.set_xlabel("milliseconds after the window's deadline")
    ax.set_ylabel("windows")
    ax.legend(fontsize=8, frameon=False)
    _save(fig, path)
    return (
        f"lateness: {len(taken)} windows, taken p50 {_pct(taken, 0.5):.1f}ms "
        f"p99 {_pct(taken, 0.99):.1f}ms, started p50 {_pct(started, 0.5):.1f}ms "
        f"p99 {_pct(started, 0.99):.1f}ms"
    )


def plot_exclusive(data: dict[str, Any], path: Path) -> str:
    calls, runs, held = data["calls"], data["runs"], data["held"]
    t0 = calls[0][0]
    (first, (a_start, a_end)), *follow = sorted(runs.items(), key=lambda kv: kv[1][0])
    during = [c for c in calls if c[1] != first]
    fig, ax = _axes(
        f"debounce_exclusive: {len(during)} calls during a {data['seconds']:g} s "
        f"run (window 0.5 s) -> {len(follow)} follow-up, after the run",
        height=2.8,
    )
    ax.vlines([c[0] - t0 for c in calls], 0, 1, color="#4c72b0", lw=1.2, label="call")
    ax.axvspan(
        a_start - t0, a_end - t0, ymin=0.55, ymax=0.68, color="#55a868", alpha=0.8, label="run A"
    )
    for tid, (start, end) in follow:
        due = max(c[2] for c in during if c[1] == tid)
        ax.axvspan(
            due - t0,
            start - t0,
            ymin=0.38,
            ymax=0.48,
            color="#bbbbbb",
            hatch="//",
            alpha=0.6,
            label="window B held (due, run A in progress)",
        )
        ax.plot([due - t0], [0.9], "|", color="#dd8452", ms=18, mew=3, label="window B's deadline")
        ax.axvspan(
            start - t0,
            end - t0,
            ymin=0.55,
            ymax=0.68,
            color="#c44e52",
            alpha=0.8,
            label="run B (the follow-up)",
        )
        ax.annotate(
            "A ended: B published",
            xy=(start - t0, 1.6),
            xytext=(start - t0 + 0.3, 2.0),
            fontsize=8,
            arrowprops={"arrowstyle": "->", "color": "#555555"},
        )
    ax.set_yticks([])
    ax.set_ylim(-0.2, 2.6)
    ax.set_xlabel("seconds since the first call")
    ax.legend(loc="upper left", fontsize=8, frameon=False, ncols=3)
    _save(fig, path)
    ((tid, (start, _)),) = follow
    return (
        f"exclusive: {len(during)} calls during the run -> {len(follow)} follow-up(s), "
        f"started {start - a_end:.2f}s after the run ended, held {held.get(tid, 0):.2f}s"
    )


# -- the dashboard, from a real Prometheus ----------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _api(port: int, path: str, **params: Any) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as reply:  # loopback only
        body = json.load(reply)
    if body.get("status") != "success":
        raise SystemExit(f"figures: Prometheus refused {params}: {body}")
    return body["data"]


def promql(expr: str) -> str:
    """A panel's query as Grafana sends it with every task selected."""
    return expr.replace("$__rate_interval", "10s").replace("$task", ".*").replace("$job", ".*")


def dashboard_run(touch: Any, seconds: float) -> dict[str, Any] | None:
    """Scrape this process with a real Prometheus while calls stream in, then run
    every panel's query over the run (``query_range``, 1 s steps)."""
    if shutil.which("prometheus") is None:
        print(
            "figures: prometheus is not installed: dashboard.svg not drawn "
            "(scripts/ensure-observability.sh installs it)",
            file=sys.stderr,
        )
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    from celery_debounce.ops import metrics

    registry = CollectorRegistry()
    events = metrics.enable(registry=registry)
    metrics.enable_store_gauges(touch.app, registry=registry)
    exporter = start_http_server(_free_port(), addr="127.0.0.1", registry=registry)
    target = exporter[0].server_address[1] if isinstance(exporter, tuple) else None
    workdir = Path(tempfile.mkdtemp(prefix="figures-prometheus-"))
    port = _free_port()
    (workdir / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: figures\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
    )
    server = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _up(port), 30)
        start = time.time()
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            touch.apply_async(("hot",), debounce="300ms", debounce_max_wait="1s")
            if i % 10 == 0:
                touch.apply_async((f"cold{i % 7}",), debounce="300ms", debounce_max_wait="1s")
            # the middle third: 50 more keys a second, each called once (no coalescing)
            if seconds / 3 < seconds - (end - time.monotonic()) < 2 * seconds / 3 and i % 2:
                touch.apply_async((f"once{i}",), debounce="2s", debounce_max_wait="4s")
            i += 1
            time.sleep(0.02)
        time.sleep(3)  # the last windows leave, the last scrapes land
        stop = time.time()
        panels = json.loads(DASHBOARD.read_text())["panels"]
        results = {}
        for panel in panels:
            for t in panel["targets"]:
                data = _api(
                    port, "query_range", query=promql(t["expr"]), start=start, end=stop, step="1"
                )
                results[(panel["title"], t["refId"])] = data["result"]
        return {"panels": panels, "results": results, "start": start}
    finally:
        server.terminate()
        server.wait(15)
        events.disable()
        if isinstance(exporter, tuple):
            exporter[0].shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def _up(port: int) -> bool:
    try:
        return any(r["value"][1] == "1" for r in _api(port, "query", query="up")["result"])
    except OSError:
        return False


def _legend(fmt: str, labels: dict[str, str]) -> str:
    for name, value in labels.items():
        fmt = fmt.replace("{{" + name + "}}", value)
    return fmt


def plot_dashboard(data: dict[str, Any], path: Path) -> str:
    import matplotlib.pyplot as plt

    panels = data["panels"]
    rows = (len(panels) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(11, 2.4 * rows))
    drawn = 0
    for ax, panel in zip(axes.flat, panels, strict=False):
        ax.set_title(panel["title"], fontsize=9, loc="left")
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(labelsize=7)
        if panel["type"] == "heatmap":
            drawn += _heatmap(ax, data, panel)
            continue
        for target in panel["targets"]:
            for series in data["results"][(panel["title"], target["refId"])]:
                xs = [float(t) - data["start"] for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                ax.plot(xs, ys, lw=1.2, label=_legend(target["legendFormat"], series["metric"]))
                drawn += 1
        ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]) if unit_is_count(panel) else None)
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        ax.set_ylabel(
            {"s": "seconds", "reqps": "per second", "ops": "per second"}.get(unit, ""), fontsize=7
        )
        ax.legend(fontsize=6, frameon=False, loc="upper left")
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seconds", fontsize=7)
    fig.suptitle(
        "dashboards/celery-debounce.json: each panel's PromQL on a real Prometheus",
        fontsize=10,
        x=0.01,
        ha="left",
    )
    _save(fig, path)
    return f"dashboard: {len(panels)} panels, {drawn} series drawn"


def unit_is_count(panel: Any) -> bool:
    """Counts (windows) get at least a 0..1 axis, so a flat 0 reads as 0."""
    return bool(panel["fieldConfig"]["defaults"].get("unit") == "short")


def _heatmap(ax: Any, data: dict[str, Any], panel: Any) -> int:
    """Grafana de-accumulates ``le`` buckets for a heatmap; so does this."""
    target = panel["targets"][0]
    series = data["results"][(panel["title"], target["refId"])]
    series = sorted(series, key=lambda s: float(s["metric"]["le"]))
    if not series:
        return 0
    grid = [[float(v) for _, v in s["values"]] for s in series]
    width = min(len(row) for row in grid)
    cells = [[grid[0][j] for j in range(width)]]
    for lower, upper in itertools.pairwise(grid):
        cells.append([max(0.0, upper[j] - lower[j]) for j in range(width)])
    times = [float(t) - data["start"] for t, _ in series[0]["values"][:width]]
    ax.imshow(
        cells,
        aspect="auto",
        origin="lower",
        cmap="Oranges",
        interpolation="nearest",
        extent=(times[0] - 0.5, times[-1] + 0.5, -0.5, len(cells) - 0.5),
    )
    labels = [s["metric"]["le"] for s in series]
    ax.set_yticks(
        range(len(labels)), [f"<={x}s" if x != "+Inf" else ">30s" for x in labels], fontsize=6
    )
    ax.set_ylabel("lateness", fontsize=7)
    return len(series)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (for the checks)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--png", action="store_true", help="PNG files instead of SVG (to look at)")
    args = parser.parse_args(argv)
    try:
        import matplotlib
    except ImportError:
        print("figures: needs matplotlib: pip install 'celery-debounced[figures]'", file=sys.stderr)
        return 2
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "celery-debounce"  # stable ids between runs
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text (small, searchable)
    args.out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder()
    with running(recorder) as touch:
        burst = burst_run(touch, recorder, 12 if args.quick else 25)
        stream = stream_run(touch, recorder, 4.5 if args.quick else 7.0)
        late = lateness_run(touch, recorder, 100 if args.quick else 200, 2.0 if args.quick else 5.0)
        board = dashboard_run(touch, 10.0 if args.quick else 45.0)
    held = ExclusiveRecorder()
    run_s = 2.0 if args.quick else 3.0
    with running_exclusive(held, run_s) as rebuild:
        exclusive = exclusive_run(rebuild, held, run_s)
    burst_path, stream_path, late_path, board_path, exclusive_path = (
        args.out / (name.replace(".svg", ".png") if args.png else name) for name in FIGURES
    )
    print(plot_burst(burst, burst_path))
    print(plot_stream(stream, stream_path))
    print(plot_lateness(late, late_path))
    if board is not None:
        print(plot_dashboard(board, board_path))
    print(plot_exclusive(exclusive, exclusive_path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
