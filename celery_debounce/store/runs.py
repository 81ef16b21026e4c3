"""The worker's typed operations of :class:`~celery_debounce.store.WindowStore` (the
store contract's ``WorkerStore``, :mod:`celery_debounce.store.api`): a run's finish, its
claims renewed and ended, in domain terms (no keys, no ARGV, no raw replies).
``claim``, ``claim_late`` and ``put_back`` are the store's own; with
``debounce_redis_wait_replicas``, :class:`~celery_debounce.store.WaitedStore` waits for
the replicas after ``claim`` and :meth:`~RunOps.finish_run`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..aliases import parse_aliases
from ..layout import claims_key
from ..settings import Settings
from .codec import Shard
from .domain import FinishResult


def finish_result(reply: Any) -> FinishResult:
    """``finish.lua``'s reply: ``[finished, _, alias...]``."""
    return FinishResult(bool(int(reply[0])), parse_aliases(reply[2:]))


class RunOps:
    """A run's finish and its claims."""

    settings: Settings
    run: Callable[[str, list[str], list[Any]], Any]
    run_once: Callable[[str, list[str], list[Any]], Any]

    if TYPE_CHECKING:  # pragma: no cover

        def tag(self, shard: Shard) -> str: ...
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
