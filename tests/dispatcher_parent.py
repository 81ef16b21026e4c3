"""A small stand-in for a worker's main process, driving ``DispatcherProcess`` directly
(tests/dispatch/test_dispatcher_process.py): cheaper than a ``celery worker`` per trial.

    python dispatcher_parent.py REDIS_URL [POSTGRES_URL]   (the windows in PostgreSQL if given)

reads commands on stdin, one a line, and forks a "worker" for each (its own process
group, so that the test finds its dispatcher child after the worker is gone):

    spawn NAME STALL_MS [HOLD]  start DispatcherProcess(NAME); print "FORKED NAME <worker> <child>"
                                and wait to be killed. The child first sleeps STALL_MS (a
                                slow start), or waits until the file HOLD exists
    thread NAME HOLD            start it from a thread; print "FORKED ..."; the thread ends
                                once the file HOLD exists (the test makes it after the
                                child's first heartbeat: its PR_SET_PDEATHSIG is set by then)
    race NAME                   start it, SIGKILL the child, call stop() while the supervisor
                                is forking its replacement; print "STOPPED <seconds>"

Heartbeats are written every 0.2 s (not 5 s), so that one that keeps going shows quickly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from celery import Celery

import celery_debounce.dispatch.dispatcher
import celery_debounce.dispatch.process as dp

celery_debounce.dispatch.dispatcher.HEARTBEAT_S = 0.2
STALL: float = 0.0
HOLD: Path | None = None
#: armed in a "race" worker: the supervisor's next fork waits here until stop() began
FORKING: threading.Event | None = None


def _child_start() -> None:
    """Runs first in every forked child: a slow start of the dispatcher child."""
    if HOLD is not None:
        deadline = time.monotonic() + 30
        while not HOLD.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
    elif STALL:
        time.sleep(STALL)


def _before_fork() -> None:
    if FORKING is not None:
        FORKING.set()
        time.sleep(0.5)  # stop() runs meanwhile, in the main thread


os.register_at_fork(before=_before_fork, after_in_child=_child_start)


def say(line: str) -> None:
    """One line in one write: the stand-in workers share this pipe, and print() may
    write the text and its newline apart, so two workers' lines could run together."""
    os.write(1, (line + "\n").encode())


def spawn(app: object, name: str, stall_ms: str, hold: str | None) -> None:
    global STALL, HOLD
    STALL, HOLD = int(stall_ms) / 1000, (Path(hold) if hold else None)
    process = dp.DispatcherProcess(app, name)  # type: ignore[arg-type]
    process.start()
    say(f"FORKED {name} {os.getpid()} {process.pid}")
    while True:
        time.sleep(60)


def from_thread(app: object, name: str, hold: str) -> None:
    process = dp.DispatcherProcess(app, name)  # type: ignore[arg-type]

    def starter() -> None:
        process.start()
        say(f"FORKED {name} {os.getpid()} {process.pid}")
        deadline = time.monotonic() + 30
        while not Path(hold).exists() and time.monotonic() < deadline:
            time.sleep(0.005)

    thread = threading.Thread(target=starter)
    thread.start()
    thread.join()
    while True:
        time.sleep(60)


def race(app: object, name: str) -> None:
    global FORKING
    dp.RESTART_BACKOFF_S = (0.05, 0.05)
    process = dp.DispatcherProcess(app, name, stop_timeout=5)  # type: ignore[arg-type]
    process.start()
    first = process.pid
    assert first is not None
    say(f"FORKED {name} {os.getpid()} {first}")
    FORKING = threading.Event()
    os.kill(first, signal.SIGKILL)
    assert FORKING.wait(10)
    began = time.monotonic()
    process.stop()
    say(f"STOPPED {time.monotonic() - began:.2f}")
    while True:
        time.sleep(60)


def main() -> None:
    url = sys.argv[1]
    store_url = sys.argv[2] if len(sys.argv) > 2 else None  # a postgresql:// URL
    app = Celery("dispatcher_parent", set_as_current=False)
    app.conf.update(
        broker_url=f"{url}/1",
        debounce_redis_url=f"{url}/0",
        debounce_poll_interval=0.2,
        debounce_redis_timeout=1,
        broker_connection_retry_on_startup=True,
    )
    if store_url:  # the windows (and the dispatchers' heartbeats) in PostgreSQL
        app.conf.update(debounce_store_url=store_url, debounce_redis_url=None)
    forked: list[int] = []
    for line in sys.stdin:
        words = line.split()
        while True:  # reap the workers the test killed
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        pid = os.fork()
        if pid:
            forked.append(pid)
            with contextlib.suppress(OSError):  # the child did it first
                os.setpgid(pid, pid)  # here too, so that the kill below finds its group
        else:
            os.setpgid(0, 0)
            try:
                if words[0] == "spawn":
                    spawn(app, words[1], words[2], words[3] if len(words) > 3 else None)
                elif words[0] == "thread":
                    from_thread(app, words[1], words[2])
                else:
                    race(app, words[1])
            finally:
                os._exit(1)
    for pid in forked:  # stdin closed: the test is over, leave nothing behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
