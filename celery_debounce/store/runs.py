"""The worker's typed operations of :class:`~celery_debounce.store.WindowStore` (the
store contract's ``WorkerStore``, :mod:`celery_debounce.store.api`): a run's finish, its
claims renewed and ended, in domain terms (no keys, no ARGV, no raw replies).

They are built on the same scripts as the raw methods the worker still calls
(``finish``, ``renew``, ``run("renew", ...)``), which stay until it moves to these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..aliases import parse_aliases
from ..layout import claims_key
from ..settings import Settings
from .codec import Shard
from .domain import FinishResult


class RunOps:
    """A run's finish and its claims (``claim`` and ``put_back`` are the store's own)."""

    settings: Settings
    run: Callable[[str, list[str], list[Any]], Any]
    run_once: Callable[[str, list[str], list[Any]], Any]

    if TYPE_CHECKING:  # pragma: no cover
        def tag(self, shard: Shard) -> str: ...
        def record_keys(self, shard: Shard, task_id: str) -> list[str]: ...
        def finish_args(self, task_id: str, state: str) -> list[Any]: ...
        def renew(self, held: dict[str, list[str]]) -> None: ...
        def _run_waited(self, name: str, keys: list[str], args: list[Any]) -> Any: ...

    def finish_run(self, shard: Shard, task_id: str, state: str) -> FinishResult:
        """Mark the run's window finished with Celery ``state`` (``finish.lua``,
        idempotent): its claim ends, an exclusive key it held is freed. Sent once;
        with ``debounce_redis_wait_replicas`` followed by ``WAIT`` (too few
        acknowledgements raise ``NotReplicated`` carrying the script's reply)."""
        keys, args = self.record_keys(shard, task_id), self.finish_args(task_id, state)
        if self.settings.wait_replicas:
            reply = self._run_waited("finish", keys, args)
        else:
            reply = self.run_once("finish", keys, args)
        return FinishResult(bool(int(reply[0])), parse_aliases(reply[2:]))

    def renew_claims(self, held: Mapping[Shard, Sequence[str]]) -> None:
        """Extend the live claims of the runs ``held`` (shard -> task ids) by one claim
        lease, in one pipelined round trip (``renew.lua``, ``ZADD XX``: a claim that
        lapsed or finished is never brought back)."""
        by_key: dict[str, list[str]] = {}
        for shard, task_ids in held.items():
            by_key.setdefault(claims_key(self.tag(shard)), []).extend(task_ids)
        if by_key:
            self.renew(by_key)

    def end_claim(self, shard: Shard, task_id: str) -> None:
        """End the run's claim now (its lease expires at once, ``renew.lua`` with a lease
        of 0): a requeued message's next delivery takes the claim over."""
        self.run("renew", [claims_key(self.tag(shard))], [0, task_id])
