"""Ends a PostgreSQL call the server never answers.

psycopg has no read timeout of its own, and a server that stopped (SIGSTOP, a frozen VM,
a hung host) still has its kernel acknowledge every byte and keepalive probe, so neither
TCP keepalives nor ``tcp_user_timeout`` end the wait: a call would wait forever. Each
call registers its connection with a deadline; one daemon thread per process shuts down
the socket of a call past it, so the call fails at once with a lost connection (an
outcome unknown for a write, the store unavailable for a read).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: How often the thread looks for calls past their deadline (seconds).
TICK = 0.1

_lock = threading.Lock()
_due: dict[int, tuple[float, Any]] = {}  # token -> (deadline, connection)
_tokens = itertools.count()
_state: dict[str, Any] = {"pid": None, "thread": None}


def _forked() -> None:  # the parent's thread is not in the child; its lock may be held
    global _lock
    _lock = threading.Lock()
    _due.clear()
    _state.update(pid=None, thread=None)


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
        _due[token] = (time.monotonic() + seconds, conn)
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
        with _lock:
            late = [token for token, (deadline, _) in _due.items() if deadline <= now]
            conns = [_due.pop(token)[1] for token in late]
        for conn in conns:
            _cut(conn)


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
