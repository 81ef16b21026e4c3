"""The Redis store: every Redis operation of the package, one typed method each.

:class:`WindowStore` holds one app's Redis client and its Lua scripts (found by
file in ``celery_debounce/store/redis/lua/``) and offers one method per operation; key names
come from :mod:`celery_debounce.store.keys`, record fields from
:mod:`celery_debounce.store.records`. No other module of the package imports
redis-py. Every redis-py error leaves as :class:`~celery_debounce.DebounceBackendError`.

The hot path, :meth:`WindowStore.gate`, is one ``EVALSHA`` sent on a pooled
connection without redis-py's per-command wrapper (on one node or Sentinel's master:
:meth:`NodeTransport.run_once <celery_debounce.store.redis.node.NodeTransport.run_once>`,
bound to the store as ``run_once``).
With ``debounce_redis_wait_replicas`` the store is a :class:`WaitedStore`, whose
writes are each followed by ``WAIT``; the default store checks nothing of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from ...aliases import parse_aliases
from ...errors import DebounceBackendError, DebounceOutcomeUnknown
from ...settings import Settings
from ..domain import (
    ClaimResult,
    FinishNotReplicated,
    FinishResult,
    NotReplicated,
    Released,
)
from ..records import HOT_KEYS_KEPT, LATE_BUCKETS_MS, as_text
from ..results import EXPIRY_GRACE_MS, GateResult, Shard, TakeResult
from .bulk import BulkGate
from .codec import _taken, gate_args, gate_keys, parse_reply
from .connect import transport_for
from .keys import (
    active_key,
    claims_key,
    due_key,
    expiring_key,
    held_key,
    layouts_key,
    leased_key,
    open_key,
    quarantine_key,
    run_key,
    stats_key,
    tasks_key,
    win_key,
)
from .operators import Operators
from .runs import RunOps, claim_result, finish_result
from .server import ServerCheck
from .tags import layout_of
from .translate import translate_errors
from .wake import WakeListener

logger = logging.getLogger("celery_debounce.store")

if TYPE_CHECKING:  # pragma: no cover
    from ...aliases import FixedId
    from ...producer.call import PreparedCall

__all__ = ["WaitedStore", "WindowStore"]


# -- the store -------------------------------------------------------------------------------


class WindowStore(ServerCheck, BulkGate, Operators, RunOps):
    """One app's windows in Redis, for the current process.

    Scripts run with EVALSHA and are reloaded on NOSCRIPT. How commands reach Redis
    is the transport's (:mod:`celery_debounce.store.redis.transport`), chosen once here.
    """

    #: The transport's, bound here (no call in between on the hot path): see
    #: :meth:`Transport.run <celery_debounce.store.redis.transport.Transport.run>`,
    #: ``run_once`` and ``send_on_node``.
    run: Callable[[str, list[str], list[Any]], Any]
    run_once: Callable[[str, list[str], list[Any]], Any]
    send_on_node: Callable[..., list[Any]]

    def __new__(cls, settings: Settings, client: Any = None) -> WindowStore:
        """With ``debounce_redis_wait_replicas``, a :class:`WaitedStore`: the default
        store's methods have no check of it on their path."""
        if cls is WindowStore and settings.wait_replicas:
            cls = WaitedStore
        return super().__new__(cls)

    def __init__(self, settings: Settings, client: Any = None) -> None:
        self.settings = settings
        self.transport = transport = transport_for(settings, client)
        self.client: Any = transport.client
        self.scripts: dict[str, Script] = transport.scripts
        self.run = transport.run
        self.run_once = transport.run_once
        self.send_on_node = transport.send_on_node
        #: the shards' tags, the layouts drained, the wake channels (store/redis/tags.py)
        self.layout = layout_of(settings)
        #: per shard: (open_key(tag, "") , due_key(tag)), for gate.gate_keys on the hot path
        self.gate_prefixes: tuple[tuple[str, str], ...] = tuple(
            (open_key(tag, ""), due_key(tag)) for tag in self.layout.tags
        )

    def close(self) -> None:
        """Close the store's Redis client (its connection pools)."""
        self.client.close()

    @property
    def direct(self) -> bool:
        """True when commands may be sent on pooled connections directly (node, cluster)."""
        return self.transport.direct

    @property
    def sharded_wake(self) -> bool:
        """Scripts publish wake-ups with SPUBLISH to ``<tag>:wake`` (one channel per shard)."""
        return self.transport.sharded_wake

    @property
    def master_switches(self) -> int:
        """Master switches Sentinel announced since this client was built (0 without it)."""
        return self.transport.master_switches

    def tag(self, shard: Shard) -> str:
        """The tag of ``shard``: a number of this process's layout, or a tag as it is
        (a message's ``debounce_tag``, a layout drained)."""
        if isinstance(shard, str):
            return shard
        return self.layout.tag(shard)  # shards + i: a legacy shard (layout.legacy_shards)

    def refresh_topology(self) -> None:
        """On a cluster, read the slot table again (after a failover or resharding)."""
        self.transport.refresh_topology()

    # -- producers ---------------------------------------------------------------------------
    def gate(self, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
        """One call through ``gate.lua``: one EVALSHA round trip (the hot path; with
        ``debounce_redis_wait_replicas`` :meth:`WaitedStore.gate`)."""
        return parse_reply(
            self.run_once("gate", gate_keys(self, call), gate_args(self, call, fixed))
        )

    def run_gate(self, keys: list[str], args: list[Any]) -> Any:
        """``gate.lua``'s raw reply (for :meth:`gate_many`)."""
        return self.run_once("gate", keys, args)

    # -- dispatchers -------------------------------------------------------------------------
    def take(
        self, shard: Shard, limit: int, observer: str = "", lapse_upto: int | None = None
    ) -> TakeResult:
        """Atomically take up to ``limit`` due windows (and expired leases) of ``shard``.

        ``take.lua`` is not idempotent (it leases what it returns), so it is sent once
        (:meth:`run_once`). With ``observer`` (the dispatcher's name), a pass that takes
        windows also records the name and time in ``<tag>:dispatchers`` and calls per
        ident in ``<tag>:hot``. ``lapse_upto``: the latest claim expiry (Redis ms) that
        may lapse in this pass (after a step forward of Redis's clock; None: up to now).
        """
        settings = self.settings
        tag = self.tag(shard)
        reply = self.run_once(
            "take",
            [due_key(tag), leased_key(tag), stats_key(tag)],
            [
                tag,
                limit,
                settings.dispatch_lease_ms,
                settings.record_ttl_ms,
                settings.history_ttl_ms,
                observer,
                HOT_KEYS_KEPT,
                "" if lapse_upto is None else lapse_upto,
                settings.dispatch_batch_bytes,
                *LATE_BUCKETS_MS,
            ],
        )
        now_ms = int(reply[0])
        result = TakeResult(now_ms, int(reply[1]), [])
        for row in reply[2:]:
            if len(row) == 2:  # a key of the wrong type, set aside by take.lua
                result.skipped.append((as_text(row[0]), as_text(row[1])))
                continue
            try:
                result.windows.append(_taken(shard, now_ms, row))
            except (TypeError, ValueError, UnicodeDecodeError) as exc:  # missing or garbled
                tid = as_text(row[0]) if row[0] is not None else "?"
                result.unreadable.append((tid, f"unreadable record: {type(exc).__name__}: {exc}"))
        return result

    def ack(self, shard: Shard, task_ids: Sequence[str]) -> int:
        """Mark published windows queued; returns how many were."""
        tag = self.tag(shard)
        return int(self.run("ack", [leased_key(tag), active_key(tag)], [tag, *task_ids])[0])

    def release(self, shard: Shard, delay_ms: int, windows: Sequence[Released]) -> int:
        """Hand windows back: their lease ends in ``delay_ms`` (``failed``: also count
        the publish failure against each, ``fl``: release.lua's ``"<tries>!"``).

        Sent at most once (:meth:`run_once`): run again after a lost reply, the ``!``
        form would count one failure twice. A lost reply raises
        :class:`~celery_debounce.DebounceOutcomeUnknown`: each window was released, or
        stays leased until its lease ends; it is taken again either way."""
        tag = self.tag(shard)
        pairs = [x for w in windows for x in (w.task_id, f"{w.tries}!" if w.failed else w.tries)]
        return int(self.run_once("release", [leased_key(tag)], [delay_ms, tag, *pairs])[0])

    def quarantine(
        self,
        shard: Shard,
        task_id: str,
        reason: str,
    ) -> list[dict[str, Any]] | None:
        """Set a taken record aside; its aliases (``aliases.parse_aliases``), or None if
        it was not quarantined."""
        tag = self.tag(shard)
        reply = self.run_once(
            "quarantine", [leased_key(tag), quarantine_key(tag)], [tag, task_id, reason]
        )
        return parse_aliases(reply[1:]) if int(reply[0]) else None

    def expiring(self, shard: Shard, windows: Sequence[tuple[str, int]]) -> int:
        """Remember when the messages of ``(task id, ms left)`` windows, just published,
        expire (from Redis's now); returns how many."""
        tag = self.tag(shard)
        pairs = [x for pair in windows for x in pair]
        slack = EXPIRY_GRACE_MS + self.settings.history_ttl_ms
        return int(self.run("expiring", [expiring_key(tag)], [slack, *pairs])[1])

    def expire(
        self,
        shard: Shard,
        limit: int = 100,
    ) -> list[tuple[str, list[dict[str, Any]]]]:
        """Finish as REVOKED the queued windows whose message expired more than
        :data:`EXPIRY_GRACE_MS` ago, on Redis's clock and on this process's (a Redis
        clock stepped forward revokes nothing early); ``(task id, aliases)`` of each
        one finished, and of those finished earlier whose outcome :meth:`expired` has
        not confirmed."""
        tag = self.tag(shard)
        reply = self.run(
            "expire",
            [expiring_key(tag), active_key(tag)],
            [tag, EXPIRY_GRACE_MS, self.settings.history_ttl_ms, limit, int(time.time() * 1000)],
        )
        return [(as_text(row[0]), parse_aliases(row[1:])) for row in reply[1:]]

    def expired(self, shard: Shard, task_ids: Sequence[str]) -> None:
        """The outcome of these windows :meth:`expire` finished is stored: forget them."""
        if task_ids:
            with translate_errors("expired"):
                self.client.zrem(expiring_key(self.tag(shard)), *task_ids)

    def layouts(self, write: Sequence[str] = ()) -> tuple[int, dict[str, int]]:
        """Write the layout names ``write`` (now), drop those not written for the
        history TTL; ``(now ms, every layout remembered -> ms last written)``."""
        reply = self.run(
            "layouts",
            [layouts_key(self.settings.key_prefix)],
            [self.settings.history_ttl_ms, *write],
        )
        items = reply[1:]
        return int(reply[0]), {
            as_text(items[i]): int(items[i + 1]) for i in range(0, len(items) - 1, 2)
        }

    def wake_listener(self) -> WakeListener:
        """A subscription to the wake channel (one per dispatcher)."""
        return WakeListener(self)

    # -- task definitions -------------------------------------------------------------------
    def publish_definitions(self, definitions: Mapping[str, str]) -> int:
        """Write each task's definition (name -> JSON) that is new or changed; how many."""
        if not definitions:
            return 0
        key = tasks_key(self.settings.key_prefix)
        names = list(definitions)
        with translate_errors("publish"):
            known = self.client.hmget(key, names)
            changed = {
                name: definitions[name]
                for name, old in zip(names, known, strict=True)
                if old is None or as_text(old) != definitions[name]
            }
            if changed:
                self.client.hset(key, mapping=changed)
        return len(changed)

    def task_definition(self, task_name: str) -> str | None:
        """The definition JSON published for ``task_name``, or None."""
        with translate_errors("definition"):
            value = self.client.hget(tasks_key(self.settings.key_prefix), task_name)
        return None if value is None else as_text(value)

    # -- workers ---------------------------------------------------------------------------
    def _record_keys(self, shard: Shard, task_id: str) -> list[str]:
        """KEYS of claim.lua and finish.lua: the record, the lease, active and claims sets."""
        tag = self.tag(shard)
        return [win_key(tag, task_id), leased_key(tag), active_key(tag), claims_key(tag)]

    def put_back(self, shard: Shard, task_id: str) -> bool:
        """A run's message went back to the queue (``Reject(requeue=True)``): its claim
        ends and its window is ``queued`` again (``unclaim.lua``, for the claim it holds
        now), as when it was first published: the next delivery claims it, and a window
        held behind it stays held until that run ends. False if it was not claimed."""
        keys = self._record_keys(shard, task_id)
        with translate_errors("put back"):
            at = self.client.hget(keys[0], "ca")
        if at is None:
            return False
        return bool(int(self.run_once("unclaim", keys, [task_id, as_text(at), "queued"])))

    def _claim_args(self, task_id: str, task_name: str, retry: bool) -> list[Any]:
        return [
            task_id,
            self.settings.claim_lease_ms,
            "1" if retry else "0",
            task_name,
            self.settings.history_ttl_ms,
        ]

    def claim(
        self,
        shard: Shard,
        task_id: str,
        task_name: str = "",
        retry: bool = False,
        ident: str = "",
        *,
        last_delivery: bool = False,
    ) -> ClaimResult:
        """Claim a window's run for one claim lease: ``(state before ("" if the record
        is gone), run)``; ``run`` False: a duplicate delivery (finished, or claimed under
        a live lease), which must not run. ``ident`` is read only with
        ``debounce_redis_wait_replicas`` (:meth:`WaitedStore.claim`). ``last_delivery``
        marks the claim (claim.lua's ``lv``): take.lua hands a lapse of it to the
        expiry sweep."""
        args = self._claim_args(task_id, task_name, retry)
        if last_delivery:
            args += ["", "1"]
        before, _, run = self.run_once("claim", self._record_keys(shard, task_id), args)
        return claim_result(before, run)

    def claim_late(
        self, shard: Shard, task_id: str, task_name: str = "", retry: bool = False
    ) -> ClaimResult:
        """A claim kept during an outage (its run went ahead), sent once Redis is back:
        :meth:`claim` without ``WAIT`` even with ``debounce_redis_wait_replicas`` (sent
        again, it would find its own first copy live and mark a duplicate)."""
        return WindowStore.claim(self, shard, task_id, task_name, retry)

    def _renew(self, held: dict[str, list[str]]) -> None:
        """Renew the claims ``held`` (claims key -> task ids) for one claim lease: one
        pipelined round trip (one ``EVALSHA`` per claims key; per node on a cluster)."""
        script = self.scripts["renew"]
        lease = self.settings.claim_lease_ms
        with translate_errors("renew"):
            try:
                self.transport.renew(script.sha, held, lease)
            except NoScriptError:
                script.sha = self.client.script_load(script.script)
                self.transport.renew(script.sha, held, lease)

    def held(self, shard: Shard) -> dict[str, tuple[int, str | None]]:
        """Exclusive windows held on ``shard`` (take.lua): ident -> (held since ms, the
        id of the window in progress it waits for, None if that one just ended)."""
        tag = self.tag(shard)
        with translate_errors("inspect"):
            rows = self.client.zrange(held_key(tag), 0, -1, withscores=True)
            if not rows:
                return {}
            idents = [as_text(ident) for ident, _ in rows]
            with self.client.pipeline(transaction=False) as pipe:
                for ident in idents:
                    pipe.hget(run_key(tag, ident), "id")
                runners = pipe.execute(raise_on_error=False)
        return {
            ident: (int(score), as_text(runner) if isinstance(runner, bytes) else None)
            for ident, (_, score), runner in zip(idents, rows, runners, strict=True)
        }

    def _finish_args(self, task_id: str, state: str) -> list[Any]:
        return [task_id, state, self.settings.history_ttl_ms]


class WaitedStore(WindowStore):
    """The store with ``debounce_redis_wait_replicas``: each producer call, claim and
    finish is followed by ``WAIT n timeout`` on the same connection, in one write
    (``WindowStore(settings)`` builds one when the setting is on)."""

    def gate(self, call: PreparedCall, fixed: FixedId | None = None) -> GateResult:
        """:meth:`WindowStore.gate` followed by ``WAIT`` (:meth:`run_gate`)."""
        return parse_reply(self.run_gate(gate_keys(self, call), gate_args(self, call, fixed)))

    def run_gate(self, keys: list[str], args: list[Any]) -> Any:
        """``gate.lua`` then ``WAIT n timeout`` on the same connection, in one write.

        Fewer acknowledgements than ``n`` (within half of ``debounce_redis_timeout``)
        raise :class:`DebounceBackendError`: the call was written on the master but
        may not survive a failover. A redirection or a refused connection before
        anything was sent is retried on the current master; a connection lost after
        the command was sent is an error (the call may or may not be recorded).
        """
        wanted = self.settings.wait_replicas
        wait_ms = self.settings.wait_replicas_ms
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", self.scripts["gate"].sha, len(keys), *keys, *args),
            ("WAIT", wanted, wait_ms),
        ]
        with translate_errors("gate"):
            reply, acks = self.send_on_node(keys[0], commands, "gate")
        if isinstance(acks, redis.RedisError):  # NOPERM without +wait, ...: the call ran
            raise DebounceOutcomeUnknown(
                f"debounce Redis refused WAIT after the call was written on the master "
                f"({type(acks).__name__}: {acks}); whether it survives a failover is "
                "unknown (it was not sent again)"
            ) from acks
        if int(acks) < wanted:
            raise DebounceOutcomeUnknown(
                f"debounce_redis_wait_replicas={wanted}: only {int(acks)} replica(s) "
                f"acknowledged the call within {wait_ms} ms; it was written on the master "
                "but may not survive a failover"
            )
        return reply

    def _run_waited(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Script ``name`` then ``WAIT n timeout`` on the same connection, in one write
        (as the gate's). Fewer acknowledgements than ``n`` (or WAIT refused) raise
        :class:`NotReplicated` carrying the script's reply: it ran on the master, a
        failover may discard it."""
        wanted = self.settings.wait_replicas
        wait_ms = self.settings.wait_replicas_ms
        with translate_errors(name):
            reply, acks = self.send_on_node(
                keys[0],
                [
                    ("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args),
                    ("WAIT", wanted, wait_ms),
                ],
                name,
            )
        if isinstance(acks, Exception) or int(acks) < wanted:
            said = (
                f"WAIT refused ({type(acks).__name__}: {acks})"
                if isinstance(acks, Exception)
                else f"only {int(acks)} replica(s) acknowledged it within {wait_ms} ms"
            )
            raise NotReplicated(
                f"debounce_redis_wait_replicas={wanted}: {name} ran on the master but "
                f"{said}; a failover may discard it",
                reply,
            )
        return reply

    def claim(
        self,
        shard: Shard,
        task_id: str,
        task_name: str = "",
        retry: bool = False,
        ident: str = "",
        *,
        last_delivery: bool = False,
    ) -> ClaimResult:
        """:meth:`WindowStore.claim` followed by ``WAIT``: a claim that would run the
        body and that fewer replicas acknowledged is undone on the master it ran on
        (``unclaim.lua``, only if the claim is still that one) and raised as
        :class:`NotReplicated`: its run must wait (a failover may discard the claim, and
        the promoted replica's copy of the window would run a second time). A skip, or
        a record that is gone (nothing written), is answered as is. ``ident``: the
        window's ident the dispatcher sent (header ``debounce_ident``): a record that is
        gone while the window is still open here under this id (its take was lost with
        a failover) is a skip (state ``pending``): this master's dispatcher publishes it."""
        keys = self._record_keys(shard, task_id)
        try:
            before, at, run = self._run_waited(
                "claim",
                keys,
                [
                    *self._claim_args(task_id, task_name, retry),
                    ident,
                    *(["1"] if last_delivery else []),
                ],
            )
        except NotReplicated as exc:
            before, at, run = exc.reply
            if not int(run) or not before:
                return claim_result(before, run)
            try:
                self.run_once("unclaim", keys, [task_id, int(at), as_text(before)])
            except DebounceBackendError as undo:  # a demoted master: it is discarded anyway
                logger.debug("debounce: could not undo the claim of %s: %s", task_id, undo)
            raise
        return claim_result(before, run)

    def finish_run(self, shard: Shard, task_id: str, state: str) -> FinishResult:
        """:meth:`WindowStore.finish_run` followed by ``WAIT``: a finish fewer replicas
        acknowledged raises :class:`FinishNotReplicated` (its ``result`` what it marked:
        the caller keeps the finish to be sent again, ``finish.lua`` is idempotent)."""
        try:
            reply = self._run_waited(
                "finish", self._record_keys(shard, task_id), self._finish_args(task_id, state)
            )
        except NotReplicated as exc:
            raise FinishNotReplicated(str(exc), exc.reply, finish_result(exc.reply)) from None
        return finish_result(reply)
