"""``top``'s rendering: the lines of one refresh (the screen and the plain printout
draw the same), cut to a screen, and one refresh as JSON (``top -j``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from ..store.idents import split_ident
from .admin import Snapshot, TaskStats
from .formatting import clip, printable, relative, table_lines
from .top_history import CENSUS_STEP, MINUTE_S, RATE_S, Census, History

#: Hottest keys shown. Each refresh reads all of ``<tag>:hot`` (at most HOT_KEYS_KEPT
#: entries per shard), so a key's calls in the last minute are a plain difference.
HOT_SHOWN = 8
_SPARK = "▁▂▃▄▅▆▇█"
_SPARK_ASCII = "_.-=+*#@"  # where the output cannot encode the blocks


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return ">30s" if value == float("inf") else f"<={value:g}ms"


def _num(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _ago(seconds: float) -> str:

    return relative(-max(0.0, seconds))


def sparkline(values: Sequence[int], width: int = 20, marks: str = _SPARK) -> str:
    """Bars (unicode blocks) scaled between the minimum and maximum of ``values``."""
    values = list(values)[-width:]
    if not values:
        return ""
    low, high = min(values), max(values)
    if high == low:
        return marks[0] * len(values)
    scale = (len(marks) - 1) / (high - low)
    return "".join(marks[round((v - low) * scale)] for v in values)


def can_encode(out: TextIO, text: str = _SPARK) -> bool:
    try:
        text.encode(getattr(out, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


@dataclass(frozen=True)
class Line:
    text: str
    heading: bool = False


def render(
    history: History,
    title: str,
    error: str | None = None,
    unicode: bool = True,
    census: Census | None = None,
) -> list[Line]:
    """The lines of one refresh (the same for the screen and the plain printout).

    Calls in are the gate's own counter (``i|<task>``, one per call as it arrives);
    runs out and calls per run count windows as dispatchers take them."""
    lines = [Line(title, heading=True)]
    if error:
        lines.append(Line(f"!! {error} (retrying)"))
    if not history.snapshots:
        lines.append(Line("waiting for the first reading..."))
        return lines
    snap = history.snapshots[-1]
    minute = history.since(MINUTE_S)
    trend = ""
    if minute is not None:
        trend = f" ({snap.open - minute.open:+,} in {snap.at - minute.at:.0f}s)"
    spark = sparkline(
        [s.open for s in history.snapshots], marks=_SPARK if unicode else _SPARK_ASCII
    )
    overdue = "-" if snap.oldest_due_s is None else f"{snap.oldest_due_s:.1f}s"
    lines.append(Line(f"open windows {snap.open:,}{trend}  {spark}"))
    lines.append(
        Line(
            f"due now {snap.due:,}   oldest overdue {overdue}   in flight "
            f"{snap.leased + snap.active:,}   held {snap.held:,}   quarantined "
            f"{snap.quarantined:,}"
        )
    )
    fast = history.rates(RATE_S)
    slow = history.rates(MINUTE_S)
    if fast is None or slow is None:
        lines.append(Line("calls/s in -   runs/s out -   (rates after the second reading)"))
    else:
        ratio = "-" if slow.ratio is None else f"{slow.ratio:.1f}"
        share = f" ({100 * slow.forced / slow.runs:.0f}% of runs)" if slow.runs else ""
        lines.append(
            Line(
                f"calls/s in {_num(fast.per_s(fast.calls_in))}   runs/s out "
                f"{_num(fast.per_s(fast.runs))}   coalescing {ratio} calls/run "
                f"(last {slow.seconds:.0f}s)"
            )
        )
        lines.append(
            Line(
                f"forced by max wait {slow.forced:,}{share}   cancelled "
                f"{slow.cancelled:,}   (last {slow.seconds:.0f}s)"
            )
        )
        lines.append(
            Line(
                f"lateness p50 {_ms(slow.lateness_ms(0.5))}   p99 "
                f"{_ms(slow.lateness_ms(0.99))}   over {sum(slow.lateness_buckets):,} "
                f"runs (last {slow.seconds:.0f}s)"
            )
        )
    lines.append(Line(""))
    lines.extend(_task_lines(history, census))
    lines.append(Line(""))
    lines.extend(_hot_lines(history))
    if snap.held:
        lines.append(Line(""))
        lines.extend(_held_lines(snap))
    lines.append(Line(""))
    lines.extend(_dispatcher_lines(snap))
    return lines


def _held_lines(snap: Snapshot) -> list[Line]:
    """The windows held longest (debounce_exclusive) and the run each one waits for."""
    rows = []
    for held in snap.held_windows:
        try:
            task, key = split_ident(held.ident)
        except ValueError:
            task, key = "?", held.ident
        waits = "-" if held.waits_for is None else clip(held.waits_for, 36)
        rows.append(
            (
                f"{task} {clip(key, 40)}",
                _ago(max(0.0, snap.at - held.since)),
                waits,
                held.state or "ended",
            )
        )
    out = _table(
        ("HELD WINDOWS (task key)", "HELD SINCE", "WAITS FOR (run in progress)", "ITS STATE"), rows
    )
    if snap.held > len(rows):
        out.append(Line(f"(and {snap.held - len(rows):,} more held)"))
    return out


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[Line]:
    """Aligned by terminal cells (a CJK or emoji character takes two)."""
    first, *rest = table_lines(header, rows)
    return [Line(first, True), *(Line(text) for text in rest)]


def _task_lines(history: History, census: Census | None = None) -> list[Line]:

    snap = history.snapshots[-1]
    counted = census.open if census is not None else None
    names = set(snap.tasks) | set(counted or {})
    if not names:
        return [
            Line("No calls or windows recorded yet (counters expire an hour after the last one).")
        ]
    rows = []
    for name in sorted(names):
        open_now = "-" if counted is None else f"{counted.get(name, 0):,}"
        row = snap.tasks.get(name, TaskStats(task=name))
        fast, slow = history.rates(RATE_S, name), history.rates(MINUTE_S, name)
        if fast is None or slow is None:
            rows.append((printable(name), open_now, "-", "-", "-", "-", "-", str(row.runs)))
            continue
        ratio = "-" if slow.ratio is None else f"{slow.ratio:.1f}"
        late = f"{_ms(slow.lateness_ms(0.5))}/{_ms(slow.lateness_ms(0.99))}"
        rows.append(
            (
                printable(name),
                open_now,
                _num(fast.per_s(fast.calls_in)),
                _num(fast.per_s(fast.runs)),
                ratio,
                str(slow.forced),
                late,
                str(row.runs),
            )
        )
    out = _table(
        (
            "TASK",
            "OPEN",
            "CALLS/s IN",
            "RUNS/s OUT",
            "CALLS/RUN 1m",
            "FORCED 1m",
            "LATE p50/p99 1m",
            "RUNS TOTAL",
        ),
        rows,
    )
    if census is not None and census.at is not None and census.at < snap.at - 1:
        out.append(
            Line(
                f"(OPEN as counted by a census pass {_ago(snap.at - census.at)}; "
                f"it reads {CENSUS_STEP:,} windows per shard a refresh)"
            )
        )
    elif census is not None and census.open is None:
        out.append(Line("(OPEN: the first census pass is still counting)"))
    return out


def _hot_lines(history: History) -> list[Line]:
    snap = history.snapshots[-1]
    if not snap.hot:
        return [Line("HOTTEST KEYS: none yet", True)]
    old = history.since(MINUTE_S)
    rows = []
    for ident, calls in sorted(snap.hot.items(), key=lambda kv: -kv[1])[:HOT_SHOWN]:
        try:
            task, key = split_ident(ident)
        except ValueError:
            task, key = "?", ident
        key = clip(key, 40)
        # a key absent a minute ago had no calls then (or had been trimmed out: approximate)
        recent = "-" if old is None else f"{max(0, calls - old.hot.get(ident, 0)):,}"
        rows.append((f"{task} {key}", f"{calls:,}", recent))
    return _table(("HOTTEST KEYS (task key)", "CALLS ABSORBED", "LAST 1m"), rows)


def dispatcher_status(snap: Snapshot, name: str) -> str:
    """ "alive", "silent 40s" (no heartbeat for over 3 x HEARTBEAT_S: killed, hung or cut
    off), "stopped 2m ago" (a clean stop), or "-" (no heartbeat: an older version)."""
    from ..dispatch.dispatcher import HEARTBEAT_S

    beat, stop = snap.alive.get(name), snap.stopped.get(name)
    if stop is not None and (beat is None or stop >= beat):
        return f"stopped {_ago(snap.at - stop)}"
    if beat is None:
        return "-"
    age = snap.at - beat
    return "alive" if age <= 3 * HEARTBEAT_S else f"silent {_ago(age)}"


def _dispatcher_lines(snap: Snapshot) -> list[Line]:

    names = set(snap.dispatchers) | set(snap.alive) | set(snap.stopped)
    if not names:
        return [Line("DISPATCHERS: none seen in the last hour", True)]

    def order(name: str) -> tuple[bool, float]:
        status = dispatcher_status(snap, name)
        return (status != "alive", -snap.dispatchers.get(name, 0.0))

    rows = [
        (
            printable(name),
            dispatcher_status(snap, name),
            _ago(snap.at - snap.dispatchers[name]) if name in snap.dispatchers else "-",
        )
        for name in sorted(names, key=order)
    ]
    return _table(("DISPATCHER", "STATUS", "LAST BATCH"), rows)


def fit(lines: list[Line], height: int) -> list[Line]:
    """``lines`` cut to a screen of ``height`` rows; what is cut is announced on the
    last row (the sections it holds), never dropped silently."""
    room = height - 1  # curses cannot write the bottom-right cell
    if len(lines) <= room:
        return lines
    if room < 1:
        return []
    shown, hidden = lines[: room - 1], lines[room - 1 :]
    sections = [
        line.text.split("  ")[0].rstrip(":") for line in hidden if line.heading and line.text
    ]
    what = f" ({', '.join(sections)})" if sections else ""
    return [
        *shown,
        Line(
            f"-- {len(hidden)} more line(s){what} do not fit: enlarge the "
            "terminal, or use --plain --",
            heading=True,
        ),
    ]


def as_json(history: History, census: Census | None = None) -> dict[str, Any]:
    """One refresh as a JSON object (``top -j``): what the screen shows, rates per
    second over the last 10 s (null before the second reading), per task and per
    dispatcher."""
    snap = history.snapshots[-1]
    fast = history.rates(RATE_S)
    counted = census.open if census is not None else None
    tasks = []
    for name in sorted(set(snap.tasks) | set(counted or {})):
        rate = history.rates(RATE_S, name)
        row = snap.tasks.get(name, TaskStats(task=name))
        tasks.append(
            {
                "task": name,
                "open": None if counted is None else counted.get(name, 0),
                "calls_in_per_s": None if rate is None else rate.per_s(rate.calls_in),
                "runs_per_s": None if rate is None else rate.per_s(rate.runs),
                "runs_total": row.runs,
                "calls_in_total": row.calls_in,
            }
        )
    names = set(snap.dispatchers) | set(snap.alive) | set(snap.stopped)
    return {
        "at": snap.at,
        "open": snap.open,
        "due": snap.due,
        "oldest_due_s": snap.oldest_due_s,
        "in_flight": snap.leased + snap.active,
        "quarantined": snap.quarantined,
        "held": snap.held,
        "held_windows": [
            {
                "ident": h.ident,
                "held_since": h.since,
                "waits_for": h.waits_for,
                "waits_for_state": h.state,
            }
            for h in snap.held_windows
        ],
        "calls_in_per_s": None if fast is None else fast.per_s(fast.calls_in),
        "runs_per_s": None if fast is None else fast.per_s(fast.runs),
        "open_counted_at": None if census is None else census.at,
        "tasks": tasks,
        "dispatchers": [
            {
                "name": name,
                "status": dispatcher_status(snap, name).split(" ")[0],
                "last_batch_at": snap.dispatchers.get(name),
                "heartbeat_at": snap.alive.get(name),
                "stopped_at": snap.stopped.get(name),
            }
            for name in sorted(names)
        ],
    }
