"""``celery -A proj debounce ...``: see and steer open windows."""

from __future__ import annotations

import json
import time
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from .errors import DebounceError
from .windows import STATES, WindowInfo, list_windows


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


def render_table(windows: list[WindowInfo], now: float) -> str:
    if not windows:
        return "No debounce windows."
    header = ("TASK", "KEY", "TASK ID", "STATE", "CALLS", "RUNS")
    rows = []
    for w in windows:
        if w.state == "pending":
            when = relative(w.deadline - now)
            if w.forced_by_max_wait:
                when = f"forced by max wait {when}"
        else:
            when = f"{w.state} (deadline {relative(w.deadline - now)})"
        key = w.key if len(w.key) <= 40 else w.key[:37] + "..."
        rows.append((w.task, key, w.task_id, w.state, str(w.calls), when))
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)) for r in [header, *rows])
    return "\n".join(line.rstrip() for line in lines)


@click.group(cls=click.Group, name="debounce")
@click.pass_context
def debounce(ctx: click.Context) -> None:
    """See and steer debounced-task windows."""


@debounce.command(cls=CeleryCommand)
@click.option("--task", "task", cls=CeleryOption, help_group="Filter", help="Only this task name.")
@click.option("--key", "key_glob", cls=CeleryOption, help_group="Filter",
              help="Only keys matching this glob (fnmatch: *, ?, [seq]).")
@click.option("--state", "states", cls=CeleryOption, help_group="Filter", multiple=True,
              type=click.Choice(STATES), help="Only windows in this state (repeatable).")
@click.option("--limit", type=click.IntRange(min=1), cls=CeleryOption, help_group="Filter",
              help="Show at most this many windows (earliest deadline first).")
@click.option("--json", "as_json", is_flag=True, cls=CeleryOption, help_group="Output",
              help="Print a JSON array instead of a table.")
@click.pass_context
def inspect(ctx: click.Context, task: str | None, key_glob: str | None,
            states: tuple[str, ...], limit: int | None, as_json: bool) -> None:
    """List open windows, sorted by deadline.

    JSON fields: task, key, task_id, state, first_seen, deadline, max_wait_at
    (epoch seconds), calls, shard, error, forced_by_max_wait.
    """
    app: Any = ctx.obj.app
    try:
        windows = list_windows(app, states=states or None, task=task, key_glob=key_glob,
                               limit=limit)
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps([w.as_json() for w in windows], indent=2))
    else:
        click.echo(render_table(windows, time.time()))
