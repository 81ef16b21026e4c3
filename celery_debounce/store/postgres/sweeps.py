"""The PostgreSQL store's dispatcher bookkeeping (a base of ``PostgresStore``): the
expiry sweep (with the record sweep), shard layouts and heartbeats, each one call of a
schema function (``functions/``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...aliases import parse_aliases
from ..domain import ShardRef
from ..results import EXPIRY_GRACE_MS
from .step import many, one

if TYPE_CHECKING:  # pragma: no cover
    from ...settings import Settings

_HEARTBEAT = "SELECT debounce_heartbeat(%s, %s, %s)"
_LAYOUTS = "SELECT * FROM debounce_layouts(%s, %s)"
_EXPIRING = "SELECT debounce_expiring(%s, %s)"
_EXPIRE = "SELECT task_id, aliases FROM debounce_expire(%s, %s, %s, %s, %s)"
_SWEEP = "SELECT debounce_sweep(%s)"

#: Most rows the record sweep deletes per call (per table): each expiry sweep (at most
#: once a second per shard and dispatcher) runs one such batch first.
SWEEP_BATCH = 1000
_EXPIRED = "SELECT debounce_expired(%s)"


@dataclass(frozen=True)
class OneTable:
    """The PostgreSQL store's shard layout: its windows are in one table, so a dispatcher's
    takes find every one of them and no other layout leaves shards to drain."""

    name: str
    legacy_shards: tuple[int, ...] = ()

    def tags_of(self, name: str) -> tuple[str, ...]:
        """None: another layout's windows are in the same table, taken already."""
        return ()


class PostgresSweeps:
    """The expiry sweep, layouts and heartbeats of :class:`~.store.PostgresStore`."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides

        @property
        def settings(self) -> Settings: ...

        _settings: Settings | None

        history_ttl_ms: int

        def _check(self) -> None: ...

        def _read(self, fn: Any) -> Any: ...

        def _write(self, fn: Any, operation: str) -> Any: ...

    def expiring(self, shard: ShardRef, windows: Sequence[tuple[str, int]]) -> int:
        """When the just published messages of ``(task id, ms left)`` expire; how many."""
        if not windows:
            return 0
        self._check()
        ids, left = [w[0] for w in windows], [int(w[1]) for w in windows]
        row = self._write(one(_EXPIRING, (ids, left)), "expiring")
        return int(row[0]) if row else 0

    def expire(
        self,
        shard: ShardRef,
        limit: int = 100,
    ) -> list[tuple[str, list[dict[str, Any]]]]:
        """The expiry sweep: finish as REVOKED the queued windows whose message
        expired more than :data:`EXPIRY_GRACE_MS` ago on the server's clock and on
        this process's; ``(task id, aliases)`` of each, and of those finished earlier
        that :meth:`expired` has not confirmed. Sent at most once. First, one batch
        of the record sweep (:meth:`sweep`): Redis lets records go by their TTL, this
        store deletes them here, in the dispatcher's periodic call."""
        self._check()
        params = (
            EXPIRY_GRACE_MS,
            self.history_ttl_ms,
            limit,
            int(time.time() * 1000),
            SWEEP_BATCH,
        )
        rows = self._write(many(_EXPIRE, params), "expire")
        return [(task_id, parse_aliases(aliases)) for task_id, aliases in rows]

    def sweep(self, limit: int = SWEEP_BATCH) -> int:
        """The record sweep (``debounce_sweep``): delete up to ``limit`` finished or
        quarantined records past their ``until`` (their TTL, on the server's clock) and
        up to ``limit`` quiet periods over; how many rows went (``limit`` or more: there
        may be more). Never a window in progress nor an open one. Idempotent."""
        self._check()
        row = self._write(one(_SWEEP, (limit,)), "sweep")
        return int(row[0]) if row else 0

    def expired(self, shard: ShardRef, task_ids: Sequence[str]) -> None:
        """The outcome of these swept windows is stored: they leave the sweep."""
        if not task_ids:
            return
        self._check()
        self._write(one(_EXPIRED, (list(task_ids),)), "expired")

    @property
    def layout(self) -> OneTable:
        """One table whatever ``debounce_shards`` says (:class:`OneTable`); named as
        the Redis store names a single node's layout of as many shards."""
        shards = self._settings.shards if self._settings is not None else 1
        return OneTable(f"node:{shards}")

    def layouts(self, write: Sequence[str] = ()) -> tuple[int, dict[str, int]]:
        """Write the layouts ``write`` (now), drop those not written for the history
        TTL; ``(now ms, every layout -> ms last written)``."""
        self._check()
        rows = self._write(
            many(_LAYOUTS, (list(write), self.history_ttl_ms)),
            "layouts",
        )
        return int(rows[0][0]), {name: int(ms) for _, name, ms in rows[1:]}

    def heartbeat(self, name: str, alive: bool = True) -> int:
        """Dispatcher ``name`` runs (or stopped cleanly); the server's time, ms."""
        self._check()
        row = self._write(
            one(_HEARTBEAT, (name, alive, self.history_ttl_ms)),
            "heartbeat",
        )
        assert row is not None
        return int(row[0])
