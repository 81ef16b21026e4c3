"""Exceptions raised by celery_debounce."""

from __future__ import annotations


class DebounceError(Exception):
    """Base class of every error celery_debounce raises."""


class DebounceConfigError(DebounceError, ValueError):
    """A debounce option or setting has a bad value."""


class StoreMisconfigured(DebounceConfigError):
    """The store refused the connection for a reason no retry mends (on PostgreSQL: a
    wrong password, an unknown role or database, no right to connect). Raised at once,
    whatever ``debounce_on_outage`` says: it is not an outage, and the call is never
    published plainly."""


class MigrationBlocked(DebounceError):
    """``celery debounce migrate`` could not lock the PostgreSQL store's tables within
    its ``--wait``: other sessions held them (``blockers``: ``(pid, application, state,
    since)`` each). Nothing changed."""

    def __init__(self, message: str, blockers: list[tuple[int, str, str, str]]) -> None:
        super().__init__(message)
        self.blockers = blockers


class SchemaMismatch(DebounceConfigError):
    """The PostgreSQL database's debounce schema is not the one this package uses:
    nothing was written. ``found`` is its version (None: no schema), ``expected`` this
    package's."""

    def __init__(self, message: str, found: int | None, expected: int) -> None:
        super().__init__(message)
        self.found = found
        self.expected = expected


class SchemaMissing(SchemaMismatch):
    """The database has no debounce schema: run the migrate command."""


class SchemaTooOld(SchemaMismatch):
    """The database's debounce schema is older than this package's: run the migrate
    command."""


class SchemaTooNew(SchemaMismatch):
    """The database's debounce schema is newer than this package's (a newer version of
    the package migrated it): upgrade the package; it never downgrades a schema."""


class DebounceKeyError(DebounceError, ValueError):
    """A key template could not be resolved against a call's arguments."""


class DebounceBackendError(DebounceError):
    """The debounce Redis could not be reached or refused a command."""


class DebounceOutcomeUnknown(DebounceBackendError):
    """A command that changes windows reached Redis, but its reply was lost (the
    connection dropped or timed out while reading it): it may or may not have run.

    celery_debounce never sends such a command again on its own (running it twice
    could count a call twice, close a capped window early, or report "not found" for a
    window it just flushed): look before acting again (``DebounceAdmin.window``,
    ``find``)."""


class DebounceContractMismatch(DebounceBackendError):
    """The gate refused the call: the producer speaks another version of the gate
    contract (docs/contract.md) than the gate script. Nothing was written."""

    def __init__(self, message: str, producer: str = "", gate: str = "") -> None:
        super().__init__(message)
        self.producer, self.gate = producer, gate


class DebouncePayloadError(DebounceError, ValueError):
    """A call's serialized arguments exceed ``debounce_max_payload_bytes``."""


class WindowQuarantined(DebounceError):
    """The window's message could not be built or published and it was set aside
    (quarantined, see ``celery debounce inspect --state quarantined``): it did not
    run. Stored as the result of the window's id and of every id that joined it."""


class WindowNotFound(DebounceError, LookupError):
    """No window matches the task and key, or the task id, given to an admin operation."""


class WindowNotPending(DebounceError):
    """The window was already taken for dispatch, so it can no longer be flushed or cancelled."""

    def __init__(self, message: str, state: str) -> None:
        super().__init__(message)
        self.state = state


def error_name(exc: BaseException) -> str:
    """The class name a signal or metric labels ``exc`` with: its own, except for a
    store's typed error (``celery_debounce.store.domain``), labelled by its nearest public
    base (``StoreUnavailable`` -> ``DebounceBackendError``), so labels stay as documented."""
    for cls in type(exc).__mro__:
        if cls.__module__ != "celery_debounce.store.domain":
            return cls.__name__
    return type(exc).__name__  # pragma: no cover (object is always last)
