"""A single node (or Sentinel's master): :class:`NodeTransport`, its direct ``EVALSHA``
path, one kept connection per thread (:class:`_Lease`) and the combiner of concurrent
gate calls (:class:`_Combiner`)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import NoScriptError
from redis.sentinel import SentinelConnectionPool

from ...errors import DebounceBackendError, DebounceOutcomeUnknown
from ...redact import redact
from ...settings import Settings
from .server import _PooledCommands
from .translate import _lost, _refused_by_a_replica, _translated, translate_errors
from .transport import (
    LINK_ERRORS,
    Transport,
    _checkout_args,
    _reply_or_error,
    checkout,
    cut_runs_nothing,
)

if TYPE_CHECKING:  # pragma: no cover
    from .operators import Operators


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

#: The stdlib's socket and thread-local classes, as this module found them (None: gevent
#: or eventlet had patched them already). A call that finds either one replaced (patched
#: after import too) runs as greenlets do: no kept connection, no combiner (see
#: NodeTransport._evalsha_once).
_STD_SOCKET: Any = socket.socket if socket.socket.__module__ == "socket" else None
_STD_LOCAL: Any = threading.local if threading.local.__module__ == "_thread" else None


def _forked() -> None:  # in a forked child only the forking thread runs: none holds one
    global _holders_lock
    _holders_lock = threading.RLock()
    _Lease.holders = 0


os.register_at_fork(after_in_child=_forked)


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
    """A lone call's command could not be written (a reset part-way): it did not run."""


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
    may have run; nothing is sent again). A write that fails part-way never sent its
    last bytes, so a lone call did not run: reset, it is sent once more on a fresh
    connection; timed out, it is reported unreachable (sent again it would wait as
    long). A failed write of a larger batch, reset or timed out, makes every call of it
    an unknown outcome: its first calls may have reached Redis complete
    (:func:`~celery_debounce.store.redis.transport.cut_runs_nothing`).
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
                        "awaited; the outcome is unknown"
                    )
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
        """One call's command, nobody else's: as ``NodeTransport._evalsha_once`` sends it."""
        conn = self.lease.checkout()
        try:
            conn.send_packed_command([command])
        except redis.TimeoutError:
            conn.disconnect()
            raise  # cut part-way, so it did not run: unreachable, not sent again
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
                [batch[0].command if len(batch) == 1 else b"".join(s.command for s in batch)]
            )
        except LINK_ERRORS as exc:  # a timeout too: redis-py's is no ConnectionError
            conn.disconnect()
            for slot in batch:  # a lone call did not run; a batch's first ones may have
                slot.error = (
                    _lost(name, exc, cut=True)
                    if len(batch) > 1
                    else exc
                    if isinstance(exc, redis.TimeoutError)
                    else _NotSent()
                )
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


#: Pools whose connections :class:`NodeTransport` may use directly.
_DIRECT_POOLS = (redis.ConnectionPool, SentinelConnectionPool)


def is_direct_node(client: Any) -> bool:
    """redis-py's own client with its own pool (not fakeredis, or a single-connection
    client). Sentinel's pool qualifies: its connections find the master when they
    connect, turn a demoted master's READONLY into a ConnectionError (the command did
    not run: it is sent again) and are dropped on release once the master moved
    (docs/design.md, "Sentinel")."""
    return (
        type(client) is redis.Redis
        and type(client.connection_pool) in _DIRECT_POOLS
        and client.connection is None
    )


class NodeTransport(Transport):
    """redis-py's client of a single node or of Sentinel's master.

    Sent twice: only what :meth:`run` sends (scripts a repeat cannot change, and
    plain commands, through the client's ``Retry(..., 1)``). :meth:`run_once`,
    :meth:`pipeline_once` and :meth:`send_on_node` write a command again only when
    it did not run: a write of it alone reset part-way, NOSCRIPT, or a demoted
    master's READONLY; a reply lost after the write, or a failed write of several
    commands (the first ones may be complete), is
    :class:`~celery_debounce.DebounceOutcomeUnknown`. A write of one command that
    timed out is unreachable (it did not run) and not sent again.
    """

    direct = True

    def __init__(self, client: Any, settings: Settings) -> None:
        super().__init__(client, settings)
        pool = self.client.connection_pool
        self._lease: _Lease | None = _Lease(pool) if _Lease.suits(pool) else None
        # concurrent gate calls share round trips (needs hiredis' packer: one bytes each)
        self._combiner: _Combiner | None = (
            _Combiner(self._lease)
            if (
                self._lease is not None
                and _hiredis_pack is not None
                and not self._lease.pool.connection_kwargs.get("command_packer")
            )
            else None
        )

    def servers(self) -> list[tuple[str, Any]]:
        # on a pooled connection without redis-py's retry (as _evalsha_once): a server
        # that never answers costs one timeout
        return [(redact(self.settings.redis_url), _PooledCommands(self))]

    def flush_many(
        self, store: Operators, shard: int, windows: Sequence[tuple[str, str]]
    ) -> list[Any]:
        """``flush.lua``'s reply for each ``(ident, task id)``, in one pipeline."""
        calls = [store._flush_call(shard, ident, task_id) for ident, task_id in windows]
        return self.pipeline_once("flush", calls)

    def run_once(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run a script that must not run twice (every script that writes windows but
        ``ack``): it is sent at most once.

        A command whose write was reset (a pooled connection the server closed) is
        sent once more on a fresh connection (a write cut part-way never runs: its last
        bytes never left); one that timed out while written is reported unreachable,
        not sent again; NOSCRIPT (it did not run) loads the script
        and sends it again; a connection lost or timed out while waiting for the reply
        raises :class:`~celery_debounce.DebounceOutcomeUnknown` (it may have run). This
        is every call's hot path: one EVALSHA on a pooled connection, without redis-py's
        per-command wrapper (retry closure, operation metrics: about a fifth of a call),
        which would also send the command again after a lost reply.
        """
        script = self.scripts[name]
        try:
            try:
                return self._evalsha_once(name, script.sha, len(keys), *keys, *args)
            except NoScriptError:  # server restarted or SCRIPT FLUSH: it did not run
                script.sha = self.client.script_load(script.script)
                return self._evalsha_once(name, script.sha, len(keys), *keys, *args)
        except redis.RedisError as exc:
            raise _translated(name, exc) from exc

    def _evalsha_once(self, name: str, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        """``EVALSHA`` on a pooled connection of a single node, sent at most once.

        On a plain ``redis.ConnectionPool`` each thread keeps the connection it checked
        out (:class:`_Lease`) instead of taking it from the pool's locked list and
        giving it back on every call; it is checked as the pool checks a connection
        it hands out (connected, nothing unread: else reconnected), so a connection
        the server closed is replaced before anything is sent.
        """
        lease = self._lease
        attempts: tuple[int, ...] = (1, 2)
        if socket.socket is not _STD_SOCKET or threading.local is not _STD_LOCAL:
            # gevent or eventlet patched, maybe after import: greenlets of one thread
            # would share its kept connection; the pool's checkout is theirs alone
            lease = None
        elif self._combiner is not None and name == "gate" and _Lease.holders > 1:
            try:
                reply = self._combiner.call(
                    name, _hiredis_pack(("EVALSHA", sha, numkeys, *keys_and_args))
                )
            except _NotSent:
                attempts = (2,)  # nothing reached Redis: once more, alone, on a fresh one
            else:
                return None if reply is _NIL else reply
        for attempt in attempts:
            if lease is not None:
                conn: Any = lease.checkout()
                pool = None
            else:
                pool = self.client.connection_pool
                conn = checkout(pool)  # one made before patching is made anew
            try:
                try:
                    conn.send_packed_command(_pack(conn, ("EVALSHA", sha, numkeys, *keys_and_args)))
                except LINK_ERRORS as exc:
                    # cut part-way, so it did not run: reset, once more on a fresh
                    # connection; timed out, unreachable (again it would wait as long)
                    conn.disconnect()
                    if attempt == 2 or isinstance(exc, redis.TimeoutError):
                        raise
                    continue
                try:
                    return conn.read_response()
                except (redis.ResponseError, redis.exceptions.BusyLoadingError):
                    raise  # an error reply (LOADING too): it did not run
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    conn.disconnect()  # the reply may still come: never reuse
                    if _refused_by_a_replica(exc) and attempt == 1:
                        continue  # READONLY: it did not run; the pool finds the master
                    raise _lost(name, exc) from exc
                except BaseException:  # interrupted: the reply may still come
                    conn.disconnect()
                    raise
            finally:
                if pool is not None:
                    pool.release(conn)
        raise DebounceBackendError(f"debounce Redis: {name} could not be sent")  # unreachable

    def pipeline_once(self, name: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """Script ``name`` once per ``(keys, args)`` in one write on one pooled connection
        of a single node, each sent at most once (like :meth:`run_once`): the calls that
        met NOSCRIPT (they did not run) are sent again once the script is loaded; a
        lost reply raises :class:`~celery_debounce.DebounceOutcomeUnknown`. An error
        reply of one call is raised after every reply was read. A write that fails
        part-way (reset or timed out) of several calls is an unknown outcome too (the
        first ones may be complete); of one call alone, unreachable (it did not run)."""
        script = self.scripts[name]
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        pool = self.client.connection_pool
        with translate_errors(name):
            for _ in (1, 2):
                conn: Any = checkout(pool)
                wire = [
                    ("EVALSHA", script.sha, len(calls[i][0]), *calls[i][0], *calls[i][1])
                    for i in todo
                ]
                written = False
                try:
                    conn.send_packed_command(conn.pack_commands(wire))
                    written = True
                    for k, i in enumerate(todo):
                        replies[i] = _reply_or_error(conn)
                        if isinstance(replies[i], redis.exceptions.BusyLoadingError):
                            for j in todo[k:]:  # refused too (redis-py closed the connection)
                                replies[j] = replies[i]
                            break
                except LINK_ERRORS as exc:
                    conn.disconnect()
                    if (
                        not written
                        and len(todo) == len(calls)
                        and cut_runs_nothing(wire)
                        and isinstance(exc, redis.RedisError)
                    ):
                        raise  # one call, cut part-way, nothing before it: it did not run
                    raise _lost(name, exc, cut=not written) from exc
                except BaseException:
                    conn.disconnect()
                    raise
                finally:
                    pool.release(conn)
                todo = [i for i in todo if isinstance(replies[i], NoScriptError)]
                if not todo:
                    break
                script.sha = self.client.script_load(script.script)
            error = next((r for r in replies if isinstance(r, redis.RedisError)), None)
            if error is not None:
                raise error
        return replies
