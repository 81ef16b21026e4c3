"""Ends a PostgreSQL call the server never answers.

psycopg has no read timeout of its own, and a server that stopped (SIGSTOP, a frozen VM,
a hung host) still has its kernel acknowledge every byte and keepalive probe, so neither
TCP keepalives nor ``tcp_user_timeout`` end the wait: a call would wait forever. Each
call registers its connection with a deadline; one daemon thread per process shuts down
the socket of a call past it, so the call fails at once with a lost connection (an
outcome unknown for a write, the store unavailable for a read).

Shutting the socket down alone would not end the server's side: a backend waiting for a
synchronous standby to confirm its commit waits on, holding its connection slot, while
the next call opens another. So a call past its deadline is first sent a cancel request
(which needs no connection slot; through PgBouncer, it reaches the linked server
connection), from one more daemon thread, so that a server that does not answer holds
up nothing; the socket is shut down :data:`CANCEL_GRACE` later if the call has not
ended by then. (Cancelled in its wait for a standby, a commit stays committed on the
primary: the server answers with a warning, and the call returns.)
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

#: How often the thread looks for calls past their deadline (seconds).
TICK = 0.1

#: How long a call past its deadline has to end once its cancel was sent (seconds),
#: before its socket is shut down.
CANCEL_GRACE = 0.5
#: How long one cancel request may take (seconds): a server that does not answer it
#: holds up the next ones no longer.
CANCEL_TIMEOUT = 2.0
#: How long the thread that sends cancel requests waits for one before it ends (s).
CANCEL_IDLE = 2.0
#: Cancel requests waiting to be sent at most (more are dropped: the server is not
#: answering the ones before them either).
MAX_CANCELS = 256

_lock = threading.Lock()
_due: dict[int, tuple[float, Any, bool]] = {}  # token -> (deadline, connection, cancelled)
_tokens = itertools.count()
_state: dict[str, Any] = {"pid": None, "thread": None, "canceller": None}
_cancels: queue.Queue[Any] = queue.Queue(MAX_CANCELS)


def _forked() -> None:  # the parent's threads are not in the child; its lock may be held
    global _lock, _cancels
    _lock = threading.Lock()
    _due.clear()
    _state.update(pid=None, thread=None, canceller=None)
    _cancels = queue.Queue(MAX_CANCELS)


os.register_at_fork(after_in_child=_forked)


@contextmanager
def guarded(conn: Any, seconds: float) -> Iterator[None]:
    """Run the block with ``conn``'s socket shut down if it lasts over ``seconds``."""
    token = next(_tokens)
    start = None
    with _lock:
        if _state["pid"] != os.getpid():
            start = threading.Thread(target=_watch, name="debounce-pg-watchdog", daemon=True)
            _state.update(pid=os.getpid(), thread=start)
        _due[token] = (time.monotonic() + seconds, conn, False)
    if start is not None:
        start.start()
    try:
        yield
    finally:
        with _lock:
            _due.pop(token, None)


def _watch() -> None:
    while True:
        time.sleep(TICK)
        now = time.monotonic()
        cancel, cut = [], []
        with _lock:
            for token, (deadline, conn, cancelled) in list(_due.items()):
                if deadline > now:
                    continue
                if cancelled:
                    cut.append(_due.pop(token)[1])
                else:
                    cancel.append(conn)
                    _due[token] = (now + CANCEL_GRACE, conn, True)
        for conn in cancel:
            _send_cancel(conn)
        for conn in cut:
            _cut(conn)


def _send_cancel(conn: Any) -> None:
    """Queue a cancel request for what ``conn``'s backend is doing (the thread that
    sends them started if it is not running)."""
    if not _CAN_CANCEL:
        return
    with _lock:
        try:
            _cancels.put_nowait(conn)
        except queue.Full:  # the server is not answering the ones before it either
            return
        if _state.get("canceller") is None:
            thread = threading.Thread(
                target=_cancel, args=(_cancels,), name="debounce-pg-cancel", daemon=True
            )
            _state["canceller"] = thread
            thread.start()


def _cancel(requests: queue.Queue[Any]) -> None:
    """Send each queued cancel request, one at a time, each given up after
    :data:`CANCEL_TIMEOUT`; end once none came for :data:`CANCEL_IDLE` (the next cut
    starts the thread again): nothing waits on at exit, under gevent either."""
    while True:
        try:
            conn = requests.get(timeout=CANCEL_IDLE)
        except queue.Empty:
            with _lock:
                if requests.empty():
                    _state["canceller"] = None
                    return
            continue
        try:
            conn.cancel_safe(timeout=CANCEL_TIMEOUT)
        except Exception:  # noqa: S110 - the server is gone: nothing left to cancel
            pass


def _can_cancel() -> bool:
    """libpq 17's cancel API, which waits without holding the GIL and gives up in time
    (psycopg 3.2 or later with libpq 17 or later, as the binary package ships): libpq's
    older cancel blocks the whole process until the server answers. Without it a cut
    cancels nothing on the server (docs/stores.md says which versions to use)."""
    capabilities = getattr(psycopg, "capabilities", None)
    return capabilities is not None and bool(capabilities.has_cancel_safe())


def _cut(conn: Any) -> None:
    """Shut the connection's socket down (both ways): its pending wait ends at once."""
    try:
        dup = socket.socket(fileno=os.dup(conn.pgconn.socket))
    except Exception:  # closed meanwhile: nothing to end
        return
    try:
        dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        dup.close()


_CAN_CANCEL = _can_cancel()
