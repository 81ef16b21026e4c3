"""A fault-injection TCP proxy in front of a PostgreSQL server (the protocol is not
parsed: faults are matched on the bytes a client sends).

* ``drop_next(marker)``: the next client message containing ``marker`` (a function's
  name in the query text) is passed on, the server answers it, and the client's socket
  is closed instead of passing the reply back: the call ran, its reply is lost;
  With ``then_refuse``, every connection is refused from then on, as by ``refuse()``;
* ``refuse()``: every client connection is closed and new ones are closed at once,
  until ``disarm()``;
* ``pace(bytes_per_s)``: the server's replies reach the clients at that rate at most (a
  slow link), until ``pace(None)``;
* ``messages``: each protocol message the clients sent after their start-up, as its
  type byte and the first bytes of its body (a Parse's body opens with its statement's
  name), in the order each connection sent them.

Used by tests/store/postgres/test_postgres_store.py and the ``postgres`` harness of
tests/store/contract.
"""

from __future__ import annotations

import socket
import threading
import time

#: The protocol's Sync message: the end of an extended-protocol call's messages.
SYNC = b"S\x00\x00\x00\x04"


def _call_sent(data: bytes) -> bool:
    """``data`` (a call's bytes from its first message on) holds the whole call: a
    simple query's one ``Q`` message, or extended-protocol messages up to a Sync."""
    if data[:1] == b"Q" and len(data) >= 5:
        return len(data) >= 1 + int.from_bytes(data[1:5], "big")
    return SYNC in data


class PgProxy:
    def __init__(self, port: int) -> None:
        self.target_port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._marker: bytes | None = None
        self._then_refuse = False
        self._refusing = False
        self._sockets: list[socket.socket] = []
        self.messages: list[tuple[bytes, bytes]] = []
        self._pace: float | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_next(self, marker: bytes, then_refuse: bool = False) -> None:
        with self._lock:
            self._marker = marker
            self._then_refuse = then_refuse

    def pace(self, bytes_per_s: float | None) -> None:
        self._pace = bytes_per_s

    def refuse(self) -> None:
        with self._lock:
            self._refusing = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)

    def disarm(self) -> None:
        with self._lock:
            self._refusing = False
            self._marker = None

    def close(self) -> None:
        _close(self.listener)
        self.refuse()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                _close(client)
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                _close(client)
                continue
            with self._lock:
                # refuse() may have run since the check above: it closed only the
                # sockets it knew of
                refusing = self._refusing
                if not refusing:
                    self._sockets += [client, server]
            if refusing:
                _close(client)
                _close(server)
                continue
            dropping = threading.Event()  # this connection's reply is being dropped
            threading.Thread(
                target=self._pipe, args=(client, server, True, dropping), daemon=True
            ).start()
            threading.Thread(
                target=self._pipe, args=(server, client, False, dropping), daemon=True
            ).start()

    def _take(self, data: bytes) -> bool:
        with self._lock:
            if self._marker is not None and self._marker in data:
                self._marker = None
                if self._then_refuse:
                    self._refusing = True  # new connections: refused from now on
                return True
        return False

    def _pipe(
        self, source: socket.socket, sink: socket.socket, upstream: bool, dropping: threading.Event
    ) -> None:
        reader = _Messages(self.messages, self._lock) if upstream else None
        try:
            while data := source.recv(65536):
                if reader is not None:
                    reader.feed(data)
                if not upstream and dropping.is_set():
                    continue  # the reply to the dropped call: swallowed
                dropped = upstream and self._take(data)
                if dropped:
                    dropping.set()
                sink.sendall(data)
                pace = self._pace
                if pace and not upstream:
                    time.sleep(len(data) / pace)
                # a long call arrives in several reads: pass it on to its end
                sent = data
                while dropped and not _call_sent(sent):
                    data = source.recv(65536)
                    if not data:
                        break
                    sink.sendall(data)
                    sent += data
                if dropped:
                    time.sleep(0.3)  # the server runs it and answers
                    with self._lock:
                        refusing = self._refusing
                    if refusing:
                        self.refuse()  # and every other open connection closes
                    return
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


class _Messages:
    """The client's side of one connection, cut into messages: the untyped start-up
    ones (an SSL or GSS request, the start-up message) skipped, each typed one listed."""

    #: a start-up message's protocol version 3.0: typed messages follow it
    STARTUP = 196608

    def __init__(self, into: list[tuple[bytes, bytes]], lock: threading.Lock) -> None:
        self.into = into
        self.lock = lock
        self.buffer = b""
        self.started = False

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while True:
            if not self.started:
                if len(self.buffer) < 8:
                    return
                size = int.from_bytes(self.buffer[:4], "big")
                if len(self.buffer) < size:
                    return
                self.started = int.from_bytes(self.buffer[4:8], "big") == self.STARTUP
                self.buffer = self.buffer[size:]
                continue
            if len(self.buffer) < 5:
                return
            size = 1 + int.from_bytes(self.buffer[1:5], "big")
            if len(self.buffer) < size:
                return
            with self.lock:
                self.into.append((self.buffer[:1], self.buffer[5 : min(size, 69)]))
            self.buffer = self.buffer[size:]


def _close(sock: socket.socket) -> None:
    """Shut down first: a socket another thread is reading is closed only then."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
