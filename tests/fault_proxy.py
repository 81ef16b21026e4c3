"""A fault-injection TCP proxy between a Redis client and a real redis-server.

It reads the client's commands (RESP arrays) one by one and passes them on, until a
fault is armed; the first command the fault's matcher accepts then gets the fault:

* ``drop``: the command is forwarded (inside ``MULTI``, through its ``EXEC``), then the
  client's connection is closed: the command ran, its reply is lost;
* ``stall``: forwarded the same way, but the connection stays open and no reply ever
  comes (the client's socket timeout fires);
* ``stall-write``: the server stops reading at the command (matched as soon as its first
  items arrived): the commands before it in the same write are forwarded (they run),
  the part of it read so far too, never its end (it never runs); the client's send
  buffer fills, so a write larger than the socket buffers (a few MB) times out;
* ``error``: the command is replaced with an ``EVAL`` that returns ``error`` as an error
  reply (``OOM ...``; ``error-readonly``, ``error-noperm``, ``error-loading``: READONLY,
  NOPERM, LOADING), so Redis answers it, in order, without running it;
* ``noscript``: the same with ``NOSCRIPT``: the client loads the script and sends it again.

``arm(..., every=True)`` keeps an error reply armed for every matching command (a broker
refusing every message) until ``disarm()``. ``refuse()`` closes every client connection
and refuses new ones until ``disarm()``. ``silence(seconds)`` swallows every byte, both
ways, for that long. ``fired`` counts the faults injected. Used by
tests/worker/test_at_most_once.py and tests/store/redis/test_maxmemory.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Command = list[bytes]
Matcher = Callable[[Command], bool]

OOM = b"OOM command not allowed when used memory > 'maxmemory' (injected)"
NOSCRIPT = b"NOSCRIPT No matching script. Please use EVAL. (injected)"
#: The error replies ``error-<name>`` injects (``error`` alone: OOM).
ERRORS = {
    "error": OOM,
    "error-readonly": b"READONLY You can't write against a read only replica. (injected)",
    "error-noperm": b"NOPERM this user has no permissions to run the 'evalsha' command",
    "error-loading": b"LOADING Redis is loading the dataset in memory (injected)",
}
FAULTS = ("drop", "stall", "stall-write", *ERRORS, "noscript", "refuse")
_ERROR_SCRIPT = b"return redis.error_reply(ARGV[1])"


def parse_command(buf: bytes, start: int) -> tuple[Command, int] | None:
    """One RESP array of bulk strings at ``buf[start:]``: (its items, the end), or None
    if it is not complete yet. Inline commands are taken as one line."""
    if start >= len(buf):
        return None
    if buf[start : start + 1] != b"*":
        end = buf.find(b"\r\n", start)
        return None if end < 0 else (buf[start:end].split(), end + 2)
    end = buf.find(b"\r\n", start)
    if end < 0:
        return None
    count = int(buf[start + 1 : end])
    pos = end + 2
    items: Command = []
    for _ in range(count):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            return None
        size = int(buf[pos + 1 : end])
        if len(buf) < end + 2 + size + 2:
            return None
        items.append(buf[end + 2 : end + 2 + size])
        pos = end + 2 + size + 2
    return items, pos


def parse_head(buf: bytes, start: int) -> Command:
    """The items already complete of the RESP array that starts at ``buf[start:]``."""
    items: Command = []
    end = buf.find(b"\r\n", start)
    if buf[start : start + 1] != b"*" or end < 0:
        return items
    pos = end + 2
    for _ in range(int(buf[start + 1 : end])):
        end = buf.find(b"\r\n", pos)
        if end < 0 or len(buf) < end + 2 + int(buf[pos + 1 : end]) + 2:
            break
        items.append(buf[end + 2 : end + 2 + int(buf[pos + 1 : end])])
        pos = end + 2 + len(items[-1]) + 2
    return items


def pack(*items: bytes) -> bytes:
    out = [b"*%d\r\n" % len(items)]
    for item in items:
        out.append(b"$%d\r\n%s\r\n" % (len(item), item))
    return b"".join(out)


def evalsha_of(sha: str) -> Matcher:
    """Matches an EVALSHA of this script."""
    wanted = sha.encode()
    return lambda cmd: len(cmd) > 1 and cmd[0].upper() == b"EVALSHA" and cmd[1] == wanted


def command(name: bytes) -> Matcher:
    return lambda cmd: bool(cmd) and cmd[0].upper() == name


class FaultProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._fault: str | None = None
        self._match: Matcher = lambda cmd: False
        self._error = OOM
        self._then_refuse = False
        self._every = False
        self._clients: list[socket.socket] = []
        self._stop = threading.Event()
        self.fired = 0
        self._silent_until = 0.0  # monotonic: silent until then (silence())
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    # -- control ---------------------------------------------------------------------
    def arm(
        self,
        fault: str,
        match: Matcher,
        error: bytes | None = None,
        then_refuse: bool = False,
        every: bool = False,
    ) -> None:
        """Inject ``fault`` into the next command ``match`` accepts (once); with
        ``then_refuse``, refuse every connection from then on (until :meth:`disarm`);
        with ``every`` (error replies only), into every such command until
        :meth:`disarm`."""
        assert fault in FAULTS and fault != "refuse", fault
        assert not every or fault.startswith("error"), fault
        if error is None:
            error = NOSCRIPT if fault == "noscript" else ERRORS.get(fault, OOM)
        with self._lock:
            self._fault, self._match, self._error = fault, match, error
            self._then_refuse, self._every = then_refuse, every

    def refuse(self) -> None:
        """Close every client connection and refuse new ones (until :meth:`disarm`)."""
        with self._lock:
            self._fault = "refuse"
            self.fired += 1
            listener, self._listener = self._listener, None
            clients, self._clients = self._clients, []
        if listener is not None:
            listener.close()
        for client in clients:
            _close(client)

    def silence(self, seconds: float) -> None:
        """Go silent for ``seconds`` (a link that swallows bytes): nothing is forwarded
        either way, nothing is closed, new connections are accepted and get nothing
        either. A client waiting for a reply meanwhile meets its socket timeout."""
        with self._lock:
            self._silent_until = time.monotonic() + seconds

    def _swallowed(self) -> bool:
        """True while silent: the bytes are dropped."""
        with self._lock:
            return time.monotonic() < self._silent_until

    def disarm(self) -> None:
        with self._lock:
            refusing = self._fault == "refuse"
            self._fault = None
            if refusing and self._listener is None:
                self._listener = _listen_again(self.port)
                self._accepting = threading.Thread(target=self._accept, daemon=True)
                self._accepting.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            listener, self._listener = self._listener, None
            clients, self._clients = self._clients, []
        if listener is not None:
            listener.close()
        for client in clients:
            _close(client)

    # -- plumbing --------------------------------------------------------------------
    def _take(self, cmd: Command) -> str | None:
        with self._lock:
            if self._fault is None or self._fault == "refuse" or not self._match(cmd):
                return None
            fault = self._fault
            if not self._every:
                self._fault = None
            self.fired += 1
            return fault

    def _stalls_write(self, head: Command) -> bool:
        """A ``stall-write`` taken by the first items of a command still arriving."""
        with self._lock:
            if self._fault != "stall-write" or not head or not self._match(head):
                return False
        return self._take(head) == "stall-write"

    def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if self._listener is not listener:
                    return
                continue
            except OSError:
                return
            with self._lock:
                self._clients.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            _close(client)
            return
        muted = threading.Event()

        def down() -> None:
            try:
                while data := upstream.recv(65536):
                    if not muted.is_set() and not self._swallowed():
                        client.sendall(data)
            except OSError:
                pass

        threading.Thread(target=down, daemon=True).start()
        buf = b""
        in_multi = False
        cut: str | None = None  # a drop or stall, waiting for the end of a MULTI
        try:
            while data := client.recv(65536):
                if self._swallowed():
                    continue
                buf += data
                out: list[bytes] = []
                pos = 0
                while (parsed := parse_command(buf, pos)) is not None:
                    cmd, end = parsed
                    raw = buf[pos:end]
                    pos = end
                    name = cmd[0].upper() if cmd else b""
                    fault = None if cut else self._take(cmd)
                    if fault == "stall-write":  # it stops reading before the end
                        out.append(raw[:-2])
                        cut = fault
                        break
                    if fault is not None and fault not in ("drop", "stall"):
                        raw = pack(b"EVAL", _ERROR_SCRIPT, b"0", self._error)
                    if name == b"MULTI":
                        in_multi = True
                    elif name in (b"EXEC", b"DISCARD"):
                        in_multi = False
                    out.append(raw)
                    if fault in ("drop", "stall"):
                        muted.set()  # before forwarding: no reply overtakes the cut
                        cut = fault
                    if cut and not in_multi:
                        break
                if not cut and self._stalls_write(parse_head(buf, pos)):
                    out.append(buf[pos:])  # what arrived of it (never its end)
                    pos, cut = len(buf), "stall-write"
                if cut == "stall-write":
                    muted.set()  # a stopped server answers nothing
                buf = buf[pos:]
                upstream.sendall(b"".join(out))
                if cut:
                    if cut == "drop":
                        _close(client)
                    if self._then_refuse:
                        self._then_refuse = False
                        self.refuse()
                        self.fired -= 1  # one fault
                    self._linger(upstream, None if cut == "drop" else client)
                    return
        except OSError:
            pass
        finally:
            threading.Timer(0.5, _close, (upstream,)).start()

    def _linger(self, upstream: socket.socket, client: socket.socket | None) -> None:
        """After a cut: keep the server side open a moment (it runs what it read); a
        stalled client is held open, unanswered, until the proxy closes."""
        self._stop.wait(0.5)
        if client is not None:
            while not self._stop.wait(0.2):
                with self._lock:
                    if client not in self._clients:
                        break
            _close(client)


def _listen_again(port: int) -> socket.socket:
    """A listener on ``port`` again: the closed one stays bound until the accept that
    waited on it returns (up to its 0.1 s poll)."""
    deadline = time.monotonic() + 2
    while True:
        try:
            return socket.create_server(("127.0.0.1", port))
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


@contextmanager
def fault_proxy(target_port: int) -> Iterator[FaultProxy]:
    proxy = FaultProxy(target_port)
    try:
        yield proxy
    finally:
        proxy.close()
