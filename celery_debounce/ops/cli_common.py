"""What the ``celery debounce`` commands share: the admin (configuration errors with
the ``-A`` hint), ``-j/--json``, and the tables of ``inspect`` and ``stats``."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from celery.bin.base import CeleryOption

from ..errors import DebounceError
from .admin import LATE_BUCKETS_MS, DebounceAdmin, Stats, TaskStats
from .formatting import clip, config_error, printable, relative, table_lines
from .read_view import WindowInfo

_F = TypeVar("_F", bound=Callable[..., Any])


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """Aligned by terminal cells: a CJK or emoji key takes two per character."""
    return "\n".join(table_lines(header, rows))


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
        if w.held_since is not None:  # its due score is only the next look, not its run
            when = (
                f"after {clip(printable(w.waits_for), 36)} ends"
                if w.waits_for
                else "at the next dispatch (its key's run ended)"
            )
        if w.quiet_until is not None:  # a leading run whose quiet period still runs
            when += f", quiet period ends {relative(w.quiet_until - now)}"
        key = clip(printable(w.key), 40)
        state = w.state if w.edge is None else f"{w.state} ({w.edge})"
        if w.held_since is not None:  # debounce_exclusive: waits for a run of its key
            state = f"{state} (held)"
        rows.append(
            (
                printable(w.task),
                key,
                printable(w.task_id),
                state,
                str(w.calls),
                relative(w.first_seen - now),
                when,
            )
        )
    return _table(header, rows)


def _late(stats: TaskStats) -> str:
    """p50/p90/p99 of the lateness as the bucket bound that holds each: a run 6.4 s late
    shows as ``<=10000``, never as a figure it did not have."""
    values = [stats.lateness_ms(q) for q in (0.5, 0.9, 0.99)]
    if values[0] is None:
        return "-"
    last = LATE_BUCKETS_MS[-1]
    return "/".join(
        f">{last}" if v == float("inf") else f"<={v:g}" for v in values if v is not None
    )


def render_stats(stats: Stats) -> str:
    total = stats.total
    oldest = (
        relative(total.oldest_first_seen - stats.now)
        if total.oldest_first_seen is not None
        else "-"
    )
    lines = [
        f"open windows: {stats.open}   due now: {stats.due}   "
        f"oldest open: {oldest if stats.census else '(skipped: --quick)'}",
    ]
    if not stats.tasks:
        lines.append("No debounce activity recorded.")
        return "\n".join(lines)
    header = (
        "TASK",
        "OPEN",
        "DUE",
        "OLDEST",
        "WAITING CALLS",
        "CALLS IN",
        "RUNS",
        "CALLS",
        "CALLS/RUN",
        "FORCED",
        "CAPPED",
        "LEADING",
        "SUPPRESSED",
        "CANCELLED",
        "LATE ms p50/p90/p99",
    )
    rows = []
    for row in [*(stats.tasks[name] for name in sorted(stats.tasks)), total]:
        ratio = row.coalescing_ratio
        census = stats.census or row is total
        rows.append(
            (
                printable(row.task) if row is not total else "(all)",
                str(row.open) if census else "-",
                str(row.due) if census else "-",
                relative(row.oldest_first_seen - stats.now)
                if row.oldest_first_seen is not None
                else "-",
                str(row.calls_waiting) if stats.census else "-",
                str(row.calls_in),
                str(row.runs),
                str(row.calls),
                f"{ratio:.1f}" if ratio is not None else "-",
                str(row.forced),
                str(row.closed_by_cap),
                str(row.leading_runs),
                str(row.suppressed),
                str(row.cancelled),
                _late(row),
            )
        )
    lines.append(_table(header, rows))
    return "\n".join(lines)


def _admin(ctx: click.Context) -> DebounceAdmin:
    try:
        return DebounceAdmin(ctx.obj.app)
    except DebounceError as exc:
        raise config_error(exc, ctx.obj.app) from exc


def json_option(what: str) -> Callable[[_F], _F]:
    """``-j/--json``, as ``celery inspect -j``."""
    return click.option(
        "-j",
        "--json",
        "as_json",
        is_flag=True,
        cls=CeleryOption,
        help_group="Output",
        help=f"Print {what} instead of text.",
    )


def echo_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2))
