"""The store contract: what each role of the package may ask of a windows' store.

One typed Protocol per role (the producer's, the dispatcher's, the worker's, the
operators'), each method in domain terms: shard references (opaque outside the store,
:data:`~celery_debounce.store.domain.ShardRef`), prepared calls, taken windows, claims;
failures as the typed errors of :mod:`celery_debounce.store.domain`, never a substring
of a message nor a redis-py class. :class:`~celery_debounce.store.WindowStore` (Redis:
one node, Sentinel, Cluster) satisfies every Protocol (tests/store/contract checks it
under mypy and runs the contract suite against each of its topologies); a second store
proves itself by passing the same suite.

Every method that changes windows may raise
:class:`~celery_debounce.store.domain.StoreUnavailable` (an outage: it did not run) or
:class:`~celery_debounce.store.domain.OutcomeUnknown` (its reply was lost: it may have
run, and it was not sent again); the others are named where they apply.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .domain import CancelOutcomeUnknown, ClaimResult, FinishResult, Outcome, Released, ShardRef
from .idents import TakenGroup
from .reach import Reached
from .records import Record
from .results import (
    CENSUS_PAGE,
    OPEN_PAGE,
    TAKEN_PAGE,
    Cancelled,
    CensusRow,
    GateResult,
    ShardSnapshot,
    TakenEntry,
    TakeResult,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..aliases import FixedId
    from ..producer.call import PreparedCall
    from ..settings import Settings

__all__ = [
    "BaseStore",
    "DefinitionStore",
    "DispatcherStore",
    "OperatorStore",
    "ProducerStore",
    "Store",
    "WakeListening",
    "WorkerStore",
]


class BaseStore(Protocol):
    """What every role reads of any store."""

    @property
    def settings(self) -> Settings:
        """The app's typed settings the store was built with."""

    def tag(self, shard: ShardRef) -> str:
        """The wire form of ``shard`` (put on a published message; read back as a
        :data:`ShardRef` by the worker)."""

    def check_server(self, outage_raises: bool = False) -> None:
        """Check the server is one the store supports (once per process); an outage is
        raised only with ``outage_raises``."""


class ProducerStore(BaseStore, Protocol):
    """The producer's: open a window or join the open one, atomically."""

    def gate(self, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
        """One call: open a window (``opened``) or join the open one of its ident, its
        deadline never past the opener's ceiling. Raises ``PayloadTooLarge``,
        ``ReplaceRefused``, ``AliasesFull``, ``DebounceContractMismatch`` (nothing written)."""

    def gate_many(
        self,
        calls: Sequence[PreparedCall],
        chunk_size: int = 1000,
        on_chunk: Callable[[range], None] | None = None,
        into: list[Outcome] | None = None,
    ) -> list[Outcome]:
        """Each call as :meth:`gate`, in order: one outcome per call (its
        :class:`GateResult`, ``WRITTEN`` when it ran but its id is unknown, or the
        exception that kept it out). ``on_chunk``: called with each chunk's indexes
        once answered; ``into``: the list the outcomes are appended to."""


class WakeListening(Protocol):
    """A dispatcher's subscription to the store's wake-ups (a window became due)."""

    def subscribe(self) -> None:
        """Start listening (again after a failure)."""

    def wait(self, seconds: float, stop: threading.Event) -> None:
        """Sleep up to ``seconds``; return early on a wake-up or when ``stop`` is set."""

    def close(self) -> None:
        """Stop listening."""


class ShardPlan(Protocol):
    """How a store spreads its windows over shards, as its dispatcher drains them."""

    @property
    def name(self) -> str:
        """This layout's name (what :meth:`DispatcherStore.layouts` records)."""

    @property
    def legacy_shards(self) -> tuple[int, ...]:
        """Shards an older layout of these settings wrote: drained, never written
        (numbered after this layout's)."""

    def tags_of(self, name: str) -> tuple[str, ...]:
        """The shards (as :meth:`BaseStore.tag` writes them) a layout named ``name``
        reads; none for a name this store keeps no shards of."""


class DispatcherStore(BaseStore, Protocol):
    """The dispatcher's: take due windows, settle each publish, sweep, keep time."""

    @property
    def layout(self) -> ShardPlan:
        """This process's shard layout (a changed ``debounce_shards`` leaves others)."""

    def take(
        self, shard: ShardRef, limit: int, observer: str = "", lapse_upto: int | None = None
    ) -> TakeResult:
        """Lease up to ``limit`` due windows of ``shard`` (and those whose dispatch lease
        ended); a window held for an exclusive run is not taken. Sent at most once."""

    def ack(self, shard: ShardRef, task_ids: Sequence[str]) -> int:
        """Published: these taken windows are queued (idempotent); how many were."""

    def release(self, shard: ShardRef, delay_ms: int, windows: Sequence[Released]) -> int:
        """Not published: these windows are taken again in ``delay_ms`` (``failed``: the
        publish failure counted against each); how many. Sent at most once."""

    def quarantine(
        self,
        shard: ShardRef,
        task_id: str,
        reason: str,
    ) -> list[dict[str, Any]] | None:
        """Set a taken window aside for good (its aliases, as
        :attr:`FinishResult.aliases <celery_debounce.store.domain.FinishResult.aliases>`;
        None: it was not)."""

    def expiring(self, shard: ShardRef, windows: Sequence[tuple[str, int]]) -> int:
        """Remember when the messages of ``(task id, ms left)`` just published expire."""

    def expire(
        self,
        shard: ShardRef,
        limit: int = 100,
    ) -> list[tuple[str, list[dict[str, Any]]]]:
        """The expiry sweep: finish as REVOKED the queued windows whose message
        expired; ``(task id, aliases)`` of each, until :meth:`expired` confirms."""

    def expired(self, shard: ShardRef, task_ids: Sequence[str]) -> None:
        """The outcome of these swept windows is stored: forget them."""

    def layouts(self, write: Sequence[str] = ()) -> tuple[int, dict[str, int]]:
        """Record the shard layouts ``write``; ``(now ms, every layout -> ms written)``."""

    def heartbeat(self, name: str, alive: bool = True) -> int:
        """Dispatcher ``name`` runs (or stopped cleanly); the store's time, ms."""

    def wake_listener(self) -> WakeListening:
        """A new subscription to the wake-ups (one per dispatcher)."""

    def refresh_topology(self) -> None:
        """After a failover or resharding, find the servers again (a no-op where none)."""


class WorkerStore(BaseStore, Protocol):
    """The worker's: claim a run, keep its claim alive, end it, mark it finished."""

    def claim(
        self,
        shard: ShardRef,
        task_id: str,
        task_name: str = "",
        retry: bool = False,
        ident: str = "",
        *,
        last_delivery: bool = False,
    ) -> ClaimResult:
        """Claim a window's run for one claim lease; ``run`` False: a duplicate
        delivery that must not run. Sent at most once; ``NotReplicated`` (an
        ``OutcomeUnknown``) when too few replicas acknowledged it. ``last_delivery``:
        the last delivery its quorum queue allows; should this claim lapse, the
        window is finished (REVOKED), since nothing delivers it again."""

    def claim_late(
        self, shard: ShardRef, task_id: str, task_name: str = "", retry: bool = False
    ) -> ClaimResult:
        """A claim that failed in an outage, sent once the store is back (its run went
        ahead meanwhile): as :meth:`claim`, never waited for by replicas (sent again, it
        would find its own first copy live and mark a duplicate)."""

    def finish_run(self, shard: ShardRef, task_id: str, state: str) -> FinishResult:
        """The run ended with Celery ``state``: the window is finished (idempotent) and
        its held successor, if any, is due. ``FinishNotReplicated`` (an
        ``OutcomeUnknown`` carrying the result) when too few replicas acknowledged it."""

    def renew_claims(self, held: Mapping[ShardRef, Sequence[str]]) -> None:
        """Extend the live claims of these runs by one claim lease (a lapsed or finished
        claim is never brought back)."""

    def end_claim(self, shard: ShardRef, task_id: str) -> None:
        """End a run's claim now (its message went back to the queue): its next delivery
        takes the claim over instead of being skipped as a duplicate."""

    def put_back(self, shard: ShardRef, task_id: str) -> bool:
        """The run's message was requeued: its window is queued again, an exclusive key
        stays held; False if it was not claimed."""

    def ceiling_lateness_ms(self, shard: ShardRef, task_id: str) -> int | None:
        """How many ms past its ceiling this run starts now, on the store's clock
        (negative: before it; None: unknown). The ceiling is first call + max wait; for
        a ``debounce_exclusive`` window held behind a run, the end of that run if later
        (docs/configuration.md, ``debounce_exclusive``)."""


class OperatorStore(BaseStore, Protocol):
    """The operators' (admin, CLI, ``top``, exporter, tests): reads and actions, by shard
    number of this process's layout."""

    # reads
    def time_ms(self, operation: str = "time") -> int:
        """The store's clock, ms."""

    def pending(self, shard: int, ident: str) -> Record | None:
        """The open window of ``ident``, or None."""

    def taken(self, task_id: str) -> tuple[int, Record] | None:
        """``(shard, record)`` of a window taken for dispatch, by id, or None; a leading
        run's record with its quiet period's end while the run owns it."""

    def open_windows(
        self,
        shard: int,
        *,
        task: str | None = None,
        key_glob: str | None = None,
        task_id: str | None = None,
        limit: int | None = None,
        page: int = OPEN_PAGE,
    ) -> Iterator[Record]:
        """The open windows of ``shard`` in deadline order: of ``task`` only, whose key
        matches the ``fnmatch`` glob ``key_glob`` (case-sensitive), whose id is
        ``task_id`` (at most one: a bounded scan on a store without an index of ids), at
        most ``limit``; a held exclusive window with since when and the run it waits for.
        Read lazily in bounded steps of about ``page`` windows: a limited listing reads
        only the front."""

    def taken_windows(
        self, shard: int, group: TakenGroup, page: int = TAKEN_PAGE
    ) -> Iterator[TakenEntry]:
        """The taken windows of one group (:data:`~celery_debounce.store.idents.TAKEN_SETS`:
        ``leased``, ``active``, ``quarantine``) in the group's order (a lease's end, the
        hand-over, the quarantine), read lazily ``page`` at a time."""

    def census(self, shard: int, now_ms: int, page: int = CENSUS_PAGE) -> Iterator[list[CensusRow]]:
        """The open windows of ``shard`` counted per task, one batch of rows per bounded
        step of about ``page`` windows (a task's rows add up over the batches); ``now_ms``
        decides which are due."""

    def snapshot(self, shard: int, now_ms: int) -> ShardSnapshot:
        """A shard's gauges in one bounded read (``top``, the exporter, ``stats``): open
        and due windows, the counters, the taken sets' sizes, the hot keys, the
        dispatchers, the longest held (at most :data:`~.records.HELD_LISTED`, longest
        first; the others counted)."""

    def liveness(self) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
        """``(now ms, [(dispatcher, last heartbeat ms)], [(dispatcher, stopped at ms)])``:
        the dispatchers' heartbeats alone (``ping``, a liveness probe: cheaper than a
        snapshot, which counts the windows)."""

    def pending_payloads(
        self,
        shard: int,
        prefix: str | None = None,
    ) -> Iterator[Record]:
        """Every open window of ``shard`` with its payload, and a collect window with its
        calls so far (``Record.collected``), in deadline order (tests,
        ``debounce_fakeredis``)."""

    def reach(self) -> Reached:
        """Reach the server as a deploy-time check does: what it reached and each problem
        by kind (unreachable, authentication, privileges, schema, server version, a key
        prefix used by nothing)."""

    # actions
    def flush(self, shard: int, windows: Sequence[tuple[str, str]]) -> list[Record]:
        """Make the open window of each ``(ident, task id)`` (of that id unless "") due now
        (several in one request where the store can); the windows flushed."""

    def cancel(self, shard: int, ident: str, task_id: str = "") -> Cancelled | None:
        """Drop the open window of ``ident``; what was dropped, or None. A lost reply
        raises ``CancelOutcomeUnknown`` (see :meth:`cancelled_by`)."""

    def cancelled_by(self, lost: CancelOutcomeUnknown) -> Cancelled | None:
        """What a cancel whose reply was lost dropped, if it ran."""

    def reset_counters(self, shard: int) -> dict[str, int]:
        """Zero a shard's counters; their values before."""

    def delete_all(self) -> int:
        """Delete every window and record of the app (tests, ``clear``); how many keys."""


class DefinitionStore(BaseStore, Protocol):
    """The task definitions producers by name read (``producer/published.py``)."""

    def publish_definitions(self, definitions: Mapping[str, str]) -> int:
        """Write each task's definition (name -> JSON) that is new or changed; how many."""

    def task_definition(self, task_name: str) -> str | None:
        """The definition JSON published for ``task_name``, or None."""


class Store(ProducerStore, DispatcherStore, WorkerStore, OperatorStore, DefinitionStore, Protocol):
    """Every role's members: what a complete store implements (what
    :func:`~celery_debounce.store.store_for` returns)."""

    @property
    def server_checked(self) -> bool:
        """The server (and a schema it needs) was checked; until then
        :func:`~celery_debounce.store.store_for` calls :meth:`check_server` on each use."""


if TYPE_CHECKING:  # pragma: no cover
    from . import WindowStore

    def _redis_is_a_store(store: WindowStore) -> Store:
        """``mypy --strict celery_debounce`` fails here if the Redis store stops
        satisfying a role (a member missing, or its types no longer the contract's)."""
        return store
