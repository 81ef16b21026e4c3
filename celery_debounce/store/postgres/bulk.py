"""The PostgreSQL store's ``gate_many`` (a base of ``PostgresStore``): ``enqueue_many``'s
calls, a chunk in one ``debounce_gate_many`` call (one round trip, one transaction)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..chunks import chunks
from ..domain import ReplyLost, StoreUnavailable
from .gate_args import gate_many_args, gate_result, refused
from .step import many

if TYPE_CHECKING:  # pragma: no cover
    from ...producer.call import PreparedCall
    from ..domain import Outcome

_GATE_MANY = (
    "SELECT * FROM debounce_gate_many(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
    "%s, %s, %s, %s, %s)"
)


class PostgresBulk:
    """``gate_many`` of :class:`~.store.PostgresStore`."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides
        max_payload_bytes: int

        def _check(self) -> None: ...

        def _write(self, fn: Any, operation: str) -> Any: ...

    def gate_many(
        self,
        calls: Sequence[PreparedCall],
        chunk_size: int = 1000,
        on_chunk: Callable[[range], None] | None = None,
        into: list[Outcome] | None = None,
    ) -> list[Outcome]:
        """Each chunk of ``chunk_size`` calls in one round trip, atomic: one outcome per
        call, its :class:`GateResult` or the error that kept it out (its own refusal,
        nothing of it written; the others go on). A chunk whose reply was lost is
        ``ReplyLost`` for each of its calls (all of them ran, or none); after an outage
        the calls not sent yet get a ``StoreUnavailable`` each, unsent. An outage at the
        first chunk, nothing written, is raised (the whole batch). ``on_chunk(indexes)``
        runs after each chunk was answered."""
        outcomes: list[Any] = into if into is not None else []
        outcomes[:] = [None] * len(calls)
        self._check()
        down: BaseException | None = None
        for chunk in chunks(calls, max(1, chunk_size)):
            start = chunk.start
            if down is not None:
                for i in chunk:
                    outcomes[i] = StoreUnavailable(
                        f"not sent: the PostgreSQL store failed earlier in this batch: {down}"
                    )
                continue
            args = gate_many_args([calls[i] for i in chunk], self.max_payload_bytes)

            try:
                rows = self._write(many(_GATE_MANY, args), "gate_many")
            except StoreUnavailable as exc:  # nothing of the chunk was written
                if start == 0:
                    raise  # an outage of the whole batch
                down = exc
                for i in chunk:
                    outcomes[i] = StoreUnavailable(f"not written: {exc}")
                continue
            except ReplyLost as exc:  # the chunk ran whole, or not at all
                down = exc
                for i in chunk:
                    outcomes[i] = exc
                continue
            for k, *answer, sqlstate, message in rows:
                i = start + k - 1
                if sqlstate is not None:
                    outcomes[i] = refused(sqlstate, message)
                else:
                    outcomes[i] = gate_result(answer)
            if on_chunk is not None:
                on_chunk(chunk)
        return outcomes
