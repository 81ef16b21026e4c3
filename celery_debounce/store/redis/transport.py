"""How the store's commands reach Redis: a transport, chosen once from the settings
(:func:`celery_debounce.store.redis.connect.transport_for`).

Three implementations, one per kind of client:

* :class:`Transport` (here): any other client (fakeredis, a client the caller built,
  a single-connection client): every command goes through the client and its own
  retry policy;
* :class:`~celery_debounce.store.redis.node.NodeTransport`: redis-py's client of one node,
  or of Sentinel's master: scripts that must not run twice are one ``EVALSHA`` on a
  pooled connection, without redis-py's per-command wrapper (the hot path);
* :class:`~celery_debounce.store.redis.cluster.ClusterTransport`: a Redis Cluster: each
  command goes to the master of its key's slot, following redirections.

The store asks its transport, never which one it is: only ``cluster.py`` knows it
runs on a cluster. Each docstring says which calls may be sent twice.
"""

from __future__ import annotations

import inspect
import logging
import os
import socket
import ssl
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.exceptions import NoScriptError
from redis.retry import Retry

from ...errors import DebounceBackendError
from ...redact import redact
from ...settings import Settings
from .scripts import SCRIPT_NAMES, script_source
from .sentinel import master_switches
from .translate import _lost, _refused_by_a_replica, _translated

if TYPE_CHECKING:  # pragma: no cover
    from ...producer.call import PreparedCall
    from .bulk import BulkGate
    from .operators import Operators

logger = logging.getLogger("celery_debounce.store")


def _checkout_args() -> tuple[str, ...]:
    """redis-py < 5.3 requires a command name for ``get_connection``; later ones warn."""
    name = inspect.signature(redis.ConnectionPool.get_connection).parameters.get("command_name")
    return ("EVALSHA",) if name is not None and name.default is inspect.Parameter.empty else ()


#: What ``pool.get_connection`` is given (read once).
CHECKOUT_ARGS = _checkout_args()

#: The stdlib's socket class (None: gevent or eventlet had patched it before this import).
STD_SOCKET: Any = socket.socket if socket.socket.__module__ == "socket" else None


def made_before_patching(conn: Any) -> bool:
    """True when gevent or eventlet patched ``socket`` after this import and ``conn``
    still holds a stdlib socket (TLS too): its reads would block every greenlet."""
    return (
        STD_SOCKET is not None
        and socket.socket is not STD_SOCKET
        and isinstance(conn._sock, STD_SOCKET)
    )


def _drop_unpatched_ssl_contexts() -> None:
    """Forget the TLS contexts redis-py (8.2+) shares between connections that were
    built before gevent or eventlet patched ``ssl``: a socket wrapped by one after the
    patching fails (``TypeError`` in ``SSLSocket._create``), so the connect below builds
    a new one."""
    import redis.utils

    shared = getattr(redis.utils, "_SHARED_SSL_CONTEXTS", None)
    lock = getattr(redis.utils, "_SHARED_SSL_CONTEXTS_LOCK", None)
    if shared is None or lock is None:  # redis-py before 8.2 builds one per connect
        return
    with lock:
        for key, context in list(shared.items()):
            if type(context) is not ssl.SSLContext:
                shared.pop(key, None)


def checkout(pool: Any) -> Any:
    """``pool.get_connection``, connected on a patched socket if it was made before the
    patching; a refused or timed-out connect raises as the pool's does (nothing sent)."""
    conn = pool.get_connection(*CHECKOUT_ARGS)
    if made_before_patching(conn):
        _drop_unpatched_ssl_contexts()
        try:
            conn.disconnect()
            conn.connect()
        except BaseException:
            pool.release(conn)
            raise
    return conn


def _reply_or_error(conn: Any) -> Any:
    """The next reply on ``conn``; an error reply as the exception (not raised). A link
    error (reset, timeout) is raised: the caller counts every reply not read as lost."""
    try:
        return conn.read_response()
    except (redis.ResponseError, redis.exceptions.BusyLoadingError) as exc:  # LOADING: a reply
        return exc


#: A link that failed part-way through a write or a read: a reset, a timeout (redis-py's
#: is a ``redis.TimeoutError``, not a ``ConnectionError``), or the OS's own error.
LINK_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError, OSError)


def _name(command: Sequence[Any]) -> str:
    first = command[0] if command else b""
    return (first.decode() if isinstance(first, bytes) else str(first)).upper()


def cut_runs_nothing(wire: Sequence[Sequence[Any]]) -> bool:
    """True when a write of ``wire`` that failed part-way (a reset or a timeout) ran
    nothing, so saying "unreachable" (or sending it again) is safe.

    Redis runs a command only once all its bytes arrived. A write that failed never
    sent its last bytes (redis-py closes the connection with them unsent), so the
    wire's last command never runs; but whatever the kernel took before, any number of
    complete commands, may still reach Redis, even after a timeout (a stopped server
    reads them when it resumes). So nothing ran only when the last command is the one
    that changes anything: a lone command, one after ``ASKING``, or the ``EXEC`` of
    the ``MULTI`` the wire opens (the queued commands run only at ``EXEC``). A script
    then ``WAIT``, or several scripts, may have run in part: their outcome is unknown.
    """
    names = [_name(command) for command in wire]
    while names and names[0] == "ASKING":
        names.pop(0)
    if len(names) <= 1:
        return True
    return (
        names[0] == "MULTI"
        and names[-1] == "EXEC"
        and not {"MULTI", "EXEC", "DISCARD"} & set(names[1:-1])
    )


class RenewalLink:
    """The renewer's own connection to one node: built from the node's pool settings
    but without redis-py's retry, which would connect, or wait for a reply, twice
    before failing (a renewal is retried by the renewer, promptly, within the lease).
    Not taken from the pool: runs that exhaust it cannot delay a renewal. One per
    transport and process (a forked child builds its own); renewals come from one
    thread, the lock only guards against a second caller."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: Any = None
        self.pool: Any = None
        self.pid = 0

    def send(self, pool: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write, read every reply; raise the first error reply
        (NOSCRIPT included), or the connection's error (the connection is dropped)."""
        if self.pid != os.getpid():  # a forked child: the parent's lock (it may have been
            # held by the parent's renewal thread) and connection are not its own
            self.lock, self.conn, self.pid = threading.Lock(), None, os.getpid()
        with self.lock:
            conn = self._connection(pool)
            try:
                if conn._sock is not None and conn.can_read():  # closed by the server
                    conn.disconnect()
                if conn._sock is None:  # connect() (Sentinel's finds the master), not
                    conn.connect()  # the plain connect a send would make
                conn.send_packed_command(conn.pack_commands(commands))
                replies = [_reply_or_error(conn) for _ in commands]
            except BaseException:
                conn.disconnect()  # a reply may still come: never reuse
                raise
        error = next((r for r in replies if isinstance(r, Exception)), None)
        if error is not None:
            raise error
        return replies

    def _connection(self, pool: Any) -> Any:
        if self.conn is None or self.pool is not pool:
            if self.conn is not None:
                self.conn.disconnect()
            kwargs = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}
            self.conn, self.pool = pool.connection_class(**kwargs), pool
        return self.conn


class Route:
    """Where :meth:`Transport.send_on_node` sends one write, and what it sends ahead of
    it: here on the pool serving its key, nothing ahead, and an error reply is the
    caller's. A transport whose server redirects a write gives a route of its own
    (:meth:`Transport.route`) that follows the redirections (``cluster.py``)."""

    def __init__(self, transport: Transport, key: str) -> None:
        self.transport = transport
        self.key = key
        #: commands sent in the same write before the caller's (their replies dropped)
        self.ahead: list[tuple[Any, ...]] = []
        #: the write goes to another node than the one serving the key: a connect that
        #: timed out there is not tried again
        self.elsewhere = False

    def pool(self) -> Any:
        """The connection pool the next attempt writes on."""
        return self.transport.pool_for(self.key)

    def follow(self, error: Exception) -> bool:
        """After the write's first error reply ``error``: True to send the write again
        (a redirection: nothing ran; :meth:`pool` says where), False to hand the replies
        on. Nothing is followed here."""
        return False


class Transport:
    """Any client redis-py's API covers that is not redis-py's own client of one node
    or a cluster (fakeredis, a single-connection client, a client of the caller's).

    Sent twice: any command redis-py's retry (or the client's own policy) repeats
    after a lost reply, scripts of :meth:`run_once` included (``run_once`` is
    :meth:`run` here). :meth:`send_on_node` resends only while nothing ran.
    """

    #: Commands may be sent on pooled connections directly (node and cluster).
    direct = False
    #: Scripts publish wake-ups with SPUBLISH to ``<tag>:wake`` (one channel per shard).
    sharded_wake = False

    def __init__(self, client: Any, settings: Settings) -> None:
        self.client: Any = client
        self.settings = settings
        self.scripts: dict[str, Script] = {
            name: self.client.register_script(script_source(name, self.sharded_wake))
            for name in SCRIPT_NAMES
        }

    def run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` (its raw reply); redis-py errors leave translated.

        Only for scripts a repeat cannot change (``list``, ``find``, ``census``, ``ack``,
        ``release``): after a lost reply redis-py's retry may send them again. A script
        that must not run twice goes through :meth:`run_once`.
        """
        script = self.scripts[name]
        try:  # plain try rather than translate_errors
            try:
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:  # server restarted or SCRIPT FLUSH: load and run again
                script.sha = self.client.script_load(script.script)
                return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.RedisError as exc:
            raise _translated(name, exc) from exc

    def run_once(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """A script that must not run twice: on this client, as :meth:`run` (its own
        policy decides what a lost reply does)."""
        return self.run(name, keys, args)

    def pool_for(self, key: str) -> Any:
        """The connection pool serving ``key``."""
        return self.client.connection_pool

    def refresh_topology(self) -> None:
        """Read the topology again (after a failover or resharding): nothing to read."""

    def route(self, key: str) -> Route:
        """Where :meth:`send_on_node` sends a write for ``key`` (per call: a route may
        keep what redirections said)."""
        return Route(self, key)

    @property
    def master_switches(self) -> int:
        """Master switches Sentinel announced since this client was built (0 without it)."""
        return master_switches(getattr(self.client, "connection_pool", None))

    def servers(self) -> list[tuple[str, Any]]:
        """``(where, client)`` of each server holding windows (its version is read)."""
        return [(redact(self.settings.redis_url), self.client)]

    def masters(self) -> list[Any]:
        """A client of each master holding windows (its configuration is read)."""
        return [self.client]

    def renew(self, sha: str, held: dict[str, list[str]], lease: int) -> None:
        """``renew.lua`` for each claims key of ``held``: one round trip, tried once.

        On redis-py's own client (``direct``) it goes on a connection of its own without
        redis-py's retry (:class:`RenewalLink`): a failed attempt costs at most one
        timeout, and the renewer tries again at once, within the lease. Any other client
        sends one pipeline, with its own retry policy. A renewal may be sent twice
        (renew.lua only moves the expiry of claims still in the set)."""
        if self.direct:
            link = self.__dict__.get("_renewal")
            if link is None:
                link = self.__dict__.setdefault("_renewal", RenewalLink())
            link.send(
                self.pool_for(next(iter(held))),
                [("EVALSHA", sha, 1, key, lease, *ids) for key, ids in held.items()],
            )
            return
        with self.client.pipeline(transaction=False) as pipe:
            for key, ids in held.items():
                pipe.evalsha(sha, 1, key, lease, *ids)
            pipe.execute()

    def flush_many(
        self, store: Operators, shard: int, windows: Sequence[tuple[str, str]]
    ) -> list[Any]:
        """``flush.lua``'s reply for each ``(ident, task id)``, one call at a time."""
        return [store.run_once("flush", *store._flush_call(shard, *w)) for w in windows]

    def gate_many(
        self,
        store: BulkGate,
        calls: Sequence[PreparedCall],
        chunk_size: int,
        on_chunk: Any,
        outcomes: list[Any],
        missing: list[int],
    ) -> None:
        """The bulk chunks of ``enqueue_many``, pipelined on one connection."""
        store._gate_many_pipelined(calls, chunk_size, on_chunk, outcomes, missing)

    def send_on_node(
        self,
        key: str,
        commands: list[tuple[Any, ...]],
        script: str = "",
        operation: str = "",
    ) -> list[Any]:
        """Send ``commands`` (the first an EVALSHA of ``script`` when given) in one write
        on one connection of the node serving ``key``; return their replies (error
        replies of later commands as exceptions, for the caller to read).

        Resent only while nothing ran: a redirection the transport's :class:`Route`
        follows (the command, or a queued one and so the whole MULTI, was refused),
        NOSCRIPT of the first command, or a write reset part-way of a wire that then
        ran nothing (:func:`cut_runs_nothing`: one command, or one ``MULTI``/``EXEC``).
        Such a write that timed out raises ``redis.TimeoutError`` (it did not run; sent
        again it would wait as long). A write of more (a script then ``WAIT``) that
        failed, or a connection lost or timed out after sending, raises
        :class:`~celery_debounce.DebounceOutcomeUnknown` (nothing is sent twice).
        """
        route = self.route(key)
        for attempt in range(8):
            pool = route.pool()
            try:
                conn: Any = checkout(pool)
            except LINK_ERRORS as exc:
                # refused, or timed out connecting (a dead master the slot table still
                # names): nothing was sent; read the slot table again, so a promoted
                # replica is found (after a timeout, only if the table moved)
                self.refresh_topology()
                if attempt >= 2 or (
                    isinstance(exc, redis.TimeoutError)
                    and (route.elsewhere or self.pool_for(key) is pool)
                ):
                    raise
                continue
            ahead = route.ahead
            wire = [*ahead, *commands] if ahead else commands
            try:
                try:
                    conn.send_packed_command(conn.pack_commands(wire))
                except LINK_ERRORS as exc:
                    conn.disconnect()
                    self.refresh_topology()
                    if not cut_runs_nothing(wire):  # its first commands may have run
                        raise _lost(operation or script or commands[0][0], exc, cut=True) from exc
                    if attempt >= 2 or isinstance(exc, redis.TimeoutError):
                        raise
                    continue  # nothing ran: safe to send again
                replies = self._replies(conn, wire, operation or script or commands[0][0], attempt)
            finally:
                pool.release(conn)
            if replies is None:  # READONLY (Sentinel): nothing ran
                continue  # the pool asks the sentinels for the master again
            if ahead:
                replies = replies[len(ahead) :]
            error = next((r for r in replies if isinstance(r, Exception)), None)
            if error is None:
                return replies
            if route.follow(error):
                continue  # redirected: nothing ran
            if error is replies[0]:
                if isinstance(error, NoScriptError) and script:
                    sha = self.client.script_load(self.scripts[script].script)
                    self.scripts[script].sha = sha
                    commands = [(commands[0][0], sha, *commands[0][2:]), *commands[1:]]
                    continue
                raise error
            return replies
        raise DebounceBackendError("debounce Redis: too many redirections")

    def _replies(
        self, conn: Any, wire: list[tuple[Any, ...]], what: str, attempt: int
    ) -> list[Any] | None:
        """One reply per command of ``wire`` read on ``conn`` (error replies as
        exceptions). None: the first was refused by a replica (a Sentinel demotion,
        nothing ran: send again). A link lost part-way: ``DebounceOutcomeUnknown``."""
        replies: list[Any] = []
        for _ in wire:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as exc:
                replies.append(exc)
            except redis.exceptions.BusyLoadingError as exc:
                # a loading server refuses every command (redis-py has closed the
                # connection): the rest were refused too
                replies.extend([exc] * (len(wire) - len(replies)))
                break
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                conn.disconnect()  # the replies may still come: never reuse
                self.refresh_topology()
                if not replies and _refused_by_a_replica(exc) and attempt < 2:
                    return None
                raise _lost(what, exc) from exc
            except BaseException:
                conn.disconnect()
                raise
        return replies
