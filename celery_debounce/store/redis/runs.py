"""The worker's typed operations of :class:`~celery_debounce.store.WindowStore` (the
store contract's ``WorkerStore``, :mod:`celery_debounce.store.api`): a run's finish, its
claims renewed and ended, how late past its ceiling it starts, in domain terms (no keys,
no ARGV, no raw replies).
``claim``, ``claim_late`` and ``put_back`` are the store's own; with
``debounce_redis_wait_replicas``, :class:`~celery_debounce.store.WaitedStore` waits for
the replicas after ``claim`` and :meth:`~RunOps.finish_run`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...aliases import parse_aliases
from ...headers import EXCLUSIVE_HEADER
from ...settings import Settings
from ..domain import ClaimResult, FinishResult
from ..records import as_text
from ..results import Shard
from ..states import as_before
from .fields import F_DEADLINE, F_FIRST_SEEN, F_MAX_WAIT, F_OPTIONS
from .keys import claims_key, win_key
from .translate import translate_errors

#: What a debounce_exclusive window's stored options hold (``take.lua`` looks for it).
_EXCLUSIVE = f'"{EXCLUSIVE_HEADER}"'


def claim_result(before: Any, run: Any) -> ClaimResult:
    """``claim.lua``'s verdict: the state ``before`` the claim and whether to ``run``."""
    return ClaimResult(as_before(as_text(before)), bool(int(run)))


def finish_result(reply: Any) -> FinishResult:
    """``finish.lua``'s reply: ``[finished, _, alias...]``."""
    return FinishResult(bool(int(reply[0])), parse_aliases(reply[2:]))


class RunOps:
    """A run's finish and its claims."""

    settings: Settings
    client: Any
    run: Callable[[str, list[str], list[Any]], Any]
    run_once: Callable[[str, list[str], list[Any]], Any]

    if TYPE_CHECKING:  # pragma: no cover

        def tag(self, shard: Shard) -> str: ...
        def time_ms(self, operation: str = "time") -> int: ...
        def _record_keys(self, shard: Shard, task_id: str) -> list[str]: ...
        def _finish_args(self, task_id: str, state: str) -> list[Any]: ...
        def _renew(self, held: dict[str, list[str]]) -> None: ...

    def finish_run(self, shard: Shard, task_id: str, state: str) -> FinishResult:
        """Mark the run's window finished with Celery ``state`` (``finish.lua``,
        idempotent): its claim ends, an exclusive key it held is freed. Sent once."""
        return finish_result(
            self.run_once(
                "finish", self._record_keys(shard, task_id), self._finish_args(task_id, state)
            )
        )

    def renew_claims(self, held: Mapping[Shard, Sequence[str]]) -> None:
        """Extend the live claims of the runs ``held`` (shard -> task ids) by one claim
        lease, in one pipelined round trip (``renew.lua``, ``ZADD XX``: a claim that
        lapsed or finished is never brought back)."""
        by_key: dict[str, list[str]] = {}
        for shard, task_ids in held.items():
            by_key.setdefault(claims_key(self.tag(shard)), []).extend(task_ids)
        if by_key:
            self._renew(by_key)

    def end_claim(self, shard: Shard, task_id: str) -> None:
        """End the run's claim now (its lease expires at once, ``renew.lua`` with a lease
        of 0): a requeued message's next delivery takes the claim over."""
        self.run("renew", [claims_key(self.tag(shard))], [0, task_id])

    def ceiling_lateness_ms(self, shard: Shard, task_id: str) -> int | None:
        """How many ms past its ceiling window ``task_id``'s run starts now (Redis time;
        negative: before it); None for a record without one. One HMGET and one TIME.

        The ceiling is first call + max wait; for a ``debounce_exclusive`` window, that
        or the end of the run it was held behind, whichever is later
        (docs/configuration.md): its deadline when taken (``dl``), which a hold's end
        sets to that moment."""
        with translate_errors("claim"):
            first_seen, max_wait, deadline, options = self.client.hmget(
                win_key(self.tag(shard), task_id), F_FIRST_SEEN, F_MAX_WAIT, F_DEADLINE, F_OPTIONS
            )
        if first_seen is None or max_wait is None:
            return None
        ceiling = int(first_seen) + int(max_wait)
        if deadline is not None and options is not None and _EXCLUSIVE in as_text(options):
            ceiling = max(ceiling, int(deadline))  # held behind a run until then
        return self.time_ms("claim") - ceiling
