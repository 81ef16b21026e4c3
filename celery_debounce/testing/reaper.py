"""A throwaway server never outlives the process that started it.

A test process can end without its cleanup: pytest-timeout's thread method ends it with
``os._exit``, a runner kills it. The server it started would run on, or, frozen by a
test (``SIGSTOP``), stay stopped for good. :func:`reap_with_parent` starts a small
watcher beside the server: it reads a pipe that only the starting process holds open, and
when that process is gone (the pipe's end-of-file) it continues the server and its
children, stops them (then kills them) and removes the server's directory.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

__all__ = ["Reaper", "Watched", "reap_with_parent"]

#: $0: the server's pid; $1: the signal that stops it; $2: its directory.
#: Children are found before the stop (the postmaster's, frozen by a test), and every
#: process is continued first: a stopped process keeps its pending signals.
_SCRIPT = """\
read -r _
pids="$0 $(pgrep -P "$0" | tr '\\n' ' ')"
kill -CONT $pids 2>/dev/null
kill -"$1" "$0" 2>/dev/null
i=0
while kill -0 "$0" 2>/dev/null && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill -KILL $pids 2>/dev/null
rm -rf "$2"
"""


class Reaper:
    """The watcher of one server (:func:`reap_with_parent`)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def dismiss(self) -> None:
        """The server is stopped by its owner: end the watcher without it acting."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        if self.process.stdin is not None:
            self.process.stdin.close()


def reap_with_parent(pid: int, directory: Path | str, stop: int = signal.SIGTERM) -> Reaper:
    """Watch the server ``pid``: once this process is gone, ``stop`` it (continued first,
    killed with its children after 10 s) and remove ``directory``."""
    process = subprocess.Popen(
        ["sh", "-c", _SCRIPT, str(pid), str(int(stop)), str(directory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C of the tests' process group leaves it be
    )
    return Reaper(process)


class Watched:
    """A throwaway server: each run of its process has a :class:`Reaper`."""

    _reaper: Reaper | None = None

    def _watch(self, pid: int, directory: Path | str, stop: int = signal.SIGTERM) -> None:
        """Watch this run's process ``pid`` (a run that ended without :meth:`_unwatch`
        has its watcher dismissed)."""
        self._unwatch()
        self._reaper = reap_with_parent(pid, directory, stop)

    def _unwatch(self) -> None:
        """The owner stops the server: its watcher goes without acting."""
        if self._reaper is not None:
            self._reaper.dismiss()
            self._reaper = None
