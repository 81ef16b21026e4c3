"""redis-py errors as the package's errors, and the Redis error codes they carry."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from ...errors import DebounceBackendError, DebounceOutcomeUnknown
from ...redact import redact


@contextmanager
def translate_errors(operation: str) -> Iterator[None]:
    """Turn redis-py errors into :class:`DebounceBackendError`."""
    try:
        yield
    except redis.RedisError as exc:
        raise _translated(operation, exc) from exc


def _translated(operation: str, exc: redis.RedisError) -> DebounceBackendError:
    from ..domain import AliasesFull, PayloadTooLarge, ReplaceRefused, ServerRefused

    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return unreachable(f"debounce Redis unreachable during {operation}: {exc}", exc)
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        # Redis refuses a script under OOM only at its first write, before anything is
        # written (docs/design.md, "Maxmemory"); a plain command or a MULTI is refused whole
        return ServerRefused(
            f"debounce Redis is at maxmemory (OOM): {operation} refused, nothing was written "
            f"(free memory, raise maxmemory, or check the maxmemory-policy): {exc}"
        )
    match = _CONTRACT.search(str(exc))
    if match:  # gate.lua: the producer speaks another contract version (nothing written)
        from ...errors import DebounceContractMismatch  # (kept off the shared import block)

        return DebounceContractMismatch(
            f"debounce gate refused {operation}: {match.group(0)} (the producer and the "
            "gate script speak different versions of the gate contract; see "
            "docs/contract.md)",
            match.group(1),
            match.group(2),
        )
    text = str(exc)
    for code, typed in (
        (PAYLOAD_TOO_LARGE, PayloadTooLarge),
        (REPLACE_REFUSED, ReplaceRefused),
        (ALIASES_FULL, AliasesFull),
    ):
        if code in text:  # a script's own refusal (nothing written): its typed error
            refused = typed(f"debounce Redis refused {operation}: {exc}")
            if isinstance(refused, ReplaceRefused):
                refused.reason = text.split(code, 1)[1].lstrip(": ")
            return refused
    if reply_code(exc) in REFUSED_CODES:
        return ServerRefused(f"debounce Redis refused {operation}: {exc}")
    return DebounceBackendError(f"debounce Redis refused {operation}: {exc}")


#: Error replies that mean "this server cannot take writes now", the command did not
#: run (:class:`~.domain.ServerRefused`). NOPERM, NOAUTH, WRONGTYPE, script errors are
#: not: they are the store's plain :class:`DebounceBackendError`.
REFUSED_CODES = frozenset(
    {"OOM", "READONLY", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "MISCONF"}
)
#: Connection-level errors that are configuration, not outages.
NOT_OUTAGE_CODES = frozenset({"NOAUTH", "WRONGPASS", "NOPERM"})


def unreachable(message: str, cause: BaseException) -> DebounceBackendError:
    """The store's error for a connection that failed with ``cause`` before anything
    ran: :class:`~.domain.StoreUnavailable` (an outage), :class:`~.domain.ServerRefused`
    when the link failed on a refusal (a demoted master's READONLY, LOADING), plain
    :class:`DebounceBackendError` when it is configuration (NOAUTH, WRONGPASS, NOPERM)
    or no link error at all."""
    from ..domain import ServerRefused, StoreUnavailable

    code = reply_code(cause)
    if code in NOT_OUTAGE_CODES:
        return DebounceBackendError(message)
    if code in REFUSED_CODES:
        return ServerRefused(message)
    if isinstance(cause, (redis.ConnectionError, redis.TimeoutError, OSError)):
        return StoreUnavailable(message)
    return DebounceBackendError(message)


#: gate.lua's refusal of a producer of another contract version.
CONTRACT_MISMATCH = "DEBOUNCE_CONTRACT_MISMATCH"
_CONTRACT = re.compile(CONTRACT_MISMATCH + r" producer (\w+) gate (\w+)")


def _lost(operation: str, exc: BaseException, cut: bool = False) -> DebounceOutcomeUnknown:
    """The reply of a command that reached Redis was lost, or (``cut``) a write of
    several commands failed part-way, its first ones maybe complete: say that it may
    have run (:class:`~.domain.ReplyLost`; a configuration error in its chain, NOAUTH,
    WRONGPASS, NOPERM: the plain :class:`DebounceOutcomeUnknown`, no outage)."""
    from ..domain import ReplyLost

    what = "its write cut off part-way" if cut else "its reply lost"
    message = redact(
        f"debounce Redis unreachable during {operation}, {what} ({exc}); the "
        "outcome is unknown: it may or may not have run, and it was not sent again"
    )
    code = reply_code(exc)
    if code in NOT_OUTAGE_CODES or not isinstance(
        exc, (redis.ConnectionError, redis.TimeoutError, OSError)
    ):
        return DebounceOutcomeUnknown(message)
    lost = ReplyLost(message)
    lost.refused = code in REFUSED_CODES
    return lost


def _refused_by_a_replica(exc: BaseException) -> bool:
    """Sentinel's connection turns a demoted master's READONLY (the command did not
    run) into a ConnectionError; True for that one."""
    return isinstance(exc.__context__, redis.exceptions.ReadOnlyError)


def is_outage(exc: BaseException) -> bool:
    """True for an outage (worth retrying), False for an error Redis answered with."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return isinstance(cause, (redis.ConnectionError, redis.TimeoutError, OSError))


#: redis-py's "unreachable" errors (a Redis broker's kombu transport raises them too).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
#: Every redis-py error.
REDIS_ERROR: type[Exception] = redis.RedisError


def is_error_reply(exc: BaseException) -> bool:
    """True when ``exc`` (or what it wraps) is an error reply from a Redis server."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.ResponseError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


#: redis-py classes whose message has lost its Redis error code (MasterDownError, a
#: ClusterDownError, first)
_CODE_OF_CLASS: tuple[tuple[type[BaseException], str], ...] = (
    (redis.exceptions.OutOfMemoryError, "OOM"),
    (redis.exceptions.ReadOnlyError, "READONLY"),
    (redis.exceptions.BusyLoadingError, "LOADING"),
    (redis.exceptions.AuthenticationError, "NOAUTH"),
    (redis.exceptions.NoPermissionError, "NOPERM"),
    (redis.exceptions.MasterDownError, "MASTERDOWN"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
    (redis.exceptions.TryAgainError, "TRYAGAIN"),
)
#: redis-py annotates a pipeline's first error: "Command # <n> (...) of pipeline caused
#: error: <reply>"
_PIPELINE_ERROR = re.compile(r"^Command # (\d+) \(.*\) of pipeline caused error: (.*)$", re.S)


def reply_code(exc: BaseException) -> str | None:
    """The Redis error code of ``exc`` or of what it wraps (kombu wraps a batch's
    error), e.g. ``"OOM"``; None when no Redis error reply is in the chain."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if isinstance(
            seen,
            (
                redis.ResponseError,
                redis.exceptions.BusyLoadingError,
                redis.exceptions.AuthenticationError,
            ),
        ):
            for cls, code in _CODE_OF_CLASS:
                if isinstance(seen, cls):
                    return code
            text = str(seen.args[0]) if seen.args else ""
            match = _PIPELINE_ERROR.match(text)
            if match:
                text = match.group(2)
            return text.split(" ", 1)[0].upper() or None
        seen = seen.__cause__ or seen.__context__
    return None


def pipeline_failed_at(exc: BaseException) -> int | None:
    """The number (from 1) of the first command of a pipeline that failed, as redis-py
    annotates it (commands before it ran); None when ``exc`` is not such an error."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return None
        if isinstance(seen, redis.RedisError) and seen.args:
            match = _PIPELINE_ERROR.match(str(seen.args[0]))
            if match:
                return int(match.group(1))
        seen = seen.__cause__ or seen.__context__
    return None


def _unreadable_url(url: str) -> Exception:
    """redis-py could not read ``url``: its own error is not shown (it quotes the part it
    could not read, a password holding '/' or ';' unencoded included)."""
    from ...errors import DebounceConfigError  # (kept off the import block other edits touch)

    return DebounceConfigError(
        redact(
            f"the windows' Redis URL {url!r} cannot be read (a password holding "
            "'/', ';', '@' or ':' must be percent-encoded, e.g. quote(password, safe=''))"
        )
    )


# -- the scripts' error codes: how their error replies start (gate.lua spells them too) --

#: A collect call that cannot fit an empty window (``debounce_max_payload_bytes``).
PAYLOAD_TOO_LARGE = "DEBOUNCE_PAYLOAD_TOO_LARGE"
#: A replacing join (``debounce_replace_payload``) the window's message cannot take.
REPLACE_REFUSED = "DEBOUNCE_REPLACE_REFUSED"
#: A fixed-id call past the window's most aliases (``aliases.MAX_ALIASES``).
ALIASES_FULL = "DEBOUNCE_ALIASES_FULL"
