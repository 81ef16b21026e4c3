"""``celery -A proj debounce top``: a live view of debouncing, in the spirit of ``htop``.

Each refresh reads a :class:`~celery_debounce.admin.Snapshot` of the store with one
pipeline per shard (:func:`~celery_debounce.admin.read_snapshot`): counts of the due,
lease, active and quarantine sets (``ZCARD``/``ZCOUNT``, O(log N)), the front of the
due set, the ``<tag>:stats`` counters (calls in, counted by ``gate.lua`` as each call
arrives; runs and their calls, counted by ``take.lua``), ``<tag>:hot`` (at most 100
entries), ``<tag>:dispatchers``, the dispatchers' heartbeats and ``<tag>:held`` (its
size and the longest held; only when some are held, a second round trip reads the run
each one waits for). Per-task open windows come from a :class:`Census` that reads a
bounded slice (one ``census.lua`` step, about 1,000 windows per shard) each refresh, so
a refresh costs about the same with 10 or 1,000,000 open windows (docs/monitoring.md
has the measured figures). Rates and the last minute's lateness come from differences
between the snapshots that ``top`` keeps itself (:class:`History`): Redis stores only
running totals.

The screen is drawn with the standard library's :mod:`curses` (the ``top`` extra
only brings ``windows-curses`` on Windows); when stdout is not a terminal, or with
``--plain``, the same lines are printed as a block every refresh.
"""

from __future__ import annotations

import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import click
from celery.bin.base import CeleryCommand, CeleryOption

from .admin import COMMANDS_PER_SHARD, Held, Snapshot, TaskStats, read_snapshot
from .errors import DebounceError
from .formatting import clip, config_error, printable, relative, table_lines
from .layout import split_ident
from .store import WindowStore, store_for

#: Hottest keys shown. Each refresh reads all of ``<tag>:hot`` (at most HOT_KEYS_KEPT
#: entries per shard), so a key's calls in the last minute are a plain difference.
HOT_SHOWN = 8
#: How far back the per-minute figures (lateness, coalescing, forced) look.
MINUTE_S = 60.0
#: How far back calls/s and runs/s look (short enough to follow a burst).
RATE_S = 10.0
_SPARK = "▁▂▃▄▅▆▇█"
_SPARK_ASCII = "_.-=+*#@"  # where the output cannot encode the blocks


#: Pending windows one refresh's census step reads per shard (``census.lua``, a ZSCAN
#: COUNT hint): per-task open windows cost a bounded slice per refresh.
CENSUS_STEP = 1000


@dataclass
class Census:
    """Per-task open windows, counted a slice at a time: each refresh runs one
    ``census.lua`` step per shard (about :data:`CENSUS_STEP` windows); when every
    shard's scan came back to its start the counts of that pass are published. Up to
    ~1,000 windows per shard a pass takes one refresh; a million take ~1,000."""

    cursors: dict[int, str] = field(default_factory=dict)
    partial: dict[str, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)
    open: dict[str, int] | None = None  # the last complete pass
    at: float | None = None  # when it completed (Redis clock, s)
    passes: int = 0

    def step(self, store: WindowStore, now_ms: int) -> None:
        shards = store.settings.shards
        for shard in range(shards):
            if shard in self.done:
                continue
            cursor, rows = store.census_step(shard, self.cursors.get(shard, "0"),
                                             CENSUS_STEP, now_ms)
            for row in rows:
                self.partial[row.task] = self.partial.get(row.task, 0) + row.open
            if cursor == "0":
                self.done.add(shard)
                self.cursors.pop(shard, None)
            else:
                self.cursors[shard] = cursor
        if len(self.done) >= shards:
            self.open, self.at, self.passes = self.partial, now_ms / 1000, self.passes + 1
            self.partial, self.done = {}, set()


@dataclass
class Rates:
    """Figures computed from two snapshots."""

    seconds: float
    calls: int
    runs: int
    forced: int
    cancelled: int
    lateness_buckets: list[int]
    calls_in: int = 0  # calls the gate accepted (i|<task>), counted as they came

    def per_s(self, value: int) -> float:
        return value / self.seconds if self.seconds > 0 else 0.0

    @property
    def ratio(self) -> float | None:
        return self.calls / self.runs if self.runs else None

    def lateness_ms(self, quantile: float) -> float | None:
        return TaskStats(task="", lateness_buckets=self.lateness_buckets).lateness_ms(quantile)


def _diff(new: TaskStats, old: TaskStats | None, seconds: float) -> Rates:
    """Counter differences; one shard's counters may expire or reset on their own, so
    a counter that went back counts as 0 rather than as a negative rate."""
    if old is None:
        old = TaskStats(task=new.task)

    def up(a: int, b: int) -> int:
        return max(0, a - b)

    return Rates(seconds, up(new.calls, old.calls), up(new.runs, old.runs),
                 up(new.forced, old.forced), up(new.cancelled, old.cancelled),
                 [up(a, b) for a, b in zip(new.lateness_buckets, old.lateness_buckets,
                                           strict=True)],
                 up(new.calls_in, old.calls_in))


@dataclass
class History:
    """The snapshots of the last minute; Redis keeps only running totals."""

    keep_s: float = MINUTE_S
    snapshots: deque[Snapshot] = field(default_factory=deque)

    def add(self, snap: Snapshot) -> None:
        if self.snapshots and self._went_back(self.snapshots[-1], snap):
            self.snapshots.clear()  # counters reset (stats --reset, or expired): start over
        self.snapshots.append(snap)
        while len(self.snapshots) > 2 and snap.at - self.snapshots[1].at >= self.keep_s:
            self.snapshots.popleft()

    @staticmethod
    def _went_back(old: Snapshot, new: Snapshot) -> bool:
        a, b = old.total, new.total
        return (b.runs < a.runs or b.calls < a.calls or b.calls_in < a.calls_in
                or sum(b.lateness_buckets) < sum(a.lateness_buckets))

    def since(self, seconds: float) -> Snapshot | None:
        """The oldest kept snapshot at most ``seconds`` older than the newest."""
        if len(self.snapshots) < 2:
            return None
        newest = self.snapshots[-1]
        for snap in self.snapshots:
            if newest.at - snap.at <= seconds + 0.5:
                return snap if snap is not newest else None
        return None

    def rates(self, seconds: float, task: str | None = None) -> Rates | None:
        old = self.since(seconds)
        if old is None:
            return None
        new = self.snapshots[-1]
        span = new.at - old.at
        if task is None:
            return _diff(new.total, old.total, span)
        row = new.tasks.get(task)
        return None if row is None else _diff(row, old.tasks.get(task), span)


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


def render(history: History, title: str, error: str | None = None,
           unicode: bool = True, census: Census | None = None) -> list[Line]:
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
    spark = sparkline([s.open for s in history.snapshots],
                      marks=_SPARK if unicode else _SPARK_ASCII)
    overdue = "-" if snap.oldest_due_s is None else f"{snap.oldest_due_s:.1f}s"
    lines.append(Line(f"open windows {snap.open:,}{trend}  {spark}"))
    lines.append(Line(f"due now {snap.due:,}   oldest overdue {overdue}   in flight "
                      f"{snap.leased + snap.active:,}   held {snap.held:,}   quarantined "
                      f"{snap.quarantined:,}"))
    fast = history.rates(RATE_S)
    slow = history.rates(MINUTE_S)
    if fast is None or slow is None:
        lines.append(Line("calls/s in -   runs/s out -   (rates after the second reading)"))
    else:
        ratio = "-" if slow.ratio is None else f"{slow.ratio:.1f}"
        share = f" ({100 * slow.forced / slow.runs:.0f}% of runs)" if slow.runs else ""
        lines.append(Line(f"calls/s in {_num(fast.per_s(fast.calls_in))}   runs/s out "
                          f"{_num(fast.per_s(fast.runs))}   coalescing {ratio} calls/run "
                          f"(last {slow.seconds:.0f}s)"))
        lines.append(Line(f"forced by max wait {slow.forced:,}{share}   cancelled "
                          f"{slow.cancelled:,}   (last {slow.seconds:.0f}s)"))
        lines.append(Line(f"lateness p50 {_ms(slow.lateness_ms(0.5))}   p99 "
                          f"{_ms(slow.lateness_ms(0.99))}   over {sum(slow.lateness_buckets):,} "
                          f"runs (last {slow.seconds:.0f}s)"))
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
        rows.append((f"{task} {clip(key, 40)}", _ago(max(0.0, snap.at - held.since)), waits,
                     held.state or "ended"))
    out = _table(("HELD WINDOWS (task key)", "HELD SINCE", "WAITS FOR (run in progress)",
                  "ITS STATE"), rows)
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
        return [Line("No calls or windows recorded yet (counters expire an hour after the "
                     "last one).")]
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
        rows.append((printable(name), open_now, _num(fast.per_s(fast.calls_in)),
                     _num(fast.per_s(fast.runs)), ratio, str(slow.forced), late,
                     str(row.runs)))
    out = _table(("TASK", "OPEN", "CALLS/s IN", "RUNS/s OUT", "CALLS/RUN 1m", "FORCED 1m",
                  "LATE p50/p99 1m", "RUNS TOTAL"), rows)
    if census is not None and census.at is not None and census.at < snap.at - 1:
        out.append(Line(f"(OPEN as counted by a census pass {_ago(snap.at - census.at)}; "
                        f"it reads {CENSUS_STEP:,} windows per shard a refresh)"))
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
    """"alive", "silent 40s" (no heartbeat for over 3 x HEARTBEAT_S: killed, hung or cut
    off), "stopped 2m ago" (a clean stop), or "-" (no heartbeat: an older version)."""
    from .dispatcher import HEARTBEAT_S

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

    rows = [(printable(name), dispatcher_status(snap, name),
             _ago(snap.at - snap.dispatchers[name]) if name in snap.dispatchers else "-")
            for name in sorted(names, key=order)]
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
    sections = [line.text.split("  ")[0].rstrip(":") for line in hidden
                if line.heading and line.text]
    what = f" ({', '.join(sections)})" if sections else ""
    return [*shown, Line(f"-- {len(hidden)} more line(s){what} do not fit: enlarge the "
                         "terminal, or use --plain --", heading=True)]


class Top:
    """Reads snapshots and renders them; the screen and the printout drive it."""

    def __init__(self, app: Any, interval: float, screen: bool = False) -> None:
        self.store = store_for(app)
        self.interval = interval
        self.history = History()
        self.census = Census()
        self.error: str | None = None
        settings = self.store.settings
        self.title = (f"celery debounce top - prefix {settings.key_prefix!r}, "
                      f"{settings.shards} shard(s), every {interval:g}s"
                      + (" - q quits" if screen else ""))

    def refresh(self, unicode: bool = True) -> list[Line]:
        try:
            snap = read_snapshot(self.store)
            self.history.add(snap)
            self.census.step(self.store, int(snap.at * 1000))
            self.error = None
        except DebounceError as exc:
            self.error = str(exc)
        stamp = time.strftime("%H:%M:%S")
        return render(self.history, f"{self.title}   {stamp}", self.error, unicode, self.census)


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
        tasks.append({
            "task": name, "open": None if counted is None else counted.get(name, 0),
            "calls_in_per_s": None if rate is None else rate.per_s(rate.calls_in),
            "runs_per_s": None if rate is None else rate.per_s(rate.runs),
            "runs_total": row.runs, "calls_in_total": row.calls_in})
    names = set(snap.dispatchers) | set(snap.alive) | set(snap.stopped)
    return {
        "at": snap.at, "open": snap.open, "due": snap.due, "oldest_due_s": snap.oldest_due_s,
        "in_flight": snap.leased + snap.active, "quarantined": snap.quarantined,
        "held": snap.held,
        "held_windows": [{"ident": h.ident, "held_since": h.since, "waits_for": h.waits_for,
                          "waits_for_state": h.state} for h in snap.held_windows],
        "calls_in_per_s": None if fast is None else fast.per_s(fast.calls_in),
        "runs_per_s": None if fast is None else fast.per_s(fast.runs),
        "open_counted_at": None if census is None else census.at,
        "tasks": tasks,
        "dispatchers": [{"name": name, "status": dispatcher_status(snap, name).split(" ")[0],
                         "last_batch_at": snap.dispatchers.get(name),
                         "heartbeat_at": snap.alive.get(name),
                         "stopped_at": snap.stopped.get(name)} for name in sorted(names)],
    }


def run_json(top: Top, out: TextIO, iterations: int | None,
             sleep: Callable[[float], None] = time.sleep) -> None:
    """``top -j``: one JSON object per line and refresh (a failed reading is
    ``{"error": ...}``)."""
    import json

    for index in _count(iterations):
        if index:
            sleep(top.interval)
        top.refresh()
        if top.error or not top.history.snapshots:
            line: dict[str, Any] = {"error": top.error}
        else:
            line = as_json(top.history, top.census)
        out.write(json.dumps(line) + "\n")
        out.flush()


def run_plain(top: Top, out: TextIO, iterations: int | None, sleep: Callable[[float], None]
              = time.sleep) -> None:
    """The non-terminal printout: one block per refresh, separated by a blank line."""
    unicode = can_encode(out)
    for index in _count(iterations):
        if index:
            sleep(top.interval)
            out.write("\n")
        out.write("\n".join(line.text for line in top.refresh(unicode)) + "\n")
        out.flush()


def _count(iterations: int | None) -> Iterator[int]:
    index = 0
    while iterations is None or index < iterations:
        yield index
        index += 1


def run_screen(top: Top, iterations: int | None) -> None:
    """The live view: redraw every ``interval``; ``q`` (or Ctrl-C) quits."""
    import curses

    def main(screen: Any) -> None:
        try:
            curses.curs_set(0)
        except curses.error:  # some terminals cannot hide the cursor
            pass
        screen.timeout(100)
        unicode = can_encode(screen)
        for _ in _count(iterations):
            lines = top.refresh(unicode)
            screen.erase()
            height, width = screen.getmaxyx()
            for row, line in enumerate(fit(lines, height)):
                attr = curses.A_BOLD if line.heading else curses.A_NORMAL
                try:
                    screen.addnstr(row, 0, line.text, width - 1, attr)
                except curses.error:
                    pass
            screen.refresh()
            next_at = time.monotonic() + top.interval
            while time.monotonic() < next_at:
                key = screen.getch()
                if key in (ord("q"), ord("Q")):
                    return

    curses.wrapper(main)


def _stop_on_sigterm() -> None:
    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@click.command(name="top", cls=CeleryCommand)
@click.option("-i", "--interval", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              cls=CeleryOption, help_group="Output", help="Seconds between refreshes.")
@click.option("-n", "--iterations", type=click.IntRange(min=1), default=None, cls=CeleryOption,
              help_group="Output", help="Stop after this many refreshes (default: until q).")
@click.option("--plain", is_flag=True, cls=CeleryOption, help_group="Output",
              help="Print a block of text every refresh instead of the full-screen view "
                   "(the default when stdout is not a terminal).")
@click.option("-j", "--json", "as_json_lines", is_flag=True, cls=CeleryOption,
              help_group="Output", help="Print one JSON object per refresh, one a line.")
@click.pass_context
def top(ctx: click.Context, interval: float, iterations: int | None, plain: bool,
        as_json_lines: bool) -> None:
    """Live view: open windows and their trend, calls/s in and runs/s out,
    calls per run, windows forced by max wait, lateness p50/p99 over the last
    minute, open windows per task, the hottest keys, dispatchers (alive, silent
    or stopped) and when each last took a batch, quarantined windows. Quit with
    q or Ctrl-C. Sections a short terminal cannot show are named on the last row.

    Calls in are counted by the gate as each call arrives; runs out as
    dispatchers take windows.

    Redis errors are shown in the view, which keeps retrying; with
    --iterations the exit status is 1 when the last reading failed.

    Each refresh costs one pipeline of 11 cheap commands per shard and one
    census step per shard (at most ~1,000 windows read), whatever the number
    of open windows.
    """
    screen = not plain and not as_json_lines and sys.stdout.isatty()
    try:
        view = Top(ctx.obj.app, interval, screen)
    except DebounceError as exc:
        raise config_error(exc, ctx.obj.app) from exc
    _stop_on_sigterm()
    try:
        if as_json_lines:
            run_json(view, sys.stdout, iterations)
        elif not screen:
            run_plain(view, sys.stdout, iterations)
        else:
            run_screen(view, iterations)
    except KeyboardInterrupt:
        return
    if view.error:  # --iterations ended on a failed reading: say so in the exit status
        raise click.ClickException(view.error)


__all__ = ["COMMANDS_PER_SHARD", "Census", "Held", "History", "Snapshot", "Top", "fit",
           "read_snapshot", "render", "top"]
