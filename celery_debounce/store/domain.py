"""The store contract's domain types and typed errors (see :mod:`celery_debounce.store.api`).

What a store's methods take and return, and what they raise, in the terms of windows,
calls and runs: no key names, no script names, no raw replies, no redis-py classes.
Each error is a subclass of the public error callers already catch
(:mod:`celery_debounce.errors`), so code written against those keeps working.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeVar

from ..errors import (
    DebounceBackendError,
    DebounceConfigError,
    DebounceOutcomeUnknown,
    DebouncePayloadError,
)
from .results import GateResult, Shard
from .states import WindowState

__all__ = [
    "UNKNOWN_OUTCOME",
    "WRITTEN",
    "AliasesFull",
    "CancelOutcomeUnknown",
    "ClaimResult",
    "FinishNotReplicated",
    "FinishResult",
    "NotReplicated",
    "Outcome",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "Released",
    "ReplaceRefused",
    "ReplyLost",
    "ServerRefused",
    "ShardRef",
    "StoreUnavailable",
    "cancel_until_known",
    "is_unknown_outcome",
    "waited_out",
]

_E = TypeVar("_E", bound=BaseException)

#: A shard as the store hands it out and takes it back: opaque outside the store.
#: A caller gets one from the store (a number of its layout, a message's header as the
#: store wrote it) and passes it back unchanged; :meth:`~BaseStore.tag` is its wire form.
ShardRef = Shard


# -- typed errors ----------------------------------------------------------------------


class NotReplicated(DebounceOutcomeUnknown):
    """A worker's mark (``claim``, ``finish``) ran on the master but fewer replicas than
    ``debounce_redis_wait_replicas`` acknowledged it (``WAIT``): a failover may discard
    it. ``reply``: the script's reply."""

    def __init__(self, message: str, reply: Any = None) -> None:
        super().__init__(message)
        self.reply = reply


# -- a bulk call's outcome ---------------------------------------------------------------


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: Outcome of a bulk call whose chunk ran but whose reply was lost (window id unknown).
WRITTEN = _Marker("WRITTEN")

#: Outcome of a bulk call whose chunk may or may not have run (the store unreachable
#: afterwards).
UNKNOWN_OUTCOME = DebounceOutcomeUnknown("debounce Redis unreachable: outcome of this call unknown")

#: One bulk call's outcome: its gate result, :data:`WRITTEN`, or the error it met.
Outcome = GateResult | _Marker | BaseException


def is_unknown_outcome(outcome: object) -> bool:
    """True for a bulk call that may or may not have survived: its chunk's outcome is
    unknown (the store unreachable), or too few replicas acknowledged it (``WAIT``)."""
    return isinstance(outcome, DebounceOutcomeUnknown)


class StoreUnavailable(DebounceBackendError):
    """The store could not be reached (an outage): nothing was sent, or what was sent
    is known not to have run. Worth retrying."""

    #: the call waited its whole timeout without an answer (no pooled connection, a
    #: server that never answered): the producer's outage breaker opens on it
    #: (see :func:`waited_out`)
    waited: bool = False


class ServerRefused(StoreUnavailable):
    """The store answered that it cannot take writes now (out of memory, a replica, still
    loading, a cluster slot moving): the command did not run. Worth retrying."""


#: A command that changes windows reached the store but its reply was lost: it may or
#: may not have run, and it was not sent again (the public name, re-exported here).
OutcomeUnknown = DebounceOutcomeUnknown


class ReplyLost(OutcomeUnknown):
    """An :data:`OutcomeUnknown` of a link that failed after the command was sent (an
    outage); ``refused``: the link failed on the store's refusal, so it did not run."""

    refused: bool = False


def waited_out(error: _E) -> _E:
    """``error``, marked as the end of a call that waited its whole timeout: the outage
    breaker opens on it as on a socket timeout (stores whose driver raises no
    ``TimeoutError`` of its own mark theirs)."""
    error.waited = True  # type: ignore[attr-defined]
    return error


class CancelOutcomeUnknown(OutcomeUnknown):
    """A cancel whose reply was lost and that the store did not answer again in time;
    ``token`` names what it dropped if it ran (:meth:`~.api.OperatorStore.cancelled_by`)."""

    def __init__(self, message: str, shard: int, ident: str, token: str) -> None:
        super().__init__(message)
        self.shard, self.ident, self.token = shard, ident, token


_Reply = TypeVar("_Reply")


def cancel_until_known(
    send: Callable[[str], _Reply], shard: int, ident: str, patience_s: float
) -> tuple[str, _Reply]:
    """``(token, send(token))`` for a cancel under a new token. The store keeps each
    cancel's reply under its token and answers a token it has seen with that reply, never
    acting twice: a lost reply is sent again for ``patience_s``, then raises
    :class:`CancelOutcomeUnknown`. An error of a send that never ran is raised as is."""
    token = uuid.uuid4().hex
    deadline = time.monotonic() + patience_s
    lost: OutcomeUnknown | None = None
    while True:
        try:
            return token, send(token)
        except DebounceBackendError as exc:
            if isinstance(exc, OutcomeUnknown):
                lost = lost or exc
            elif lost is None:
                raise  # nothing ran: a plain error
            if time.monotonic() >= deadline:
                raise CancelOutcomeUnknown(str(lost), shard, ident, token) from (
                    lost.__cause__ or lost
                )
            time.sleep(0.05)


class PayloadTooLarge(DebouncePayloadError, DebounceBackendError):
    """A collect call that cannot fit even an empty window
    (``debounce_max_payload_bytes``); nothing was written."""


class ReplaceRefused(DebounceConfigError, DebounceBackendError):
    """A replacing join (``debounce_replace_payload``) that the window's message cannot
    take; nothing was written."""

    #: why, as the gate said it (``window <id> <why>``)
    reason: str = ""


class AliasesFull(DebounceBackendError):
    """A fixed-id call past the window's most aliases (``aliases.MAX_ALIASES``);
    nothing was written."""


# -- typed results ---------------------------------------------------------------------


class Released(NamedTuple):
    """A taken window handed back unpublished (:meth:`~.api.DispatcherStore.release`):
    its id, its ``tries`` as taken (a lease another dispatcher took over since is left
    alone) and whether its publish ``failed`` (then counted against it)."""

    task_id: str
    tries: int
    failed: bool = False


class ClaimResult(NamedTuple):
    """A worker's claim of a window's run (``before, run = store.claim(...)`` still
    unpacks as the plain pair did)."""

    #: the window's state before the claim ("" if its record is gone): ``dispatching``,
    #: ``queued``, ``claimed``, ``stale``, ``finished``, ``pending``
    before: WindowState | Literal[""]
    #: False: a duplicate delivery (finished, or claimed under a live lease): the body
    #: must not run
    run: bool


class FinishResult(NamedTuple):
    """A run's end marked on its window."""

    #: False: no record was there (gone after its TTL, or never written)
    finished: bool
    #: the caller ids recorded on the window (``aliases.parse_aliases``): each one's
    #: result is stored with the run's outcome
    aliases: list[dict[str, Any]]


class FinishNotReplicated(NotReplicated):
    """A run's finish ran on the master but too few replicas acknowledged it
    (``debounce_redis_wait_replicas``): a failover may discard it. ``result``: what it
    marked (its aliases get the run's outcome now); sending it again is safe."""

    def __init__(self, message: str, reply: Any, result: FinishResult) -> None:
        super().__init__(message, reply)
        self.result = result
