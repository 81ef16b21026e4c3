"""The operators' and tests' operations of :class:`~celery_debounce.store.WindowStore`:
reads of windows, counters and liveness, flush, cancel and clear."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.commands.core import Script

from ...errors import DebounceBackendError
from ...settings import Settings
from ..domain import CancelOutcomeUnknown, cancel_until_known
from ..reach import Reached
from ..records import HELD_LISTED, HOT_KEYS_KEPT, Record, as_text
from ..results import (
    Cancelled,
    HeldFront,
    Shard,
    ShardCounts,
    ShardSnapshot,
)
from .checks import combined_policy
from .diagnose import DoctorOps
from .fields import (
    CANCEL_FIELDS,
    F_STATE,
    FLUSH_FIELDS,
    INSPECT_FIELDS,
    PAYLOAD_FIELDS,
    decode_record,
)
from .keys import (
    active_key,
    alive_key,
    all_keys_pattern,
    calls_key,
    cancel_marker_key,
    dispatchers_key,
    due_key,
    held_key,
    hot_key,
    layouts_key,
    leased_key,
    open_key,
    quarantine_key,
    run_key,
    stats_key,
    stats_reset_key,
    stopped_key,
    tasks_key,
    win_key,
)
from .listing import Listing
from .liveness import Liveness
from .server import maxmemory_policy
from .tags import ShardLayout, shard_wake_channel
from .translate import translate_errors
from .transport import Transport

#: Redis commands :meth:`Operators.snapshot` sends per shard.
SNAPSHOT_COMMANDS = 13


class Operators(DoctorOps, Liveness, Listing):
    """Operations of :class:`~celery_debounce.store.WindowStore` for ``celery debounce``
    commands, the admin API, ``top`` and tests."""

    settings: Settings
    layout: ShardLayout
    client: Any
    scripts: dict[str, Script]
    transport: Transport
    run: Callable[[str, list[str], list[Any]], Any]
    run_once: Callable[[str, list[str], list[Any]], Any]

    if TYPE_CHECKING:  # pragma: no cover

        def tag(self, shard: Shard) -> str: ...

        @property
        def sharded_wake(self) -> bool: ...

    # -- operators -------------------------------------------------------------------------
    def ping(self) -> bool:
        """True when Redis answers (errors leave as DebounceBackendError)."""
        with translate_errors("ping"):
            return bool(self.client.ping())

    def time_ms(self, operation: str = "time") -> int:
        """The Redis clock, ms (``operation`` names the caller in an error)."""
        with translate_errors(operation):
            secs, micros = self.client.time()
        return int(secs) * 1000 + int(micros) // 1000

    def pending(self, shard: int, ident: str) -> Record | None:
        """The pending window of ``ident``: one HMGET and one ZSCORE (its deadline)."""
        tag = self.tag(shard)
        with translate_errors("inspect"), self.client.pipeline(transaction=False) as pipe:
            pipe.hmget(open_key(tag, ident), *INSPECT_FIELDS)
            pipe.zscore(due_key(tag), ident)
            row, deadline = pipe.execute()
        if deadline is None:
            return None
        return decode_record(INSPECT_FIELDS, row, ident=ident, deadline=deadline)

    def taken(self, task_id: str) -> tuple[int, Record] | None:
        """``(shard, record)`` of the taken window ``task_id``: one lookup per shard."""
        with translate_errors("inspect"), self.client.pipeline(False) as pipe:
            for tag in self.layout.tags:
                pipe.hmget(win_key(tag, task_id), *INSPECT_FIELDS)
            rows = pipe.execute()
        for shard, row in enumerate(rows):
            record = decode_record(INSPECT_FIELDS, row)
            if record is not None:
                return shard, self._with_quiet_ends(shard, [record])[0]
        return None

    def _flush_call(self, shard: int, ident: str, task_id: str) -> tuple[list[str], list[Any]]:
        tag = self.tag(shard)
        channel = shard_wake_channel(tag) if self.sharded_wake else self.layout.wake_channel
        return (
            [open_key(tag, ident), due_key(tag), leased_key(tag)],
            [ident, channel, task_id, self.settings.record_ttl_ms],
        )

    def flush(self, shard: int, windows: Sequence[tuple[str, str]]) -> list[Record]:
        """Run ``flush.lua`` for each ``(ident, task id)`` (several in one pipeline on a
        single node): close the pending window of ``ident`` (with that id unless "") and
        make it due now. The windows as flushed."""
        if not windows:
            return []
        if len(windows) == 1:
            replies = [self.run_once("flush", *self._flush_call(shard, *windows[0]))]
        else:
            replies = self.transport.flush_many(self, shard, windows)
        flushed = (
            decode_record(FLUSH_FIELDS, reply, ident=ident) if reply else None
            for (ident, _), reply in zip(windows, replies, strict=True)
        )
        return [record for record in flushed if record is not None]

    def cancel(self, shard: int, ident: str, task_id: str = "") -> Cancelled | None:
        """Run ``cancel.lua``: drop the pending window of ``ident`` (with ``task_id`` if
        given); what was dropped, or None."""
        tag = self.tag(shard)
        keys = [open_key(tag, ident), due_key(tag), stats_key(tag)]
        # cancel.lua keeps its reply under the call's token: a caller learns which
        # window it dropped, even after a lost reply, and can revoke its result
        token, reply = cancel_until_known(
            lambda token: self.run_once(
                "cancel", keys, [ident, task_id, self.settings.history_ttl_ms, token]
            ),
            shard,
            ident,
            max(self.settings.redis_timeout_s, 1.0) * 3,
        )
        return self._cancel_result(shard, ident, token, reply)

    def _cancel_result(self, shard: int, ident: str, token: str, reply: Any) -> Cancelled | None:
        if not reply:
            return None
        try:
            with translate_errors("cancel"):
                self.client.delete(cancel_marker_key(self.tag(shard), token))
        except DebounceBackendError:
            pass  # it expires
        record = decode_record(CANCEL_FIELDS, reply, ident=ident)
        assert record is not None
        return Cancelled(record, list(reply[len(CANCEL_FIELDS) :]))

    def cancelled_by(self, lost: CancelOutcomeUnknown) -> Cancelled | None:
        """After :class:`CancelOutcomeUnknown`: the window that cancel dropped (read from
        its token's key, a read only), or None if it did not run. Raises
        DebounceBackendError while Redis does not answer."""
        with translate_errors("cancel check"):
            reply = self.client.lrange(cancel_marker_key(self.tag(lost.shard), lost.token), 0, -1)
        return self._cancel_result(lost.shard, lost.ident, lost.token, reply)

    def counts(self, shard: int, now_ms: int) -> ShardCounts:
        """Open and due windows of ``shard`` and its counters."""
        tag = self.tag(shard)
        with translate_errors("stats"), self.client.pipeline(False) as pipe:
            pipe.zcard(due_key(tag))
            pipe.zcount(due_key(tag), "-inf", now_ms)
            pipe.hgetall(stats_key(tag))
            zcard, zcount, counters = pipe.execute()
        return ShardCounts(
            int(zcard), int(zcount), {as_text(k): int(v) for k, v in counters.items()}
        )

    def reset_counters(self, shard: int) -> dict[str, int]:
        """Zero the shard's counters atomically; the counters removed.

        The hash is RENAMEd away (one atomic step: later increments start a new hash),
        read, then deleted; the renamed copy keeps the hash's TTL, so a crash in between
        leaves nothing forever.
        """
        tag = self.tag(shard)
        held = stats_reset_key(tag, uuid.uuid4().hex)  # same hash tag, same slot
        client = self.client
        with translate_errors("stats reset"):
            try:
                client.rename(stats_key(tag), held)
            except redis.ResponseError as exc:
                # "no such key": nothing to reset, unless redis-py sent the RENAME again
                # after its reply was lost (the first one moved the hash to ``held``)
                if "no such key" in str(exc).lower() and not client.exists(held):
                    return {}
                if "no such key" not in str(exc).lower():
                    raise
            removed = {as_text(k): int(v) for k, v in client.hgetall(held).items()}
            client.delete(held)
        return removed

    def snapshot(self, shard: int, now_ms: int) -> ShardSnapshot:
        """One pipeline of O(1)/O(log N) reads (``top``, the store gauges)."""
        tag = self.tag(shard)
        with translate_errors("top"), self.client.pipeline(False) as pipe:
            pipe.zcard(due_key(tag))
            pipe.zcount(due_key(tag), "-inf", now_ms)
            pipe.zrange(due_key(tag), 0, 0, withscores=True)
            pipe.zcard(leased_key(tag))
            pipe.zcard(active_key(tag))
            pipe.zcard(quarantine_key(tag))
            pipe.hgetall(stats_key(tag))
            pipe.zrevrange(hot_key(tag), 0, HOT_KEYS_KEPT - 1, withscores=True)
            pipe.zrange(dispatchers_key(tag), 0, -1, withscores=True)
            pipe.zrange(alive_key(tag), 0, -1, withscores=True)  # written on shard 0 only
            pipe.zrange(stopped_key(tag), 0, -1, withscores=True)
            pipe.zcard(held_key(tag))
            pipe.zrange(held_key(tag), 0, HELD_LISTED - 1, withscores=True)
            replies = pipe.execute(raise_on_error=False)
        # A key of the wrong type (someone wrote it by hand) must not blind the view.
        (
            z_open,
            z_due,
            first,
            z_leased,
            z_active,
            z_quar,
            counters,
            hot_rows,
            seen,
            alive,
            stopped,
            z_held,
            held_rows,
        ) = (r if not isinstance(r, Exception) else None for r in replies)
        kept: dict[str, int] = {}
        for name, value in (counters or {}).items():
            try:
                kept[as_text(name)] = int(value)
            except ValueError:
                continue
        return ShardSnapshot(
            int(z_open or 0),
            int(z_due or 0),
            int(first[0][1]) if first else None,
            int(z_leased or 0),
            int(z_active or 0),
            int(z_quar or 0),
            kept,
            [(as_text(i), int(c)) for i, c in hot_rows or []],
            [(as_text(n), int(ms)) for n, ms in seen or []],
            [(as_text(n), int(ms)) for n, ms in alive or []],
            [(as_text(n), int(ms)) for n, ms in stopped or []],
            int(z_held or 0),
            self._held_front(shard, [(as_text(i), int(ms)) for i, ms in held_rows or []]),
        )

    def _held_front(self, shard: Shard, front: list[tuple[str, int]]) -> list[HeldFront]:
        """The longest held with the run each waits for: one more round trip, only when
        windows are held."""
        waits = self._waits_for(shard, [ident for ident, _ in front])
        return [HeldFront(i, ms, *wait) for (i, ms), wait in zip(front, waits, strict=True)]

    def _waits_for(
        self, shard: Shard, idents: Sequence[str]
    ) -> list[tuple[str | None, str | None]]:
        """For held windows' idents: (id, state) of the window in progress each waits
        for (``<tag>:run:<ident>``), None where it just ended. One pipeline per step."""
        if not idents:
            return []
        tag = self.tag(shard)
        with translate_errors("top"):
            with self.client.pipeline(transaction=False) as pipe:
                for ident in idents:
                    pipe.hget(run_key(tag, ident), "id")
                runners = [
                    as_text(r) if isinstance(r, bytes) else None
                    for r in pipe.execute(raise_on_error=False)
                ]
            with self.client.pipeline(transaction=False) as pipe:
                for runner in runners:
                    pipe.hget(win_key(tag, runner or ""), F_STATE)
                states = [
                    as_text(r) if isinstance(r, bytes) else None
                    for r in pipe.execute(raise_on_error=False)
                ]
        return [
            (runner, state if runner else None)
            for runner, state in zip(runners, states, strict=True)
        ]

    def maxmemory_policy(self) -> str:
        """The server's ``maxmemory-policy`` (see checks.py), "unknown" if unreadable: the
        Redis store's own (a server setting, not in the contract)."""
        # every master of a cluster: the worst answer wins
        return combined_policy([maxmemory_policy(c) for c in self.transport.masters()])

    def reach(self) -> Reached:
        """What reaching the server found, for ``check --connect`` (reach_redis.py)."""
        from .reach_redis import reach_redis

        return reach_redis(self)  # type: ignore[arg-type]

    # -- tests -------------------------------------------------------------------------------
    def pending_payloads(self, shard: int, prefix: str | None = None) -> Iterator[Record]:
        """Every pending window of ``shard`` (whose ident starts with ``prefix``) with its
        payload and options, a collect window with its calls so far (record field ``cl``
        names their list), in deadline order."""
        tag = self.tag(shard)
        with translate_errors("inspect"):
            due: list[Any] = self.client.zrange(due_key(tag), 0, -1, withscores=True)
        for member, deadline in due:  # a pending window's deadline is its due score
            ident = as_text(member)
            if prefix is not None and not ident.startswith(prefix):
                continue
            with translate_errors("inspect"):
                row = self.client.hmget(open_key(tag, ident), *PAYLOAD_FIELDS)
            record = decode_record(PAYLOAD_FIELDS, row, ident=ident, deadline=deadline)
            if record is not None and record.collect_list is not None:
                with translate_errors("inspect"):
                    listed = self.client.lrange(calls_key(tag, record.collect_list), 0, -1)
                record = record._replace(collected=tuple(listed))
            if record is not None:
                yield record

    def delete_all(self) -> int:
        """Delete every key under the app's ``debounce_key_prefix``; how many."""
        with translate_errors("clear"):
            keys = list(
                self.client.scan_iter(match=all_keys_pattern(self.settings.key_prefix), count=1000)
            )
            # the keys outside every hash tag (all_keys_pattern matches tagged keys)
            keys.append(layouts_key(self.settings.key_prefix))
            keys.append(tasks_key(self.settings.key_prefix))
            return int(self.client.delete(*keys))
