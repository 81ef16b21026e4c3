"""What the PostgreSQL store's pool learnt from its last connection attempt, and what a
call makes of it: a misconfiguration raised at once by name, a server that refuses or
cannot be found an outage at once, anything else waited for until the call's timeout."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from ...errors import StoreMisconfigured
from ..domain import StoreUnavailable
from .schema import _safe

__all__ = ["LinkState", "StoreMisconfigured", "connection_class"]


#: Parts of the server's (English) FATAL messages that no retry mends.
MISCONFIGURED = (
    "password authentication failed",
    "no password supplied",
    "authentication failed for user",
    "does not exist",  # role "x" does not exist, database "x" does not exist
    "no pg_hba.conf entry",
    "permission denied for database",
    "not permitted to log in",
    "too many connections for role",
)
#: Parts of a failed connection's message that mean no server answers there: an
#: outage at once, not after the pool's timeout.
UNREACHABLE = (
    "connection refused",
    "failed to resolve host",
    "could not translate host name",
    "name or service not known",
    "no route to host",
    "network is unreachable",
    "no such file or directory",  # a Unix socket nobody listens on
)


class LinkState:
    """The last connection attempt's failure (None: it succeeded), shared by a store's
    pool (which records) and its calls (which read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failure: BaseException | None = None

    def record(self, failure: BaseException | None) -> None:
        with self._lock:
            self.failure = failure

    def raise_if_hopeless(self) -> None:
        """Raise what the last failed attempt means, when waiting would not mend it:
        :class:`StoreMisconfigured` or :class:`StoreUnavailable`."""
        failure = self.failure
        if failure is None:
            return
        text = _safe(failure)
        lowered = text.lower()
        if any(part in lowered for part in MISCONFIGURED):
            raise StoreMisconfigured(
                f"the PostgreSQL server refused the store's connection: {text} (check "
                "debounce_store_url: the role, its password, the database and its CONNECT "
                "right)"
            ) from failure
        if any(part in lowered for part in UNREACHABLE):
            raise StoreUnavailable(f"PostgreSQL store unreachable: {text}") from failure


def connection_class(state: LinkState) -> type[psycopg.Connection[Any]]:
    """A connection class whose ``connect`` tells ``state`` how each attempt went."""

    class RecordedConnection(psycopg.Connection[Any]):
        @classmethod
        def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                conn = super().connect(*args, **kwargs)
            except psycopg.Error as exc:
                state.record(exc)
                raise
            state.record(None)
            return conn

    return RecordedConnection
