"""The PostgreSQL store's cancel (a base of ``PostgresStore``): one call of
``debounce_cancel`` (``functions/debounce_cancel.sql``), sent again under its token
after a lost reply."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..domain import CancelOutcomeUnknown, cancel_until_known
from ..records import Record
from ..results import Cancelled
from .columns import record_fields, select_record
from .step import many

_CANCEL = select_record(", capped, aliases FROM debounce_cancel(%s, %s, %s, %s)")
_CANCELLED = select_record(", capped, aliases FROM debounce_cancelled WHERE token = %s")
#: How long a cancel's reply is kept under its token (as cancel.lua keeps it on Redis).
CANCEL_KEEP_MS = 300_000


class PostgresCancel:
    """``cancel`` and ``cancelled_by`` of :class:`~.store.PostgresStore`."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides
        timeout: float

        def _check(self) -> None: ...
        def _read(self, fn: Any) -> Any: ...
        def _write(self, fn: Any, operation: str) -> Any: ...

    def cancel(self, shard: int, ident: str, task_id: str = "") -> Cancelled | None:
        """Drop the open window of ``ident`` (of ``task_id`` if given) so it never runs;
        what was dropped, or None. A reply lost for longer than a few timeouts raises
        :class:`CancelOutcomeUnknown` (:meth:`cancelled_by` reads what it dropped)."""
        self._check()

        def send(token: str) -> list[Any]:
            args = (ident, task_id, token, CANCEL_KEEP_MS)
            rows: list[Any] = self._write(many(_CANCEL, args), "cancel")
            return rows

        _, rows = cancel_until_known(send, shard, ident, max(self.timeout, 1.0) * 3)
        return _cancelled(rows)

    def cancelled_by(self, lost: CancelOutcomeUnknown) -> Cancelled | None:
        """After :class:`CancelOutcomeUnknown`: the window that cancel dropped (a read
        of its token's row), or None if it did not run."""
        self._check()
        rows = self._read(many(_CANCELLED, (lost.token,)))
        return _cancelled(rows)


def _cancelled(rows: Sequence[Sequence[Any]]) -> Cancelled | None:
    if not rows:
        return None
    row = rows[0]
    capped, aliases = row[6:]
    return Cancelled(Record(**record_fields(row), capped=bool(capped)), list(aliases))
