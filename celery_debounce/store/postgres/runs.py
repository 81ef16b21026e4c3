"""The PostgreSQL store's worker role (a base of ``PostgresStore``): claim, renew, end,
put back and finish a run, each one call of a schema function (``functions/``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...aliases import parse_aliases
from ..domain import ClaimResult, FinishResult, ShardRef
from ..states import as_before
from .step import one

if TYPE_CHECKING:  # pragma: no cover
    from ...settings import Settings

_CLAIM = "SELECT before, run FROM debounce_claim(%s, %s, %s, %s)"
_RENEW = "SELECT debounce_renew(%s, %s)"
_END_CLAIM = "SELECT debounce_end_claim(%s)"
_PUT_BACK = "SELECT debounce_put_back(%s)"
_FINISH = "SELECT aliases FROM debounce_finish(%s, %s, %s)"
#: The run's lateness past its ceiling: first call + max wait, or for an exclusive
#: window that was held (``held_ms``), the moment it was taken after its hold if later
#: (the end of the run it was held behind, as this store sees it: debounce_finish
#: leaves a held window's deadline as it was, and the take that finds its key free
#: records how long it was held).
_LATENESS = (
    "SELECT debounce_ms(clock_timestamp()) - CASE WHEN exclusive AND held_ms > 0 "
    "THEN greatest(debounce_ms(first_seen) + max_wait_ms, debounce_ms(taken_at)) "
    "ELSE debounce_ms(first_seen) + max_wait_ms END "
    "FROM debounce_taken WHERE task_id = %s"
)


class PostgresRuns:
    """The worker's operations of :class:`~.store.PostgresStore`."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides

        @property
        def settings(self) -> Settings: ...

        history_ttl_ms: int

        def _check(self) -> None: ...

        def _read(self, fn: Any) -> Any: ...

        def _write(self, fn: Any, operation: str) -> Any: ...

        def _write_now(self, fn: Any, operation: str) -> Any: ...

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
        """Claim a window's run for one claim lease (``debounce_claim``); ``run``
        False: a duplicate delivery. Sent at most once. ``last_delivery``: the last
        delivery its quorum queue allows; should this claim lapse, the next take hands
        the window to the expiry sweep (finished REVOKED, its exclusive key freed)."""
        self._check()
        row = self._write(
            one(_CLAIM, (task_id, self.settings.claim_lease_ms, retry, last_delivery)),
            "claim",
        )
        assert row is not None
        return ClaimResult(as_before(row[0]), bool(row[1]))

    def claim_late(
        self, shard: ShardRef, task_id: str, task_name: str = "", retry: bool = False
    ) -> ClaimResult:
        """A claim kept during an outage, sent once the store is back: :meth:`claim`
        (no replicas to wait for here)."""
        return self.claim(shard, task_id, task_name, retry)

    def finish_run(self, shard: ShardRef, task_id: str, state: str) -> FinishResult:
        """The run ended with ``state``: its window is finished (idempotent), an
        exclusive window held behind it is due; ``finished`` False: no record."""
        self._check()
        row = self._write(
            one(_FINISH, (task_id, state, self.settings.history_ttl_ms)),
            "finish",
        )
        if row is None:
            return FinishResult(False, [])
        return FinishResult(True, parse_aliases(row[0]))

    def renew_claims(self, held: Mapping[ShardRef, Sequence[str]]) -> None:
        """Extend the live claims of these runs by one claim lease (one call for every
        shard: the store has one table); a lapsed or ended claim stays so. Sent at once:
        on an idle pooled connection, else on one opened for it (``_write_now``)."""
        task_ids = [task_id for ids in held.values() for task_id in ids]
        if not task_ids:
            return
        self._check()
        self._write_now(
            one(_RENEW, (task_ids, self.settings.claim_lease_ms)),
            "renew",
        )

    def end_claim(self, shard: ShardRef, task_id: str) -> None:
        """End the run's claim now: its next delivery takes the claim over."""
        self._check()
        self._write(one(_END_CLAIM, (task_id,)), "end claim")

    def put_back(self, shard: ShardRef, task_id: str) -> bool:
        """The run's message was requeued: its window is queued again (an exclusive
        key stays held); False if it was not claimed."""
        self._check()
        row = self._write(one(_PUT_BACK, (task_id,)), "put back")
        return bool(row and row[0])

    def ceiling_lateness_ms(self, shard: ShardRef, task_id: str) -> int | None:
        """How many ms past its ceiling the run of ``task_id`` starts now (negative:
        before it); None for a window the store does not hold. The ceiling is first
        call + max wait; for a ``debounce_exclusive`` window held behind a run, the
        moment the take found that run ended, if later (the Redis store counts from
        the run's finish itself: here the dispatcher's wake-up after it is not late)."""
        row = self._read(one(_LATENESS, (task_id,)))
        return None if row is None else int(row[0])
