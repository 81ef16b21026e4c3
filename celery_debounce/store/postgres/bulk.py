"""The PostgreSQL store's ``gate_many`` (a base of ``PostgresStore``): ``enqueue_many``'s
calls gated one by one, each in its own round trip and transaction, in order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import DebounceError
from ..domain import ReplyLost, StoreUnavailable

if TYPE_CHECKING:  # pragma: no cover
    from ...aliases import FixedId
    from ...producer.call import PreparedCall
    from ..bulk import Outcome
    from ..codec import GateResult


class PostgresBulk:
    """``gate_many`` of :class:`~.store.PostgresStore`."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides

        def gate(self, call: PreparedCall, fixed: FixedId | None = None) -> GateResult: ...

    def gate_many(
        self,
        calls: Sequence[PreparedCall],
        chunk_size: int = 1000,
        on_chunk: Callable[[range], None] | None = None,
        into: list[Outcome] | None = None,
    ) -> list[Outcome]:
        """Each call as :meth:`gate`, in order: one outcome per call, its
        :class:`GateResult` or the error that kept it out (a lost reply:
        ``ReplyLost``, it may have run). After an outage the calls not sent yet get a
        ``StoreUnavailable`` each, unsent: nothing of theirs was written. An outage
        at the first call, before anything was written, is raised (the whole batch).
        ``on_chunk(indexes)`` runs after each ``chunk_size`` calls were answered."""
        outcomes: list[Any] = into if into is not None else []
        outcomes[:] = [None] * len(calls)
        down: BaseException | None = None
        for start in range(0, len(calls), chunk_size):
            stop = min(start + chunk_size, len(calls))
            for i in range(start, stop):
                if down is not None:
                    outcomes[i] = StoreUnavailable(
                        f"not sent: the PostgreSQL store failed earlier in this batch: {down}"
                    )
                    continue
                try:
                    outcomes[i] = self.gate(calls[i])
                except (StoreUnavailable, ReplyLost) as exc:
                    if i == 0 and isinstance(exc, StoreUnavailable):
                        outcomes[i] = None
                        raise  # nothing written: an outage of the whole batch
                    outcomes[i], down = exc, exc
                except DebounceError as exc:  # this call's own refusal: the rest go on
                    outcomes[i] = exc
            if on_chunk is not None:
                on_chunk(range(start, stop))
        return outcomes
