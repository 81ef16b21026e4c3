"""``celery -A proj debounce ...``: see and steer open windows, run a dispatcher.

Exit codes follow Celery's (click's) conventions: 0 on success, 1 when the
operation failed (unknown window, window already dispatched, Redis unreachable,
bad configuration), 2 for a usage error (bad or conflicting options).
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryCommand, CeleryOption

from .admin import DebounceAdmin, Stats, TaskStats
from .checks import describe_policy, evicts_windows, warn_if_evicting
from .errors import DebounceError, WindowNotPending
from .windows import STATES, WindowInfo

logger = logging.getLogger("celery_debounce.cli")


def relative(seconds: float) -> str:
    """'in 4.2s', '12m ago': a human offset from now."""
    future = seconds >= 0
    s = abs(seconds)
    whole = int(s)
    if s < 60:
        text = f"{s:.1f}s"
    elif s < 3600:
        text = f"{whole // 60}m{whole % 60:02d}s"
    elif s < 86400:
        text = f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    else:
        text = f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
    return f"in {text}" if future else f"{text} ago"


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def printable(text: str) -> str:
    """``text`` safe for one table cell: control, format and line/paragraph separator
    characters (and the backslash, so escapes stay unambiguous) are written as
    Python escapes. A newline in a key can then never start a fake row, nor an
    ANSI sequence repaint the terminal."""
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable() or char == " ":
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return "".join(out)


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)) for r in [header, *rows])
    return "\n".join(line.rstrip() for line in lines)


def render_table(windows: list[WindowInfo], now: float) -> str:
    if not windows:
        return "No debounce windows."
    header = ("TASK", "KEY", "TASK ID", "STATE", "CALLS", "OPENED", "RUNS")
    rows = []
    for w in windows:
        if w.state == "pending":
            when = relative(w.deadline - now)
            if w.forced_by_max_wait:
                when = f"forced by max wait {when}"
        else:
            when = f"{w.state} (deadline {relative(w.deadline - now)})"
        if w.quiet_until is not None:  # a leading run whose quiet period still runs
            when += f", quiet period ends {relative(w.quiet_until - now)}"
        key = printable(w.key if len(w.key) <= 40 else w.key[:37] + "...")
        state = w.state if w.edge is None else f"{w.state} ({w.edge})"
        if w.held_since is not None:  # debounce_exclusive: waits for a run of its key
            state = f"{state} (held)"
        rows.append((printable(w.task), key, printable(w.task_id), state, str(w.calls),
                     relative(w.first_seen - now), when))
    return _table(header, rows)


def _late(stats: TaskStats) -> str:
    values = [stats.lateness_ms(q) for q in (0.5, 0.9, 0.99)]
    if values[0] is None:
        return "-"
    return "/".join(">30s" if v == float("inf") else f"{v:g}" for v in values if v is not None)


def render_stats(stats: Stats) -> str:
    total = stats.total
    oldest = (relative(total.oldest_first_seen - stats.now)
              if total.oldest_first_seen is not None else "-")
    lines = [
        f"open windows: {stats.open}   due now: {stats.due}   "
        f"oldest open: {oldest if stats.census else '(skipped: --quick)'}",
    ]
    if not stats.tasks:
        lines.append("No debounce activity recorded.")
        return "\n".join(lines)
    header = ("TASK", "OPEN", "DUE", "OLDEST", "WAITING CALLS", "RUNS", "CALLS", "CALLS/RUN",
              "FORCED", "CAPPED", "LEADING", "SUPPRESSED", "CANCELLED", "LATE ms p50/p90/p99")
    rows = []
    for row in [*(stats.tasks[name] for name in sorted(stats.tasks)), total]:
        ratio = row.coalescing_ratio
        census = stats.census or row is total
        rows.append((
            printable(row.task) if row is not total else "(all)",
            str(row.open) if census else "-",
            str(row.due) if census else "-",
            relative(row.oldest_first_seen - stats.now)
            if row.oldest_first_seen is not None else "-",
            str(row.calls_waiting) if stats.census else "-",
            str(row.runs), str(row.calls), f"{ratio:.1f}" if ratio is not None else "-",
            str(row.forced), str(row.closed_by_cap), str(row.leading_runs), str(row.suppressed),
            str(row.cancelled), _late(row),
        ))
    lines.append(_table(header, rows))
    return "\n".join(lines)


def _admin(ctx: click.Context) -> DebounceAdmin:
    try:
        return DebounceAdmin(ctx.obj.app)
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group(name="debounce")
@click.pass_context
def debounce(ctx: click.Context) -> None:
    """See and steer debounced-task windows, or run a dispatcher.

    Exit status: 0 success; 1 the operation failed (unknown window, window
    already dispatched, Redis unreachable, bad configuration); 2 usage error.
    """


@debounce.command(cls=CeleryCommand)
@click.option("--task", "task", cls=CeleryOption, help_group="Filter",
              help="Only windows of this task name.")
@click.option("--key", "key_glob", cls=CeleryOption, help_group="Filter",
              help="Only keys matching this glob (fnmatch, case-sensitive: *, ?, [seq]).")
@click.option("--state", "states", cls=CeleryOption, help_group="Filter", multiple=True,
              type=click.Choice(STATES), help="Only windows in this state (repeatable).")
@click.option("--id", "task_id", cls=CeleryOption, help_group="Filter",
              help="Only the window with this task id (any state).")
@click.option("--limit", type=click.IntRange(min=1), cls=CeleryOption, help_group="Filter",
              help="Show at most this many windows (earliest deadline first). Reads only "
                   "the front of the due set, so it stays fast with millions of windows.")
@click.option("--json", "as_json", is_flag=True, cls=CeleryOption, help_group="Output",
              help="Print a JSON array instead of a table.")
@click.pass_context
def inspect(ctx: click.Context, task: str | None, key_glob: str | None,
            states: tuple[str, ...], task_id: str | None, limit: int | None,
            as_json: bool) -> None:
    """List windows, earliest deadline first.

    Pending windows accept calls; dispatching, queued and claimed ones were
    taken for a run; quarantined ones could not be published. The table shows
    relative times; --json prints an array of objects with the fields task,
    key, task_id, state, calls, first_seen, deadline, max_wait_at (epoch
    seconds, Redis clock), shard, error, max_calls, edge ("leading" for a leading
    run, "trailing" for a window opened in the quiet period after one, else null),
    quiet_until (a leading run's quiet period end while it runs, else null),
    collected_bytes (a debounce_collect window: bytes of the body its run gets),
    held_since and waits_for (a debounce_exclusive window held while a run of its key
    is in progress: since when, and that window's id; else null) and
    forced_by_max_wait; the STATE column shows the edge, and "held", in parentheses.
    """
    admin = _admin(ctx)
    try:
        if task_id is not None:
            found = admin.find(task_id)
            windows = [w for w in [found] if w is not None and (not states or w.state in states)]
        else:
            windows = admin.windows(states=states or None, task=task, key_glob=key_glob,
                                    limit=limit)
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps([w.as_json() for w in windows], indent=2))
    else:
        click.echo(render_table(windows, time.time()))


def _selector(task: str | None, key: str | None, task_id: str | None, every: bool) -> str:
    """Which of the selector forms was given; raise click.UsageError otherwise."""
    if task_id is not None:
        if task is not None or key is not None or every:
            raise click.UsageError("--id cannot be combined with --task, --key or --all")
        return "id"
    if key is not None:
        if task is None:
            raise click.UsageError("--key needs --task NAME")
        if every:
            raise click.UsageError("--key cannot be combined with --all")
        return "one"
    if every:
        return "all"
    if task is not None:
        raise click.UsageError(
            f"--task {task}: add --key KEY for one window or --all for all of its windows")
    raise click.UsageError("name the windows: --task NAME --key KEY, --id TASK_ID, or --all "
                           "(optionally with --task NAME)")


_F = TypeVar("_F", bound=Callable[..., Any])


def _selector_options(verb: str) -> Callable[[_F], _F]:
    def wrap(fn: _F) -> _F:
        for option in reversed([
            click.option("--task", cls=CeleryOption, help_group="Window",
                         help=f"Task name: with --key, {verb} one window; with --all, "
                              "all windows of the task."),
            click.option("--key", cls=CeleryOption, help_group="Window",
                         help="The window's exact key (as shown by inspect)."),
            click.option("--id", "task_id", cls=CeleryOption, help_group="Window",
                         help="The window's task id (what every coalesced call returned). "
                              "Scans the due set: about 1.5 s per million open windows."),
            click.option("--all", "every", is_flag=True, cls=CeleryOption, help_group="Window",
                         help=f"{verb.capitalize()} every pending window (of --task if given)."),
        ]):
            fn = option(fn)
        return fn
    return wrap


@debounce.command(cls=CeleryCommand)
@_selector_options("flush")
@click.pass_context
def flush(ctx: click.Context, task: str | None, key: str | None, task_id: str | None,
          every: bool) -> None:
    """Run pending windows now, as if their deadline had passed.

    The window's deadline becomes now and running dispatchers are woken, so it
    is published at once (with the calls absorbed so far). Later calls with the
    same key open a new window. Without a running dispatcher (worker, beat or
    `celery debounce dispatch`) the window waits for the next one to start.
    """
    mode = _selector(task, key, task_id, every)
    admin = _admin(ctx)
    try:
        if mode == "all":
            count = admin.flush_all(task)
            click.echo(f"Flushed {count} window(s)" + (f" of {task}." if task else "."))
            return
        info = admin.flush_id(task_id) if mode == "id" else admin.flush(task, key)  # type: ignore[arg-type]
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Flushed {info.task}[{info.task_id}] key={info.key!r} calls={info.calls}.")


@debounce.command(cls=CeleryCommand)
@_selector_options("cancel")
@click.option("-f", "--force", is_flag=True, cls=CeleryOption, help_group="Window",
              help="Do not ask for confirmation with --all.")
@click.pass_context
def cancel(ctx: click.Context, task: str | None, key: str | None, task_id: str | None,
           every: bool, force: bool) -> None:
    """Drop pending windows so they never run.

    Each cancelled window's result is marked REVOKED in the result backend, so
    `AsyncResult.get()` raises TaskRevokedError instead of waiting forever.
    Windows already taken for dispatch cannot be cancelled here (exit 1): use
    `celery control revoke TASK_ID` for those.
    """
    mode = _selector(task, key, task_id, every)
    admin = _admin(ctx)
    try:
        if mode == "all":
            what = f"every pending window of {task}" if task else "EVERY pending window"
            if not force:
                click.confirm(f"Cancel {what}?", abort=True)
            count = admin.cancel_all(task)
            click.echo(f"Cancelled {count} window(s)" + (f" of {task}." if task else "."))
            return
        info = admin.cancel_id(task_id) if mode == "id" else admin.cancel(task, key)  # type: ignore[arg-type]
    except WindowNotPending as exc:
        raise click.ClickException(
            f"{exc}; to stop its run use: celery -A <app> control revoke {task_id}") from exc
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Cancelled {info.task}[{info.task_id}] key={info.key!r} calls={info.calls}; "
               "result marked revoked.")


@debounce.command(cls=CeleryCommand)
@click.option("--quick", is_flag=True, cls=CeleryOption, help_group="Output",
              help="Skip the scan of open windows (per-task open/due counts, oldest window, "
                   "calls waiting); totals and counters only. The scan takes ~1.5 s per "
                   "million open windows.")
@click.option("--json", "as_json", is_flag=True, cls=CeleryOption, help_group="Output",
              help="Print a JSON object instead of a table.")
@click.option("--reset", is_flag=True, cls=CeleryOption, help_group="Output",
              help="Zero the counters (runs, calls, forced, capped, cancelled, lateness) and print "
                   "the values zeroed (atomic: no increment is lost).")
@click.pass_context
def stats(ctx: click.Context, quick: bool, as_json: bool, reset: bool) -> None:
    """Show window counts, calls per run and dispatch lateness per task.

    Open and due windows, the oldest open window, calls waiting, runs, calls
    absorbed, calls per run, runs forced by the max wait, windows closed by their
    call cap (debounce_max_calls), leading runs and calls suppressed after one
    (debounce_leading), cancelled windows and
    dispatch lateness percentiles, per task and in total.

    RUNS, CALLS, FORCED, CAPPED, LEADING, CANCELLED and LATE count windows taken for
    dispatch (or cancelled) since the last --reset; SUPPRESSED counts calls, when
    the gate suppressed them. CALLS/RUN is the coalescing ratio.
    LATE is how long after its deadline a window was taken, as the upper bound
    of its histogram bucket (1, 5, 10, 25, ... 30000 ms).

    The last line is the windows' Redis maxmemory-policy, with a warning when
    it can evict window records ("unknown" when CONFIG GET is refused).
    """
    admin = _admin(ctx)
    try:
        figures = admin.stats(census=not quick)
        if reset:  # print exactly the counters zeroed: none lost between read and reset
            _use_counters(figures, admin.reset_stats())
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    policy = admin.store.maxmemory_policy()
    if as_json:
        click.echo(json.dumps({**figures.as_json(), "maxmemory_policy": policy,
                               "evicts_windows": evicts_windows(policy)}, indent=2))
    else:
        click.echo(render_stats(figures))
        click.echo(describe_policy(policy))


def _use_counters(figures: Stats, counters: dict[str, TaskStats]) -> None:
    """Replace the counters in ``figures`` by ``counters`` (what a reset removed)."""
    for name in set(figures.tasks) | set(counters):
        row = figures.tasks.setdefault(name, TaskStats(task=name))
        new = counters.get(name, TaskStats(task=name))
        row.runs, row.calls, row.forced, row.cancelled, row.closed_by_cap = (
            new.runs, new.calls, new.forced, new.cancelled, new.closed_by_cap)
        row.leading_runs, row.suppressed = new.leading_runs, new.suppressed
        row.lateness_buckets = list(new.lateness_buckets)


@debounce.command(cls=CeleryCommand)
@click.option("-l", "--loglevel", default="INFO", cls=CeleryOption, help_group="Dispatcher",
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
                                case_sensitive=False),
              help="Logging level.")
@click.option("-n", "--name", default=None, cls=CeleryOption, help_group="Dispatcher",
              help="Name shown in log lines (default: dispatch-<pid>).")
@click.pass_context
def dispatch(ctx: click.Context, loglevel: str, name: str | None) -> None:
    """Run a standalone dispatcher until SIGTERM or SIGINT.

    Publishes due windows like the one embedded in workers; run it when
    workers have `debounce_dispatcher = False`, or next to them: any number of
    dispatchers (workers, beat, this) share the work and each window is
    published once. On SIGTERM/SIGINT it finishes the batch in hand and exits 0.
    """
    import os

    from .dispatcher import Dispatcher

    app: Any = ctx.obj.app
    app.log.setup(loglevel=loglevel.upper(), redirect_stdouts=False)
    try:
        dispatcher = Dispatcher(app, name=name or f"dispatch-{os.getpid()}")
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc

    def _shutdown(signum: int, _frame: Any) -> None:
        logger.info("debounce: dispatcher %s: %s received, stopping",
                    dispatcher.name, signal.Signals(signum).name)
        dispatcher.stop(timeout=0)

    signal.signal(signal.SIGTERM, _shutdown)
    signal.signal(signal.SIGINT, _shutdown)
    settings = dispatcher.settings
    logger.info("debounce: dispatcher %s started (prefix %r, %d shard(s), poll %dms)",
                dispatcher.name, settings.key_prefix, settings.shards, settings.poll_interval_ms)
    warn_if_evicting(dispatcher.store, dispatcher.name, logger)
    dispatcher.run()
    logger.info("debounce: dispatcher %s stopped", dispatcher.name)


from .top import top as _top  # noqa: E402  (its module formats times with relative() above)

debounce.add_command(_top)

from .exporter import exporter_command as _exporter  # noqa: E402

debounce.add_command(_exporter)
