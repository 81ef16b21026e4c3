"""``celery -A proj debounce ...``: see and steer open windows, run a dispatcher.

Exit codes follow Celery's (click's) conventions: 0 on success, 1 when the
operation failed (unknown window, window already dispatched, Redis unreachable,
bad configuration), 2 for a usage error (bad or conflicting options).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryCommand, CeleryOption

from ..errors import DebounceError, WindowNotPending
from ..store.redis.checks import describe_policy, evicts_windows, store_policy, warn_if_evicting
from ..worker import install as install_worker
from .admin import DebounceAdmin as DebounceAdmin
from .admin import Stats, TaskStats
from .cli_common import _admin, echo_json, json_option, render_stats, render_table
from .cli_health import check, ping
from .cli_health import liveness as liveness
from .cli_schema import migrate, publish
from .exporter import exporter_command
from .formatting import config_error
from .read_view import STATES
from .top import top

logger = logging.getLogger("celery_debounce.cli")

# every `celery` command loads this plugin (its one hook into every process the command
# starts): `celery worker` claims and finishes the windows of plain tasks (sent with
# celery_debounce.send_task) even where no DebouncedTask is defined
install_worker()

_F = TypeVar("_F", bound=Callable[..., Any])


@click.group(name="debounce")
@click.pass_context
def debounce(ctx: click.Context) -> None:
    """See and steer debounced-task windows, or run a dispatcher.

    Exit status: 0 success; 1 the operation failed (unknown window, window
    already dispatched, Redis unreachable, bad configuration); 2 usage error.
    """


@debounce.command(cls=CeleryCommand)
@click.option(
    "--task", "task", cls=CeleryOption, help_group="Filter", help="Only windows of this task name."
)
@click.option(
    "--key",
    "key",
    cls=CeleryOption,
    help_group="Filter",
    help="Only the window(s) with exactly this key (as in flush and cancel). "
    "A value with *, ? or [ is still read as a glob, with a deprecation "
    "warning: use --match for that.",
)
@click.option(
    "--match",
    "key_glob",
    cls=CeleryOption,
    help_group="Filter",
    help="Only keys matching this glob (fnmatch, case-sensitive: *, ?, [seq]).",
)
@click.option(
    "--state",
    "states",
    cls=CeleryOption,
    help_group="Filter",
    multiple=True,
    type=click.Choice(STATES),
    help="Only windows in this state (repeatable).",
)
@click.option(
    "--id",
    "task_id",
    cls=CeleryOption,
    help_group="Filter",
    help="Only the window with this task id (any state).",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    cls=CeleryOption,
    help_group="Filter",
    help="Show at most this many windows (earliest deadline first). Reads only "
    "the front of the due set, so it stays fast with millions of windows.",
)
@json_option("a JSON array")
@click.pass_context
def inspect(
    ctx: click.Context,
    task: str | None,
    key: str | None,
    key_glob: str | None,
    states: tuple[str, ...],
    task_id: str | None,
    limit: int | None,
    as_json: bool,
) -> None:
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

    --key is exact, as in flush and cancel; --match takes a glob.
    """
    if key is not None and key_glob is not None:
        raise click.UsageError("--key (exact) and --match (glob) cannot be combined")
    if key is not None:
        if any(c in key for c in "*?["):  # the old meaning, kept for now
            click.echo(
                "warning: --key with a glob is deprecated and will be exact in a "
                f"later release: use --match {key!r}",
                err=True,
            )
        key_glob = key  # without glob characters fnmatch matches exactly this key
    admin = _admin(ctx)
    try:
        if task_id is not None:
            found = admin.find(task_id)
            windows = [w for w in [found] if w is not None and (not states or w.state in states)]
        else:
            windows = admin.windows(
                states=states or None, task=task, key_glob=key_glob, limit=limit
            )
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        echo_json([w.as_json() for w in windows])
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
            f"--task {task}: add --key KEY for one window or --all for all of its windows"
        )
    raise click.UsageError(
        "name the windows: --task NAME --key KEY, --id TASK_ID, or --all "
        "(optionally with --task NAME)"
    )


def _selector_options(verb: str) -> Callable[[_F], _F]:
    def wrap(fn: _F) -> _F:
        for option in reversed(
            [
                click.option(
                    "--task",
                    cls=CeleryOption,
                    help_group="Window",
                    help=f"Task name: with --key, {verb} one window; with --all, "
                    "all windows of the task.",
                ),
                click.option(
                    "--key",
                    cls=CeleryOption,
                    help_group="Window",
                    help="The window's exact key (as shown by inspect; no glob).",
                ),
                click.option(
                    "--id",
                    "task_id",
                    cls=CeleryOption,
                    help_group="Window",
                    help="The window's task id (what every coalesced call returned). "
                    "Scans the due set: about 1.5 s per million open windows.",
                ),
                click.option(
                    "--all",
                    "every",
                    is_flag=True,
                    cls=CeleryOption,
                    help_group="Window",
                    help=f"{verb.capitalize()} every pending window (of --task if given).",
                ),
            ]
        ):
            fn = option(fn)
        return fn

    return wrap


@debounce.command(cls=CeleryCommand)
@_selector_options("flush")
@json_option(
    'a JSON object ({"flushed": N, "task": ...} with --all, else the window '
    "flushed, fields as in inspect --json)"
)
@click.pass_context
def flush(
    ctx: click.Context,
    task: str | None,
    key: str | None,
    task_id: str | None,
    every: bool,
    as_json: bool,
) -> None:
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
            if as_json:
                echo_json({"flushed": count, "task": task})
            else:
                click.echo(f"Flushed {count} window(s)" + (f" of {task}." if task else "."))
            return
        info = admin.flush_id(task_id) if mode == "id" else admin.flush(task, key)  # type: ignore[arg-type]
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        echo_json({"flushed": 1, **info.as_json()})
    else:
        click.echo(f"Flushed {info.task}[{info.task_id}] key={info.key!r} calls={info.calls}.")


@debounce.command(cls=CeleryCommand)
@_selector_options("cancel")
@click.option(
    "-f",
    "--force",
    is_flag=True,
    cls=CeleryOption,
    help_group="Window",
    help="Do not ask for confirmation with --all.",
)
@json_option(
    'a JSON object ({"cancelled": N, "task": ...} with --all, else the window '
    "cancelled, fields as in inspect --json)"
)
@click.pass_context
def cancel(
    ctx: click.Context,
    task: str | None,
    key: str | None,
    task_id: str | None,
    every: bool,
    force: bool,
    as_json: bool,
) -> None:
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
            if as_json:
                echo_json({"cancelled": count, "task": task})
            else:
                click.echo(f"Cancelled {count} window(s)" + (f" of {task}." if task else "."))
            return
        info = admin.cancel_id(task_id) if mode == "id" else admin.cancel(task, key)  # type: ignore[arg-type]
    except WindowNotPending as exc:
        raise click.ClickException(
            f"{exc}; to stop its run use: celery -A <app> control revoke {task_id}"
        ) from exc
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        echo_json({"cancelled": 1, **info.as_json()})
    else:
        click.echo(
            f"Cancelled {info.task}[{info.task_id}] key={info.key!r} "
            f"calls={info.calls}; result marked revoked."
        )


@debounce.command(cls=CeleryCommand)
@click.option(
    "--quick",
    is_flag=True,
    cls=CeleryOption,
    help_group="Output",
    help="Skip the scan of open windows (per-task open/due counts, oldest window, "
    "calls waiting); totals and counters only. The scan takes ~1.5 s per "
    "million open windows.",
)
@json_option("a JSON object (figures --quick does not count are null)")
@click.option(
    "--reset",
    is_flag=True,
    cls=CeleryOption,
    help_group="Output",
    help="Zero the counters (runs, calls, forced, capped, cancelled, lateness) and print "
    "the values zeroed (atomic: no increment is lost).",
)
@click.pass_context
def stats(ctx: click.Context, quick: bool, as_json: bool, reset: bool) -> None:
    """Show window counts, calls per run and dispatch lateness per task.

    Open and due windows, the oldest open window, calls waiting, runs, calls
    absorbed, calls per run, runs forced by the max wait, windows closed by their
    call cap (debounce_max_calls), leading runs and calls suppressed after one
    (debounce_leading), cancelled windows and
    dispatch lateness percentiles, per task and in total.

    RUNS, CALLS, FORCED, CAPPED, LEADING, CANCELLED and LATE count windows taken for
    dispatch (or cancelled) since the last --reset; CALLS IN and SUPPRESSED count
    calls as the gate accepted (or suppressed) them. CALLS/RUN is the coalescing ratio.
    LATE is how long after its deadline a window was taken, as the upper bound
    of its histogram bucket (1, 5, 10, 25, ... 30000 ms).

    The last line is the windows' Redis maxmemory-policy, with a warning when
    it can evict window records ("unknown" when CONFIG GET is refused); on the
    PostgreSQL store, that its rows are never evicted.
    """
    admin = _admin(ctx)
    try:
        figures = admin.stats(census=not quick)
        if reset:  # print exactly the counters zeroed: none lost between read and reset
            _use_counters(figures, admin.reset_stats())
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    # PostgreSQL has no eviction policy: its rows are never evicted
    policy = store_policy(admin.store)
    if as_json:
        echo_json(
            {
                **figures.as_json(),
                "maxmemory_policy": policy,
                "evicts_windows": False if policy is None else evicts_windows(policy),
            }
        )
    else:
        click.echo(render_stats(figures))
        click.echo(
            "windows in PostgreSQL: rows are never evicted"
            if policy is None
            else describe_policy(policy)
        )


def _use_counters(figures: Stats, counters: dict[str, TaskStats]) -> None:
    """Replace the counters in ``figures`` by ``counters`` (what a reset removed)."""
    for name in set(figures.tasks) | set(counters):
        row = figures.tasks.setdefault(name, TaskStats(task=name))
        new = counters.get(name, TaskStats(task=name))
        row.runs, row.calls, row.forced, row.cancelled, row.closed_by_cap = (
            new.runs,
            new.calls,
            new.forced,
            new.cancelled,
            new.closed_by_cap,
        )
        row.leading_runs, row.suppressed = new.leading_runs, new.suppressed
        row.calls_in = new.calls_in
        row.lateness_buckets = list(new.lateness_buckets)


@debounce.command(cls=CeleryCommand)
@click.option(
    "-l",
    "--loglevel",
    default="INFO",
    cls=CeleryOption,
    help_group="Dispatcher",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False),
    help="Logging level.",
)
@click.option(
    "-n",
    "--name",
    default=None,
    cls=CeleryOption,
    help_group="Dispatcher",
    help="Name shown in log lines, ping and top (default: dispatch-<pid>).",
)
@click.option(
    "-f",
    "--logfile",
    default=None,
    cls=CeleryOption,
    help_group="Daemonization",
    help="Log to this file (default: stderr).",
)
@click.option(
    "--pidfile",
    default=None,
    cls=CeleryOption,
    help_group="Daemonization",
    help="Write the pid here; refuse to start while the pid it holds still runs.",
)
@click.option(
    "-D",
    "--detach",
    is_flag=True,
    cls=CeleryOption,
    help_group="Daemonization",
    help="Run in the background, as celery beat does (log with -f FILE).",
)
@click.option(
    "--workdir",
    default=None,
    cls=CeleryOption,
    help_group="Daemonization",
    help="Change to this directory when detached.",
)
@click.pass_context
def dispatch(
    ctx: click.Context,
    loglevel: str,
    name: str | None,
    logfile: str | None,
    pidfile: str | None,
    detach: bool,
    workdir: str | None,
) -> None:
    """Run a standalone dispatcher until SIGTERM or SIGINT.

    Publishes due windows like the one embedded in workers; run it when
    workers have `debounce_dispatcher = False`, or next to them: any number of
    dispatchers (workers, beat, this) share the work and each window is
    published once. On SIGTERM/SIGINT it finishes the batch in hand, records
    its stop (ping and top show it stopped) and exits 0. Every running
    dispatcher writes a heartbeat every 5 s: `celery debounce ping` reads it.
    """
    if detach:
        from celery.platforms import detached

        with detached(logfile, pidfile, workdir=workdir):
            _dispatch(ctx, loglevel, name, logfile, pidfile)
        return
    _dispatch(ctx, loglevel, name, logfile, pidfile)


def _dispatch(
    ctx: click.Context, loglevel: str, name: str | None, logfile: str | None, pidfile: str | None
) -> None:
    import os

    from celery.platforms import create_pidlock

    from ..dispatch.dispatcher import Dispatcher

    app: Any = ctx.obj.app
    app.log.setup(loglevel=loglevel.upper(), logfile=logfile, redirect_stdouts=False)
    if pidfile:
        create_pidlock(pidfile)  # exits when another live process holds it; removed at exit
    try:
        dispatcher = Dispatcher(app, name=name or f"dispatch-{os.getpid()}")
    except DebounceError as exc:
        raise config_error(exc, app) from exc

    def _shutdown(signum: int, _frame: Any) -> None:
        logger.info(
            "debounce: dispatcher %s: %s received, stopping",
            dispatcher.name,
            signal.Signals(signum).name,
        )
        dispatcher.stop(timeout=0)

    signal.signal(signal.SIGTERM, _shutdown)
    signal.signal(signal.SIGINT, _shutdown)
    settings = dispatcher.settings
    logger.info(
        "debounce: dispatcher %s started (prefix %r, %d shard(s), poll %dms)",
        dispatcher.name,
        settings.key_prefix,
        settings.shards,
        settings.poll_interval_ms,
    )
    warn_if_evicting(dispatcher.store, dispatcher.name, logger)
    dispatcher.run()
    logger.info("debounce: dispatcher %s stopped", dispatcher.name)


@debounce.command(cls=CeleryCommand)
@click.option(
    "--repair",
    is_flag=True,
    cls=CeleryOption,
    help_group="Doctor",
    help="Fix what is found, atomically per key (safe to run twice).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    cls=CeleryOption,
    help_group="Doctor",
    show_default=True,
    help="Seconds past its lease after which an unreleased claim is a finding.",
)
@click.option(
    "--held-after",
    type=click.FloatRange(min=0),
    default=3600.0,
    cls=CeleryOption,
    help_group="Doctor",
    show_default=True,
    help="Seconds a window may be held behind a live run before it is reported.",
)
@json_option(
    'a JSON object ({"ok": bool, "findings": [{"check", "key", "task", "detail", "repaired"}]})'
)
@click.pass_context
def doctor(
    ctx: click.Context, repair: bool, grace: float, held_after: float, as_json: bool
) -> None:
    """Check the store's invariants; with --repair, fix what is found.

    Open windows without a due entry, claims past their lease that no dispatcher
    released, run markers without a live window, held windows whose runner is gone,
    collect call lists without a window, records without a TTL, and windows held
    longer than --held-after behind a run (reported, never repaired). Each finding
    names its key and task. Exit 0 when there is none, else 1 (also after --repair).
    """
    from ..store import WindowStore
    from .doctor import CHECKS, diagnose, render

    store = _admin(ctx).store
    if not isinstance(store, WindowStore):  # its checks read Redis's own keys (doctor.py)
        raise click.ClickException(
            "celery debounce doctor is not available on the PostgreSQL store yet "
            "(its checks read the Redis store's keys)"
        )
    try:
        findings = diagnose(
            store,
            repair=repair,
            grace_ms=int(grace * 1000),
            held_after_ms=int(held_after * 1000),
        )
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        echo_json(
            {"ok": not findings, "checks": CHECKS, "findings": [f.as_json() for f in findings]}
        )
    else:
        click.echo(render(findings, repair))
    if findings:
        ctx.exit(1)


debounce.add_command(ping)
debounce.add_command(migrate)
debounce.add_command(publish)
debounce.add_command(check)
debounce.add_command(top)

debounce.add_command(exporter_command)


def _write_shipped(name: str, output: str | None) -> None:
    """Write a file shipped in ``celery_debounce/dashboards`` to stdout or ``output``."""
    from importlib.resources import files

    text = (files("celery_debounce") / "dashboards" / name).read_text(encoding="utf-8")
    if output is None or output == "-":
        click.echo(text, nl=False)
        return
    try:
        with open(output, "w", encoding="utf-8") as out:
            out.write(text)
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from exc
    click.echo(f"wrote {output}", err=True)


def _output_option(fn: _F) -> _F:
    return click.option(
        "-o", "--output", metavar="PATH", default=None, help="Write to PATH instead of stdout."
    )(fn)


@debounce.command()
@_output_option
def dashboard(output: str | None) -> None:
    """Write the Grafana dashboard (JSON) shipped with this version."""
    _write_shipped("celery-debounce.json", output)


@debounce.command()
@_output_option
def alerts(output: str | None) -> None:
    """Write the Prometheus alert rules (YAML) shipped with this version."""
    _write_shipped("alerts.yml", output)
