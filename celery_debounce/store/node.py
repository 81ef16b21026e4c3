"""A single node's direct ``EVALSHA`` path: one kept connection per thread
(:class:`_Lease`) and the combiner of concurrent gate calls (:class:`_Combiner`)."""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any

import redis

from ..errors import DebounceOutcomeUnknown
from .errors import _lost


class _Lease(threading.local):
    """One pooled connection per thread, kept across calls (the gate's hot path).

    Checked out from the pool once per thread and process; released to the pool when
    the thread ends. Each :meth:`checkout` checks it as ``ConnectionPool.get_connection``
    checks a connection it hands out: connected, and nothing waiting to be read (a
    connection the server closed reads as EOF: it is reconnected before use).
    """

    conn: Any = None
    held: _Held | None = None
    pid = 0
    #: threads of this process holding a kept connection (of any store): with one,
    #: its calls cannot meet another's, and the gate skips the combiner
    holders = 0

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    @staticmethod
    def suits(pool: Any) -> bool:
        """Only redis-py's plain pool, RESP2, without client-side caching (Sentinel's
        pool drops a demoted master's connections on release: it keeps the per-call
        checkout)."""
        if type(pool) is not redis.ConnectionPool or getattr(pool, "cache", None) is not None:
            return False
        # RESP2 only: no push messages (RESP3 maintenance notifications) can be waiting
        # on a kept connection, so "something to read" always means a dead or dirty one
        return str(pool.connection_kwargs.get("protocol") or 2) == "2"

    def checkout(self) -> Any:
        conn = self.conn
        if conn is None or self.pid != os.getpid():  # first call of a thread, or a fork
            conn = self.pool.get_connection(*_checkout_args())
            self.conn, self.pid = conn, os.getpid()
            self.held = _Held(self.pool, conn)
            return conn
        try:
            if conn._sock is None:
                conn.connect()
            if conn.can_read():
                raise redis.ConnectionError("Connection has data")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            conn.disconnect()
            conn.connect()
            if conn.can_read():
                raise redis.ConnectionError("Connection not ready") from None
        return conn


class _Held:
    """A thread's kept connection, given back to its pool when this is dropped: when
    the thread ends (its ``_Lease`` attributes go) or the store is dropped."""

    __slots__ = ("conn", "pid", "pool")

    def __init__(self, pool: Any, conn: Any) -> None:
        self.pool, self.conn, self.pid = pool, conn, os.getpid()
        with _holders_lock:
            _Lease.holders += 1

    def __del__(self) -> None:
        if self.pid != os.getpid():
            return  # a thread of the parent, dropped in a forked child
        with _holders_lock:
            _Lease.holders -= 1
        try:
            self.pool.release(self.conn)
        except Exception:  # noqa: S110 - at interpreter exit the pool may be half gone
            pass


#: reentrant: a collection may drop a _Held (and take it) while this thread holds it
_holders_lock = threading.RLock()


def _forked() -> None:  # in a forked child only the forking thread runs: none holds one
    global _holders_lock
    _holders_lock = threading.RLock()
    _Lease.holders = 0


os.register_at_fork(after_in_child=_forked)


def _checkout_args() -> tuple[str, ...]:
    """redis-py < 5.3 requires a command name for ``get_connection``; later ones warn."""
    name = inspect.signature(redis.ConnectionPool.get_connection).parameters.get(
        "command_name")
    return ("EVALSHA",) if name is not None and name.default is inspect.Parameter.empty else ()


_HiredisPacker: Any = getattr(redis.connection, "HiredisRespSerializer", None)
_hiredis_pack: Any = None
if _HiredisPacker is not None:
    try:
        from hiredis import pack_command as _hiredis_pack
    except ImportError:  # pragma: no cover - hiredis is optional
        pass


def _pack(conn: Any, command: tuple[Any, ...]) -> Any:
    """The command's bytes: hiredis' packer directly when redis-py packs with it
    (what ``conn.pack_command`` ends in, without its per-call argument scan; our
    arguments are str, bytes and int), else the connection's own packer."""
    if _hiredis_pack is not None and type(getattr(conn, "_command_packer", None)) is _HiredisPacker:
        return [_hiredis_pack(command)]
    return conn.pack_command(*command)


class _NotSent(Exception):
    """A lone call's command could not be written: nothing reached Redis."""


class _Slot:
    """One call in a :class:`_Combiner`: its command, then its reply or error."""

    __slots__ = ("command", "done", "error", "lead", "reply")

    def __init__(self, command: bytes, waits: bool) -> None:
        self.command = command
        self.reply: Any = None
        self.error: BaseException | None = None
        self.lead = False  # woken to send the next batch, not with a reply
        if waits:  # released when answered (or handed the next batch)
            self.done = threading.Lock()
            self.done.acquire()

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.reply


class _Combiner:
    """Gate calls made at the same time by threads of one process share round trips.

    A call that finds nobody sending sends its command alone. Calls arriving while a
    batch is in flight queue up; when it is answered, the first of them sends all
    that queued in one write on its own connection and reads their replies in order
    (auto-pipelining, as ioredis does). Each call gets its own reply or error: an
    error reply concerns only its call (it did not run); a connection lost while
    reading makes every call still unanswered :class:`DebounceOutcomeUnknown` (each
    may have run; nothing is sent again); a write that fails sends a lone call once
    more on a fresh connection, as before, but makes every call of a larger batch an
    unknown outcome (a part of the write may have reached Redis).
    """

    def __init__(self, lease: _Lease) -> None:
        self.lease = lease
        self.lock = threading.Lock()
        self.waiting: list[_Slot] = []
        self.busy = False

    def call(self, name: str, command: bytes) -> Any:
        lock = self.lock
        lock.acquire()
        if not self.busy:  # nobody is sending: this call goes alone, at once
            self.busy = True
            lock.release()
            try:
                return self._send_alone(name, command)
            finally:
                self._hand_over()
        try:
            slot = _Slot(command, True)
            self.waiting.append(slot)
        finally:
            lock.release()
        try:
            slot.done.acquire()  # answered, or handed the next batch
        except BaseException:  # interrupted while queued (a signal in the main thread)
            self._abandon(slot)
            raise
        if not slot.lead:
            return slot.result()
        with lock:
            batch, self.waiting = self.waiting, []
        try:
            self._send(name, batch)
        finally:
            for other in batch:
                if other.reply is None and other.error is None:  # interrupted
                    other.error = DebounceOutcomeUnknown(
                        f"debounce Redis: {name} interrupted while its reply was "
                        "awaited; the outcome is unknown")
            for other in batch:
                if other is not slot:
                    other.done.release()
            self._hand_over()
        return slot.result()

    def _hand_over(self) -> None:
        """After a batch: the first queued call sends the next one, or nobody is sending."""
        with self.lock:
            successor = self.waiting[0] if self.waiting else None
            if successor is None:
                self.busy = False
                return
            successor.lead = True  # under the lock: see _abandon
        successor.done.release()

    def _send_alone(self, name: str, command: bytes) -> Any:
        """One call's command, nobody else's: as ``WindowStore._evalsha_once`` sends it."""
        conn = self.lease.checkout()
        try:
            conn.send_packed_command([command])
        except (redis.ConnectionError, OSError):
            conn.disconnect()
            raise _NotSent() from None
        try:
            reply = conn.read_response()
        except (redis.ResponseError, redis.exceptions.BusyLoadingError):
            raise  # an error reply (LOADING too): it did not run
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            conn.disconnect()  # the reply may still come: never reuse
            raise _lost(name, exc) from exc
        except BaseException:  # interrupted: the reply may still come
            conn.disconnect()
            raise
        return _NIL if reply is None else reply

    def _abandon(self, slot: _Slot) -> None:
        """A queued call left before its turn: it is never sent; if it was handed the
        next batch, the batch goes to the next queued call (or nobody is sending)."""
        with self.lock:
            if slot not in self.waiting:
                return  # in flight or answered: its reply is dropped
            self.waiting.remove(slot)
            if slot.lead:
                successor = self.waiting[0] if self.waiting else None
                if successor is None:
                    self.busy = False
                else:
                    successor.lead = True
                    successor.done.release()

    def _send(self, name: str, batch: list[_Slot]) -> None:
        try:
            conn = self.lease.checkout()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            for slot in batch:  # no connection: nothing was sent
                slot.error = exc
            return
        try:
            conn.send_packed_command(
                [batch[0].command if len(batch) == 1 else b"".join(s.command for s in batch)])
        except (redis.ConnectionError, OSError) as exc:
            conn.disconnect()
            for slot in batch:
                slot.error = _NotSent() if len(batch) == 1 else _lost(name, exc)
            return
        for i, slot in enumerate(batch):
            try:
                slot.reply = conn.read_response()
            except redis.exceptions.BusyLoadingError as exc:
                for rest in batch[i:]:  # a loading server refused them all
                    rest.error = exc
                return
            except redis.ResponseError as exc:
                slot.error = exc  # an error reply: this call did not run
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                conn.disconnect()  # the replies may still come: never reuse
                for rest in batch[i:]:
                    rest.error = _lost(name, exc)
                return
            except BaseException:
                conn.disconnect()
                raise
            if slot.reply is None:
                slot.reply = _NIL


#: A nil reply, told apart from "not answered yet" in a :class:`_Slot`.
_NIL: Any = object()

