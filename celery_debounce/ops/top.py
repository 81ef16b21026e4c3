"""``celery -A proj debounce top``: a live view of debouncing, in the spirit of ``htop``.

Each refresh reads a :class:`~celery_debounce.ops.admin.Snapshot` of the store with one
pipeline per shard (:func:`~celery_debounce.ops.admin.read_snapshot`): counts of the due,
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
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import click
from celery.bin.base import CeleryCommand, CeleryOption

from ..errors import DebounceError
from ..store import store_for
from .admin import Held, Snapshot, read_snapshot
from .formatting import config_error
from .held_logs import held_logs
from .top_history import CENSUS_STEP, Census, History
from .top_render import Line, as_json, can_encode, fit, render


class Top:
    """Reads snapshots and renders them; the screen and the printout drive it."""

    def __init__(self, app: Any, interval: float, screen: bool = False) -> None:
        self.store = store_for(app)
        self.interval = interval
        self.history = History()
        self.census = Census()
        self.error: str | None = None
        settings = self.store.settings
        self.title = (
            f"celery debounce top - prefix {settings.key_prefix!r}, "
            f"{settings.shards} shard(s), every {interval:g}s" + (" - q quits" if screen else "")
        )

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


def run_json(
    top: Top, out: TextIO, iterations: int | None, sleep: Callable[[float], None] = time.sleep
) -> None:
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


def run_plain(
    top: Top, out: TextIO, iterations: int | None, sleep: Callable[[float], None] = time.sleep
) -> None:
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

    def main(screen: Any, held: deque[str]) -> None:
        try:
            curses.curs_set(0)
        except curses.error:  # some terminals cannot hide the cursor
            pass
        screen.timeout(100)
        unicode = can_encode(screen)
        for _ in _count(iterations):
            lines = top.refresh(unicode)
            if held:  # the last line logged meanwhile, in the view's last row
                lines = [*fit(lines, screen.getmaxyx()[0] - 1), Line(f"log: {held[-1]}")]
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

    with held_logs() as held:
        try:
            curses.wrapper(main, held)
        finally:
            for text in held:  # the screen is gone: where they can be read
                click.echo(text, err=True)


def _stop_on_sigterm() -> None:
    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


@click.command(name="top", cls=CeleryCommand)
@click.option(
    "-i",
    "--interval",
    type=click.FloatRange(min=0.2),
    default=1.0,
    show_default=True,
    cls=CeleryOption,
    help_group="Output",
    help="Seconds between refreshes.",
)
@click.option(
    "-n",
    "--iterations",
    type=click.IntRange(min=1),
    default=None,
    cls=CeleryOption,
    help_group="Output",
    help="Stop after this many refreshes (default: until q).",
)
@click.option(
    "--plain",
    is_flag=True,
    cls=CeleryOption,
    help_group="Output",
    help="Print a block of text every refresh instead of the full-screen view "
    "(the default when stdout is not a terminal).",
)
@click.option(
    "-j",
    "--json",
    "as_json_lines",
    is_flag=True,
    cls=CeleryOption,
    help_group="Output",
    help="Print one JSON object per refresh, one a line.",
)
@click.pass_context
def top(
    ctx: click.Context, interval: float, iterations: int | None, plain: bool, as_json_lines: bool
) -> None:
    """Live view: open windows and their trend, calls/s in and runs/s out,
    calls per run, windows forced by max wait, lateness p50/p99 over the last
    minute, open windows per task, the hottest keys, dispatchers (alive, silent
    or stopped) and when each last took a batch, quarantined windows. Quit with
    q or Ctrl-C. Sections a short terminal cannot show are named on the last row.

    Calls in are counted by the gate as each call arrives; runs out as
    dispatchers take windows.

    Redis errors are shown in the view, which keeps retrying; with
    --iterations the exit status is 1 when the last reading failed.

    Each refresh costs one store snapshot per shard (on Redis a pipeline of 13
    cheap commands) and one census step per shard (at most ~1,000 windows read), whatever the number
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


__all__ = [
    "CENSUS_STEP",
    "Census",
    "Held",
    "History",
    "Line",
    "Snapshot",
    "Top",
    "as_json",
    "fit",
    "read_snapshot",
    "render",
    "top",
]
