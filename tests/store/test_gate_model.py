"""Stateful property test: a windows' store against a small pure-Python model.

Hypothesis interleaves calls (keys, payloads, per-call windows and max waits,
replace flag, call cap, leading/trailing edge, collect mode: every call kept in order,
bounded by bytes; a collect call with debounce_leading=True refused, nothing written),
clock advances, dispatcher steps (take, publish+ack, failed publish+release, crash before
or after publishing) and worker steps (claim with a lease, renewal, finish, death mid-run
with redelivery; a duplicate delivery of a finished or live-claimed window is skipped,
a claim not renewed for its lease goes stale), and debounce_exclusive windows (held while
a window of their key is in progress, due at once when its run ends or its claim lapses).

Every step goes through the store contract's Protocols (celery_debounce/store/api.py):
``ProducerStore.gate``, ``DispatcherStore.take/ack/release``,
``WorkerStore.claim/renew_claims/finish_run``, ``OperatorStore.flush/cancel/pending``;
no step builds a key or an argument list, names a script or reads a raw reply. After
every step the store's whole state must equal the model's, read by the store's
:class:`StateView` (on Redis: the package's whole keyspace, every record field and
nothing else), and the invariants of docs/guarantees.md must hold. At the end
everything is drained: every call's window must have run, at or after the call.

The stores are the contract suite's (tests/store/contract/conftest.py), each run once:

* fakeredis + lupa with a controlled clock: the seam is fakeredis's ``TIME``
  command, whose module-level ``time`` is replaced for the test
  (``fakeredis.commands_mixins.server_mixin.time``), and its key expiry clock
  (``fakeredis._socket._base.time``), so a quiet period's ``PEXPIREAT`` follows the
  same clock. The store is unchanged.
* a real server with the real clock (shorter; Redis single node, Redis Cluster, PostgreSQL): the
  model then takes "now" from each result that carries the store's clock (gate, take,
  flush), and where a result does not (ack, release, claim, renewal, finish) from the
  time the step wrote, read by the view and checked to lie between the store's clock
  read before and after the step, so it stays exact. PostgreSQL runs here too; its view
  names where it differs from Redis by design (held windows, flushes, microsecond times).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import pytest
from contract.conftest import Harness, harness_named
from fakeredis._socket import _base as fake_socket
from fakeredis.commands_mixins import server_mixin
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from celery_debounce.aliases import fixed_id
from celery_debounce.errors import DebounceConfigError
from celery_debounce.producer.call import PreparedCall
from celery_debounce.producer.options import DebounceSpec, build_spec
from celery_debounce.store import WindowStore
from celery_debounce.store.api import Store
from celery_debounce.store.domain import Released
from celery_debounce.store.idents import window_ident

if TYPE_CHECKING:  # psycopg is installed only where PostgreSQL is tested
    from celery_debounce.store.postgres import PostgresStore

TASK = "model.task"
KEYS = ["a", "b", "c", "k:{x}", "d"]
CHOSEN = [None, None, "X", "Y"]  # task ids a caller may choose (None: a default call)
CAPS = [None, None, None, 1, 2, 3]  # debounce_max_calls of a call (None: no cap)
#: (debounce_leading, debounce_trailing) of a call; trailing only is the default
EDGES = [(False, True), (False, True), (False, True), (True, False), (True, True)]
LEASE_MS = 1000
CLAIM_MS = 2000  # debounce_claim_lease of the model's workers
RELEASE_MS = 300
T0 = 1_700_000_000_000  # fake clock start, ms
#: debounce_max_payload_bytes of the model's calls: a collect window holds 1 to 3 calls
COLLECT_BYTES = 70
#: the stored options of a debounce_exclusive call (call.py adds the header)
EXCLUSIVE_OPTIONS = '{"headers":{"debounce_exclusive":1}}'


class Clock:
    """Stands in for the ``time`` module inside fakeredis's TIME command."""

    now_ms: int | None = None

    @classmethod
    def time(cls) -> float:
        return time.time() if cls.now_ms is None else cls.now_ms / 1000


@contextmanager
def fake_clock() -> Iterator[None]:
    saved, saved_expiry = server_mixin.time, fake_socket.time
    server_mixin.time = Clock  # type: ignore[assignment]
    fake_socket.time = Clock  # type: ignore[assignment]
    Clock.now_ms = T0
    try:
        yield
    finally:
        server_mixin.time, fake_socket.time = saved, saved_expiry
        Clock.now_ms = None


def model_store(harness: Harness, scale: int) -> Store:
    """A store of ``harness`` with the model's settings (durations divided by ``scale``):
    one per test, emptied after each example (:meth:`OperatorStore.delete_all`)."""
    return harness.build(
        key_prefix=f"m{uuid.uuid4().hex[:8]}",
        shards=1,
        poll_interval_ms=1000,
        dispatch_batch=3,
        dispatch_lease_ms=LEASE_MS // scale,
        history_ttl_ms=86_400_000,
        record_ttl_ms=86_400_000,
        max_key_length=1024,
        max_payload_bytes=COLLECT_BYTES,
        claim_lease_ms=CLAIM_MS // scale,
    )


@dataclass
class Win:
    """The model of one window record."""

    id: str
    ident: str
    fs: int
    dl: int
    mw: int
    n: int
    payload: bytes
    st: str = "pending"
    ta: int | None = None
    tries: int = 0
    pa: int | None = None
    ca: int | None = None
    fa: int | None = None
    calls: list[int] = field(default_factory=list)  # server time of every call joined
    publishes: int = 0
    redeliveries: int = 0
    runs: list[int] = field(default_factory=list)  # claim times
    frozen: dict[str, bytes] | None = None  # record as handed to the broker
    aliases: list[str] = field(default_factory=list)  # ids recorded as aliases (a1 ...)
    taken: int = 0  # times a take returned it (read from the store, not modelled)
    first_claims: int = 0  # claims whose reply said the record was not yet claimed
    cancelled: bool = False
    mc: int | None = None  # the opener's debounce_max_calls (the window's cap)
    capped: bool = False  # closed by gate.lua at its cap
    leading: bool = False  # a leading run (gate.lua's ld): closed at its first call
    trailing: bool = False  # opened during a quiet period (gate.lua's tr)
    # debounce_collect: every call's element, in call order (None: not a collect window)
    elements: list[bytes] | None = None
    cl: str = ""  # the suffix of its call list <tag>:calls:<cl>
    cz: int = 0  # its byte budget
    full: bool = False  # closed by gate.lua because a call did not fit (cx 2)
    built: bool = False  # take.lua spliced the body (payload) out of the list
    rd: bool = False  # a duplicate was skipped under its live claim (claim.lua's rd)
    sa: int | None = None  # when take.lua found its claim lapsed
    stales: int = 0  # claims of it that lapsed (its worker died or stopped renewing)
    skipped: int = 0  # duplicate deliveries skipped before the body
    exclusive: bool = False  # the opener's debounce_exclusive
    hs: int | None = None  # held since (take.lua), until an exclusive take clears it

    @property
    def cb(self) -> int:
        """Bytes of the body take.lua splices: [[[e1,e2,...]],{},{}]."""
        assert self.elements is not None
        return 10 + 2 + sum(len(e) for e in self.elements) + len(self.elements) - 1

    def body(self) -> bytes:
        assert self.elements is not None
        return b"[[[" + b",".join(self.elements) + b"]],{},{}]"


@dataclass
class Quiet:
    """The model of a quiet period (``<tag>:quiet:<ident>``)."""

    id: str  # the leading run's
    fs: int
    mw: int  # the leading call's max wait (relative, as stored)
    dl: int  # its end
    n: int
    m: str  # "L" or "B"


class StateView(Protocol):
    """What the model reads of a store besides the contract's Protocols, written per
    implementation (as the contract suite's harnesses are): the store's whole state, to
    compare with the model's after every step, and the time a step wrote (the results
    of ack, release, claim, renewal and finish do not carry the store's clock)."""

    #: how many lapsed claims one take releases at most
    lapse_batch: int
    #: a window held behind its key's run is moved a lease later (Redis); otherwise it
    #: keeps its deadline, is left out of the take's batch, and its run's end brings the
    #: deadline back to now if a call slid it since (PostgreSQL)
    held_moves_deadline: bool
    #: a window closed by a flush, its cap or a call of the other mode is due now
    #: (Redis); otherwise it keeps a deadline already passed and its collect body is
    #: spliced at once (PostgreSQL)
    close_sets_now: bool
    #: a take answers the retaken leases first, then the due windows (Redis); otherwise
    #: in deadline order (PostgreSQL: compared as a set)
    ordered_take: bool
    #: times are kept in microseconds and read in ms (PostgreSQL): a time in the ms of
    #: a step may be before or after it, and times in one ms are in an order the model
    #: cannot see; there the store's answer decides
    microseconds: bool

    def check(self, model: GateMachine) -> None:
        """The store holds exactly the model's windows, records, sets and indexes."""

    def written_at(self, task_id: str, what: str) -> int:
        """The time (ms) the last step wrote for window ``task_id``: ``queued``,
        ``claimed``, ``finished`` (when), ``lease`` (its dispatch lease's end),
        ``claim`` (its claim lease's end)."""


class RedisState:
    """A Redis store's :class:`StateView`: the package's whole keyspace (one shard, its
    tag ``tag``), every record field and nothing else, every sorted-set score."""

    lapse_batch = 20
    held_moves_deadline = True
    close_sets_now = True
    ordered_take = True
    microseconds = False

    #: where :meth:`written_at` reads each time: a record field, or a score of a set
    WRITTEN = {
        "queued": ("field", "pa"),
        "claimed": ("field", "ca"),
        "finished": ("field", "fa"),
        "lease": ("score", "leased"),
        "claim": ("score", "claims"),
    }

    def __init__(self, store: WindowStore) -> None:
        self.client = store.client
        self.tag = store.tag(0)
        self.prefix = store.settings.key_prefix

    def written_at(self, task_id: str, what: str) -> int:
        kind, name = self.WRITTEN[what]
        if kind == "field":
            value = self.client.hget(f"{self.tag}:win:{task_id}", name)
        else:
            value = self.client.zscore(f"{self.tag}:{name}", task_id)
        assert value is not None, (task_id, what)
        return int(value)

    def check(self, model: GateMachine) -> None:
        c, tag = self.client, self.tag
        assert {m.decode(): int(s) for m, s in c.zrange(f"{tag}:due", 0, -1, withscores=True)} == {
            w.ident: w.dl for w in model.open.values()
        }  # invariant 1: one open per ident
        leased = {m.decode(): int(s) for m, s in c.zrange(f"{tag}:leased", 0, -1, withscores=True)}
        assert leased == model.leased
        active = {m.decode(): int(s) for m, s in c.zrange(f"{tag}:active", 0, -1, withscores=True)}
        assert active == model.active
        claims = {m.decode(): int(s) for m, s in c.zrange(f"{tag}:claims", 0, -1, withscores=True)}
        assert claims == model.claims
        held = {m.decode(): int(s) for m, s in c.zrange(f"{tag}:held", 0, -1, withscores=True)}
        assert held == model.held
        for ident, tid in model.run_of.items():
            assert c.hgetall(f"{tag}:run:{ident}") == {b"id": tid.encode()}
        assert {
            k.decode(): v.decode() for k, v in c.hgetall(f"{tag}:ids").items()
        } == model.ids_index
        keys = {k.decode() for k in c.scan_iter(match=f"{self.prefix}:*", count=1000)}
        keys.discard(f"{tag}:stats")  # dispatch counters, not window state
        quiet_keys = {k for k in keys if k.startswith(f"{tag}:quiet:")}
        for qkey in quiet_keys:  # a quiet period's record, while its key lives
            q = model.quiet[qkey[len(f"{tag}:quiet:") :]]
            got = c.hgetall(qkey)
            if not got and not model.exact_clock:
                continue  # on the real clock it may expire between the SCAN and here
            assert got == {
                b"id": q.id.encode(),
                b"fs": b"%d" % q.fs,
                b"mw": b"%d" % q.mw,
                b"dl": b"%d" % q.dl,
                b"n": b"%d" % q.n,
                b"m": q.m.encode(),
            }
        if model.exact_clock:  # PEXPIREAT its end (Redis keeps a key until past it)
            assert quiet_keys == {
                f"{tag}:quiet:{i}" for i, q in model.quiet.items() if q.dl >= model.now()
            }
        keys -= quiet_keys
        expected_keys = {f"{tag}:open:{i}" for i in model.open}
        expected_keys |= {
            f"{tag}:win:{w.id}" for w in model.wins.values() if w.st not in ("pending", "cancelled")
        }
        lists = {
            w.cl: w
            for w in model.wins.values()
            if w.elements is not None and not w.built and not w.cancelled
        }
        expected_keys |= {f"{tag}:calls:{cl}" for cl in lists}
        for cl, w in lists.items():  # every call of the window, in call order
            assert c.lrange(f"{tag}:calls:{cl}", 0, -1) == w.elements
        expected_keys |= {
            f"{tag}:{z}"
            for z, m in (
                ("due", model.open),
                ("leased", model.leased),
                ("active", model.active),
                ("ids", model.ids_index),
                ("claims", model.claims),
                ("held", model.held),
            )
            if m
        }
        expected_keys |= {f"{tag}:run:{ident}" for ident in model.run_of}
        assert keys == expected_keys
        for win in model.wins.values():
            if win.cancelled:
                continue
            key = f"{tag}:open:{win.ident}" if win.st == "pending" else f"{tag}:win:{win.id}"
            rec = {k.decode(): v for k, v in c.hgetall(key).items()}
            self._check_record(win, rec)

    def _check_record(self, win: Win, rec: dict[str, bytes]) -> None:
        # mw holds the max wait (ceiling = fs + mw); a pending window's deadline is
        # only its due score (checked above), a taken one's is copied into dl
        want: dict[str, Any] = {
            "id": win.id,
            "fs": win.fs,
            "mw": win.mw - win.fs,
            "n": win.n,
            "ct": "application/data",
            "e": "{}",
        }
        if win.elements is not None:  # collect: JSON (no ct), its list until taken
            del want["ct"], want["e"]
            want["cz"] = win.cz
            want["cb"] = len(win.payload) if win.built else win.cb
            if not win.built:
                want["cl"] = win.cl
        if win.mc is not None:
            want["mc"] = win.mc
        if win.st != "pending":
            want.update(dl=win.dl, st=win.st, i=win.ident, tries=win.tries)
            if win.capped:
                want["cx"] = 1
            if win.leading:
                want["ld"] = 1
            if win.full:
                want["cx"] = 2
        if win.trailing:
            want["tr"] = 1
        if win.st == "finished":
            want.update(rs="SUCCESS")
        for name in ("ta", "pa", "ca", "fa"):
            value = getattr(win, name)
            if value is not None and (name != "ta" or win.st != "pending"):
                want[name] = value
        if win.rd:
            want["rd"] = 1
        if win.hs is not None:
            want["hs"] = win.hs
        if win.exclusive and win.st != "finished":
            want["o"] = EXCLUSIVE_OPTIONS
        if win.sa is not None:
            want["sa"] = win.sa
        if win.aliases:
            want["na"] = len(win.aliases)
            for k, alias in enumerate(win.aliases, 1):
                want[f"a{k}"] = json.dumps({"id": alias})
        if win.st != "finished":
            want["p"] = win.payload
        got = {k: v for k, v in rec.items()}
        assert got == {
            k: v if isinstance(v, bytes) else str(v).encode() for k, v in want.items()
        }, win.id  # every field, nothing else
        # invariant 5: once handed to the broker, the record's call data never changes
        snapshot = {k: v for k, v in rec.items() if k in ("id", "fs", "dl", "mw", "n", "p", "o")}
        if win.st in ("queued", "claimed"):
            if win.frozen is None:
                win.frozen = snapshot
            assert snapshot == win.frozen


class PostgresState:
    """A PostgreSQL store's :class:`StateView`: every row of its window tables
    (``debounce_open``, ``debounce_taken``, ``debounce_quiet``, ``debounce_calls``,
    ``debounce_cancelled``), each column the model knows, and no other row."""

    lapse_batch = 100
    held_moves_deadline = False
    close_sets_now = False
    ordered_take = False
    microseconds = True

    #: where :meth:`written_at` reads each time
    WRITTEN = {
        "queued": "until",
        "claimed": "claim_until",
        "finished": "until",
        "lease": "until",
        "claim": "claim_until",
    }

    def __init__(self, store: PostgresStore, direct_url: str) -> None:
        import psycopg

        self.conn = psycopg.connect(direct_url, autocommit=True)  # the store's schema
        #: what the step added to the time it wrote (ack: the record TTL; claim: the
        #: claim lease; finish: the history TTL)
        self.added = {
            "queued": store.record_ttl_ms,
            "claimed": store.settings.claim_lease_ms,
            "finished": store.settings.history_ttl_ms,
        }

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql).fetchall()

    def written_at(self, task_id: str, what: str) -> int:
        row = self.conn.execute(
            f"SELECT debounce_ms({self.WRITTEN[what]}) FROM debounce_taken WHERE task_id = %s",
            (task_id,),
        ).fetchone()
        assert row is not None and row[0] is not None, (task_id, what)
        return int(row[0]) - self.added.get(what, 0)

    def check(self, model: GateMachine) -> None:
        opened = {
            r[0]: r[1:]
            for r in self.rows(
                "SELECT ident, task_id, debounce_ms(first_seen), debounce_ms(deadline),"
                " max_wait_ms, calls, payload, options_json, max_calls, exclusive,"
                " debounce_ms(held_since), aliases, is_trailing, collect_bytes, collect_budget"
                " FROM debounce_open"
            )
        }
        assert opened == {
            w.ident: (
                w.id,
                w.fs,
                w.dl,
                w.mw - w.fs,
                w.n,
                w.payload,
                EXCLUSIVE_OPTIONS if w.exclusive else "{}",
                w.mc,
                w.exclusive,
                w.hs,
                [json.dumps({"id": a}) for a in w.aliases],
                w.trailing,
                None if w.elements is None else w.cb,
                None if w.elements is None else w.cz,
            )
            for w in model.open.values()
        }  # invariant 1: one open per ident
        taken = {
            r[0]: r[1:]
            for r in self.rows(
                "SELECT task_id, ident, state, tries, debounce_ms(first_seen),"
                " debounce_ms(deadline), max_wait_ms, calls, payload, capped, is_leading,"
                " is_trailing, exclusive, aliases, redelivered,"
                " CASE WHEN state = 'dispatching' THEN debounce_ms(until) END,"
                " debounce_ms(claim_until) FROM debounce_taken"
            )
        }
        assert taken == {
            w.id: (
                w.ident,
                w.st,
                w.tries,
                w.fs,
                w.dl,
                w.mw - w.fs,
                w.n,
                b"" if w.st == "finished" else w.body() if w.elements is not None else w.payload,
                w.capped or w.full,
                w.leading,
                w.trailing,
                w.exclusive,
                [json.dumps({"id": a}) for a in w.aliases],
                w.rd,
                model.leased.get(w.id),
                model.claims.get(w.id),
            )
            for w in model.wins.values()
            if w.st not in ("pending", "cancelled")
        }
        assert all(model.wins[tid].st == "dispatching" for tid in model.leased)
        quiet = {
            r[0]: r[1:]
            for r in self.rows(
                "SELECT ident, task_id, debounce_ms(first_seen), max_wait_ms,"
                " debounce_ms(quiet_end), calls FROM debounce_quiet"
            )
        }
        assert quiet == {i: (q.id, q.fs, q.mw, q.dl, q.n) for i, q in model.quiet.items()}
        calls: dict[str, list[bytes]] = {}
        for tid, element in self.rows("SELECT task_id, element FROM debounce_calls ORDER BY seq"):
            calls.setdefault(tid, []).append(bytes(element))
        assert calls == {
            w.id: w.elements for w in model.open.values() if w.elements is not None
        }  # every call of an open collect window, in call order
        cancelled = sorted(r[0] for r in self.rows("SELECT task_id FROM debounce_cancelled"))
        assert cancelled == sorted(model.cancels)  # each cancel's answer, kept for a retry
        for w in model.wins.values():  # invariant 5: the call data handed to the broker
            if w.st in ("queued", "claimed"):
                snapshot = {"dl": str(w.dl).encode(), "p": taken[w.id][7]}
                if w.frozen is None:
                    w.frozen = snapshot
                assert snapshot == w.frozen


def state_view(store: Store, harness: Harness) -> StateView:
    """The view of ``store``'s state the model reads (one per implementation)."""
    if isinstance(store, WindowStore):
        return RedisState(store)
    if harness.direct_url is not None:  # the PostgreSQL store's harnesses
        return PostgresState(store, harness.direct_url)  # type: ignore[arg-type]
    raise NotImplementedError(f"no state view of {type(store).__name__} for the model test")


class GateMachine(RuleBasedStateMachine):
    #: the store under test (:func:`model_store`) and its view, set per test
    store: ClassVar[Store]
    view: ClassVar[StateView]
    exact_clock: bool = True
    scale: int = 1  # durations are divided by this (the real-clock run is 10x faster)

    def __init__(self) -> None:
        super().__init__()
        if self.exact_clock:  # the clock starts again per example: replays are exact
            Clock.now_ms = T0
        self.ids = itertools.count()
        self.lease_ms = LEASE_MS // self.scale
        self.release_ms = RELEASE_MS // self.scale
        self.claim_ms = CLAIM_MS // self.scale
        self.settings = self.store.settings
        assert (self.settings.dispatch_lease_ms, self.settings.claim_lease_ms) == (
            self.lease_ms,
            self.claim_ms,
        )
        self.open: dict[str, Win] = {}  # ident -> pending window
        self.wins: dict[str, Win] = {}  # id -> every window ever opened
        self.leased: dict[str, int] = {}
        self.active: dict[str, int] = {}
        self.claims: dict[str, int] = {}  # id -> claim lease expiry
        self.run_of: dict[str, str] = {}  # ident -> id of its exclusive window in progress
        self.held: dict[str, int] = {}  # ident -> held since
        self.ids_index: dict[str, str] = {}  # id -> ident of windows opened under a fixed id
        self.quiet: dict[str, Quiet] = {}  # ident -> its latest quiet period
        self.suppressed = 0
        self.cancels: list[str] = []  # the id of every window cancelled, in order
        # (id, tries) a live dispatcher holds (taken, not yet published)
        self.inflight: list[tuple[str, int]] = []
        self.broker: list[str] = []  # messages waiting for a worker
        self.running: list[str] = []  # runs in progress
        self.last_now = 0

    # -- clock ---------------------------------------------------------------
    def now(self) -> int:
        """The fake clock; on a real one, the store's clock at the last step."""
        if not self.exact_clock:
            return self.last_now
        assert Clock.now_ms is not None
        return Clock.now_ms

    def seen_now(self, reported: int) -> int:
        """The store's own clock: exact under the fake clock, monotonic on a real one."""
        if self.exact_clock:
            assert reported == self.now()
        assert reported >= self.last_now
        self.last_now = reported
        return reported

    def clock(self) -> int:
        """The store's clock, read before and after a step whose result does not carry
        it (under the fake clock: the clock, the same both times)."""
        return self.now() if self.exact_clock else self.store.time_ms()

    def ran_at(self, t0: int, t1: int, written: Callable[[], int]) -> int:
        """When a step whose result does not carry the store's clock ran: under the
        fake clock, the clock; on a real one, the time it wrote (``written``, read by
        the view), between the store's clock before (``t0``) and after (``t1``) it."""
        if self.exact_clock:
            return self.seen_now(self.now())
        at = written()
        assert t0 <= at <= t1, (t0, at, t1)
        return self.seen_now(at)

    @rule(ms=st.integers(0, 1500))
    def advance(self, ms: int) -> None:
        if self.exact_clock:
            assert Clock.now_ms is not None
            Clock.now_ms += ms
        else:
            time.sleep(min(ms, 60) / 1000)

    # -- producer ------------------------------------------------------------
    @rule(
        key=st.sampled_from(KEYS),
        payload=st.binary(max_size=8),
        window=st.integers(1, 800),
        extra=st.integers(0, 1500),
        replace=st.booleans(),
        chosen=st.sampled_from(CHOSEN),
        cap=st.sampled_from(CAPS),
        edge=st.sampled_from(EDGES),
        collect=st.booleans(),
        exclusive=st.booleans(),
    )
    def call(
        self,
        key: str,
        payload: bytes,
        window: int,
        extra: int,
        replace: bool,
        chosen: str | None,
        cap: int | None = None,
        edge: tuple[bool, bool] = (False, True),
        collect: bool = False,
        exclusive: bool = False,
    ) -> None:
        ident = window_ident(TASK, key)
        window, extra = max(1, window // self.scale), extra // self.scale
        replace = replace and not collect
        if collect and edge[0]:  # refused before the gate (docs/design.md): nothing written
            with pytest.raises(
                DebounceConfigError, match=(r"debounce_collect=True with debounce_leading=True")
            ):
                build_spec(
                    timedelta(milliseconds=window),
                    None,
                    timedelta(milliseconds=window + extra),
                    replace,
                    cap,
                    *edge,
                    collect,
                )
            return
        if exclusive and (edge[0] or cap is not None):  # refused, nothing written
            with pytest.raises(DebounceConfigError, match=r"debounce_exclusive=True with"):
                build_spec(
                    timedelta(milliseconds=window),
                    None,
                    timedelta(milliseconds=window + extra),
                    replace,
                    cap,
                    *edge,
                    collect,
                    exclusive,
                )
            return
        spec = DebounceSpec(window, window + extra, None, replace, cap, *edge, collect, exclusive)
        options = EXCLUSIVE_OPTIONS if exclusive else "{}"
        task_id = chosen if chosen is not None else f"id-{next(self.ids):05d}"
        if collect:  # the call's JSON [args, kwargs(, id)], as call.py encodes it
            payload = json.dumps(
                [[int.from_bytes(payload[:2], "big")], {}] + ([chosen] if chosen else []),
                separators=(",", ":"),
            ).encode()
            call = PreparedCall(
                TASK, key, ident, 0, task_id, spec, "application/json", payload, options, "{}"
            )
        else:
            call = PreparedCall(
                TASK, key, ident, 0, task_id, spec, "application/data", payload, options, "", "{}"
            )
        fixed = fixed_id(chosen, {})
        result = self.store.gate(call, fixed)
        now = self.seen_now(result.now_ms)
        inherit: Quiet | None = None
        leading = False
        quiet = self.quiet.get(ident)
        if edge[0]:  # an edge call: see gate.lua's header
            running = quiet is not None and (
                quiet.dl > now
                or (quiet.dl == now and self.view.microseconds and result.edge != "lead")
            )
            if quiet is not None and running:
                quiet.dl = min(now + window, quiet.fs + quiet.mw)  # slides, up to the ceiling
                quiet.n += 1
                if not edge[1]:  # leading only: suppressed, folded into the leading run
                    assert (
                        result.task_id,
                        result.opened,
                        result.deadline_ms,
                        result.calls,
                        result.edge,
                    ) == (quiet.id, False, quiet.dl, quiet.n, "suppressed")
                    self.suppressed += 1
                    return
                inherit = quiet
            elif ident not in self.open:
                leading = True
        assert result.edge == ("lead" if leading else "")
        element = b"[%d," % now + payload[1:]
        win = self.open.get(ident)
        if win is not None and (win.elements is not None) != collect:
            self._close(win, now)  # the other mode: closed as a flush, a new window opens
            win = None
        elif win is not None and collect and win.cb + 1 + len(element) > win.cz:
            self._close(win, now)  # full: closed at once; this call opens the next window
            win.full = True
            win = None
        if win is None:
            assert result.opened
            in_use = chosen is not None and (
                any(
                    w.id == chosen and w.st != "pending" and not w.cancelled
                    for w in self.wins.values()
                )
                or any(w.id == chosen for w in self.open.values())
            )
            if in_use:  # a record is never overwritten: another id, the caller's as alias
                assert result.task_id != chosen and result.task_id not in self.wins
            else:
                assert result.task_id == task_id
                if chosen is not None:
                    self.ids_index[chosen] = ident
            fs, ceiling = now, now + window + extra
            if inherit is not None:  # a trailing window: the quiet period's fs and max wait
                fs, ceiling = inherit.fs, inherit.fs + inherit.mw
            win = Win(result.task_id, ident, fs, min(now + window, ceiling), ceiling, 1, payload)
            win.trailing = inherit is not None
            if in_use:
                win.aliases.append(chosen)  # type: ignore[arg-type]
            win.mc = cap  # the window's cap is its opener's (like the max wait)
            win.exclusive = exclusive  # and so is debounce_exclusive (its stored options)
            if collect:
                win.elements, win.cz, win.payload = [], COLLECT_BYTES, b"{}"
                live = {
                    w.cl
                    for w in self.wins.values()
                    if w.elements is not None and not w.built and not w.cancelled
                }
                win.cl, k = win.id, 0
                while win.cl in live:
                    k += 1
                    win.cl = f"{win.id}~{k}"
            self.open[ident] = win
            self.wins[win.id] = win
        else:
            assert not result.opened and result.task_id == win.id
            win.dl = min(now + window, win.mw)
            win.n += 1
            if replace:
                win.payload = payload
            if chosen is not None and chosen != win.id:
                win.aliases.append(chosen)
        win.calls.append(now)
        if collect:
            assert win.elements is not None
            win.elements.append(element)
            assert win.cb <= win.cz  # bounded: the whole window, not each call
        if leading:  # due at once through the dispatcher; the quiet period starts
            self.quiet[ident] = Quiet(
                win.id, now, window + extra, now + window, 1, "B" if edge[1] else "L"
            )
            del self.open[ident]
            win.st, win.dl, win.tries, win.leading = "dispatching", now, 0, True
            self.leased[win.id] = now
            self._unindex(win)
        elif win.mc is not None and win.n >= win.mc:
            # the cap: this call closes the window as a flush does; the next one opens anew
            self._close(win, now, capped=True)
            win.capped = True
        assert (result.deadline_ms, result.calls) == (win.dl, win.n)
        if win.capped or win.leading:
            return
        # invariant 3, read from the store: never past the record's own ceiling; before
        # now only when the ceiling has passed
        record = self.store.pending(0, ident)
        assert record is not None
        ceiling = record.ceiling_ms
        assert min(result.now_ms, ceiling) <= result.deadline_ms <= ceiling

    # -- operator ------------------------------------------------------------
    @rule(key=st.sampled_from(KEYS))
    def flush(self, key: str) -> None:
        ident = window_ident(TASK, key)
        t0 = self.clock()
        found = self.store.flush(0, [(ident, "")])
        t1 = self.clock()
        win = self.open.get(ident)
        if win is None:
            assert found == []
            return
        (flushed,) = found
        if self.view.close_sets_now:
            now = self.seen_now(flushed.deadline_ms)
        else:
            now = self.ran_at(t0, t1, lambda: self.view.written_at(win.id, "lease"))
        assert (flushed.task_id, flushed.calls, flushed.first_seen_ms) == (win.id, win.n, win.fs)
        # closed to new calls and due now: taken by the next pass, ahead of due windows
        self.held.pop(ident, None)  # published now, held or not
        self._close(win, now)
        assert flushed.deadline_ms == win.dl

    @rule(key=st.sampled_from(KEYS))
    def cancel(self, key: str) -> None:
        ident = window_ident(TASK, key)
        cancelled = self.store.cancel(0, ident)
        win = self.open.pop(ident, None)
        if win is None:
            assert cancelled is None
            return
        assert cancelled is not None
        rec = cancelled.record
        assert (rec.task_id, rec.calls, rec.first_seen_ms, rec.deadline_ms, rec.max_wait_ms) == (
            win.id,
            win.n,
            win.fs,
            win.dl,
            win.mw - win.fs,
        )
        # revoked by the caller
        assert [json.loads(a)["id"] for a in cancelled.aliases] == win.aliases
        win.cancelled = True
        win.st = "cancelled"
        self.cancels.append(win.id)
        self.held.pop(ident, None)
        self._unindex(win)

    def _close(self, win: Win, now: int, capped: bool = False) -> None:
        """A flush, or the gate (cap, full, other mode), closed the window: due now (on
        PostgreSQL a deadline already passed stays, but for a cap)."""
        del self.open[win.ident]
        win.st, win.tries = "dispatching", 0
        win.dl = now if self.view.close_sets_now or capped else min(win.dl, now)
        if not self.view.close_sets_now:
            self._build(win)
        self.leased[win.id] = now
        self._unindex(win)

    def _build(self, win: Win) -> None:
        """A take splices a collect window's body the first time it takes it."""
        if win.elements is not None and not win.built:
            win.payload, win.built = win.body(), True
            assert len(win.payload) == win.cb <= win.cz

    def _unindex(self, win: Win) -> None:
        if self.ids_index.get(win.id) == win.ident:
            del self.ids_index[win.id]

    # -- dispatcher ----------------------------------------------------------
    @rule(limit=st.integers(1, 4))
    def take(self, limit: int) -> None:
        reply = self.store.take(0, limit)
        now = self.seen_now(reply.now_ms)
        expected: list[str] = []
        lapsed = sorted(
            (kv for kv in self.claims.items() if kv[1] <= now),
            key=lambda kv: (kv[1], kv[0].encode()),
        )[: self.view.lapse_batch]
        for tid, _ in lapsed:  # a claim not renewed for its lease: released
            del self.claims[tid]
            win = self.wins[tid]
            if win.st != "claimed":
                continue
            self.active.pop(tid, None)
            win.stales += 1
            win.sa = now
            if win.rd:  # a delivery was skipped under it: published again
                win.rd, win.st = False, "dispatching"
                self.leased[tid] = now
            else:
                win.st = "stale"
                if self.view.held_moves_deadline:
                    self._free_run(win, now)
                elif self.run_of.get(win.ident) == win.id:
                    del self.run_of[win.ident]
        # PostgreSQL's times are in microseconds: of windows whose times tie to the ms,
        # the store may take either (its choice, if it is among them, is the model's),
        # and one due in the ms of the take may be due or not yet
        took = {w.task_id for w in reply.windows} if self.view.microseconds else set()

        def due_by(at: int, tid: str) -> bool:
            return at < now or (at == now and (not self.view.microseconds or tid in took))

        leases = sorted(
            self.leased.items(), key=lambda kv: (kv[1], kv[0] not in took, kv[0].encode())
        )
        for tid, _ in [kv for kv in leases if due_by(kv[1], kv[0])][:limit]:
            win = self.wins[tid]
            if win.st == "dispatching":
                self.leased[tid] = now + self.lease_ms
                win.tries += 1
                if win.tries == 1:  # a flushed window, taken for the first time
                    win.ta = now
                    if win.exclusive:  # in progress now (a flush is not held)
                        self.run_of[win.ident] = win.id
                self._build(win)
                expected.append(tid)
            else:
                del self.leased[tid]
        due = sorted(self.open.values(), key=lambda w: (w.dl, w.id not in took, w.ident.encode()))
        fetched = [w for w in due if due_by(w.dl, w.id)][: limit - len(expected)]
        held_ms: dict[str, int] = {}
        held_now = 0  # held in this pass: they used a place of the pass's batch
        if not self.view.held_moves_deadline:  # held ones keep their deadline, no place
            for win in due:
                if win.dl <= now and win.exclusive and self.in_progress(win.ident):
                    win.hs = now if win.hs is None else win.hs
            fetched = [
                w
                for w in due
                if due_by(w.dl, w.id) and not (w.exclusive and self.in_progress(w.ident))
            ][: limit - len(expected)]
        for win in fetched:
            runner = self.run_of.get(win.ident) if self.view.held_moves_deadline else None
            if runner is not None:
                if self.wins[runner].st in ("dispatching", "queued", "claimed"):
                    win.dl = now + self.lease_ms  # held: looked at again after a lease
                    if win.ident not in self.held:
                        self.held[win.ident] = now
                        if win.hs is None:
                            win.hs = now
                    held_now += 1
                    continue
                del self.run_of[win.ident]
                self.held.pop(win.ident, None)
            del self.open[win.ident]
            self._unindex(win)
            win.st, win.ta, win.tries = "dispatching", now, 1
            self._build(win)
            self.leased[win.id] = now + self.lease_ms
            expected.append(win.id)
            if win.exclusive:
                self.run_of[win.ident] = win.id
                if win.hs is not None:
                    held_ms[win.id], win.hs = now - win.hs, None
        if self.view.ordered_take:
            assert [w.task_id for w in reply.windows] == expected
        else:
            assert sorted(w.task_id for w in reply.windows) == sorted(expected)
        for w in reply.windows:
            model = self.wins[w.task_id]
            model.taken += 1
            assert w.ident == model.ident and w.payload == model.payload
            assert (w.first_seen_ms, w.deadline_ms, w.ceiling_ms, w.calls, w.tries) == (
                model.fs,
                model.dl,
                model.mw,
                model.n,
                model.tries,
            )
            assert w.taken_ms >= w.deadline_ms  # never early
            assert w.capped == (model.capped or model.full)  # closed by gate.lua (cx)
            assert w.leading == model.leading  # a leading run (gate.lua's ld)
            assert w.held_ms == held_ms.get(w.task_id, 0)
        self.inflight.extend((tid, self.wins[tid].tries) for tid in expected)
        if self.view.held_moves_deadline:
            nexts = [max(0, w.dl - now) for w in self.open.values()]
        else:  # a held window: once its key's run is over, or a lease later
            nexts = [
                max(0, w.dl - now, self.lease_ms if self.in_progress(w.ident) else 0)
                if w.hs is not None
                else max(0, w.dl - now)
                for w in self.open.values()
            ]
        nexts += [max(0, u - now) for u in self.leased.values()]
        assert reply.next_in_ms == (min(nexts) if nexts else -1)
        waiting = [
            w
            for w in self.open.values()
            if due_by(w.dl, w.id)
            and (self.view.held_moves_deadline or not (w.exclusive and self.in_progress(w.ident)))
        ]
        if len(expected) + held_now < limit:  # latency: nothing due is left behind by a pass
            assert not waiting
        elif waiting:
            assert reply.next_in_ms == 0  # the dispatcher passes again at once

    def in_progress(self, ident: str) -> bool:
        """A debounce_exclusive window of ``ident`` is closed and not yet over (the
        PostgreSQL store's reading: closed by a flush or the gate counts, taken or not)."""
        return any(
            w.ident == ident and w.exclusive and w.st in ("dispatching", "queued", "claimed")
            for w in self.wins.values()
        )

    def _free_run(self, win: Win, now: int) -> None:
        """An exclusive window's run ended or its claim lapsed: its key is free, and a
        window held behind it is due now."""
        if self.run_of.get(win.ident) == win.id:
            del self.run_of[win.ident]
            if self.held.pop(win.ident, None) is not None:
                behind = self.open.get(win.ident)
                if behind is not None and behind.hs is not None:
                    behind.dl = now

    def _ack(self, tid: str) -> None:
        t0 = self.clock()
        count = self.store.ack(0, [tid])
        t1 = self.clock()
        win = self.wins[tid]
        self.leased.pop(tid, None)
        became = win.st == "dispatching"
        if became:
            now = self.ran_at(t0, t1, lambda: self.view.written_at(tid, "queued"))
            win.st = "queued"
            win.pa = now
            self.active[tid] = now
        assert count == (1 if became else 0)

    # Rules are always enabled and do nothing when they do not apply: which rules
    # apply depends on the real clock in the real-server run, and Hypothesis must
    # draw the same rules whatever the timing.
    @rule(i=st.integers(0, 20))
    def publish_and_ack(self, i: int) -> None:
        if not self.inflight:
            return
        tid, _ = self.inflight.pop(i % len(self.inflight))
        self._publish(tid)
        self._ack(tid)

    @rule(i=st.integers(0, 20))
    def publish_fails_and_release(self, i: int) -> None:
        if not self.inflight:
            return
        tid, tries = self.inflight.pop(i % len(self.inflight))
        t0 = self.clock()
        released = self.store.release(0, self.release_ms, [Released(tid, tries)])
        t1 = self.clock()
        win = self.wins[tid]
        # only a lease that is still this dispatcher's moves (not one taken over since)
        if tid in self.leased and win.st == "dispatching" and win.tries == tries:
            lease_ends = self.view.written_at
            now = self.ran_at(t0, t1, lambda: lease_ends(tid, "lease") - self.release_ms)
            # moved even to the lease end it had (a release exactly the difference of
            # the two leases after the take: on the real clock, to the millisecond)
            assert released == 1
            self.leased[tid] = now + self.release_ms
        else:
            assert released == 0

    @rule(i=st.integers(0, 20), published=st.booleans())
    def dispatcher_dies(self, i: int, published: bool) -> None:
        """SIGKILL between take and ack: the message may or may not have reached the broker."""
        if not self.inflight:
            return
        tid, _ = self.inflight.pop(i % len(self.inflight))
        if published:
            self._publish(tid)

    def _publish(self, tid: str) -> None:
        win = self.wins[tid]
        win.publishes += 1
        self.broker.append(tid)

    # -- worker --------------------------------------------------------------
    @rule(i=st.integers(0, 20))
    def claim(self, i: int) -> None:
        if not self.broker:
            return
        tid = self.broker.pop(i % len(self.broker))
        t0 = self.clock()
        before, run = self.store.claim(0, tid, TASK)
        t1 = self.clock()
        win = self.wins[tid]
        assert before == win.st
        self.leased.pop(tid, None)
        expiry = self.claims.get(tid)
        if win.st == "claimed" and expiry is not None and t0 < expiry <= t1:
            # real clock only: the claim's lease ended while the claim ran, before or
            # after the store read its clock; which one, the store's answer says
            live = not run
        else:
            live = win.st == "claimed" and expiry is not None and expiry > t1
        if win.st == "finished" or live:  # a duplicate: skipped before the body
            assert not run
            win.skipped += 1
            if live:
                win.rd = True
            return
        assert run
        now = self.ran_at(t0, t1, lambda: self.view.written_at(tid, "claimed"))
        if before in ("dispatching", "queued"):
            win.first_claims += 1
        elif before == "claimed":  # its claim lapsed, not yet released: taken over
            win.stales += 1
        win.st, win.ca, win.rd = "claimed", now, False
        self.active.setdefault(tid, now)
        self.claims[tid] = now + self.claim_ms
        assert all(c <= now for c in win.calls)  # invariant 2: the run starts after each call
        win.runs.append(now)
        self.running.append(tid)

    @rule()
    def renew(self) -> None:
        """The renewal thread of the workers' processes: every running claim, once."""
        if not self.running:
            return
        running = list(dict.fromkeys(self.running))
        t0 = self.clock()
        self.store.renew_claims({0: running})
        t1 = self.clock()
        # only claims still held are renewed (a lapsed one released by a take, or a
        # finished one, is not brought back); the contract's renewal answers nothing,
        # so what it did is checked in the store's state after the step (the claims)
        held = [tid for tid in running if tid in self.claims]
        if not held:
            return
        claim_ends = self.view.written_at
        now = self.ran_at(t0, t1, lambda: claim_ends(held[0], "claim") - self.claim_ms)
        for tid in held:
            self.claims[tid] = now + self.claim_ms

    @rule(i=st.integers(0, 20), dies=st.booleans())
    def run_ends(self, i: int, dies: bool) -> None:
        if not self.running:
            return
        tid = self.running.pop(i % len(self.running))
        win = self.wins[tid]
        if dies:  # worker killed mid-run with acks_late: the broker redelivers
            win.redeliveries += 1
            self.broker.append(tid)
            return
        t0 = self.clock()
        finished, aliases = self.store.finish_run(0, tid, "SUCCESS")
        t1 = self.clock()
        now = self.ran_at(t0, t1, lambda: self.view.written_at(tid, "finished"))
        assert finished
        assert [a["id"] for a in aliases] == win.aliases
        self.leased.pop(tid, None)
        self.active.pop(tid, None)
        self.claims.pop(tid, None)
        win.st, win.rd = "finished", False
        win.fa = now
        if self.view.held_moves_deadline:
            self._free_run(win, now)
            return
        if self.run_of.get(win.ident) == win.id:
            del self.run_of[win.ident]
        behind = self.open.get(win.ident)
        if win.exclusive and behind is not None and behind.hs is not None:
            behind.dl = min(behind.dl, now)

    # -- invariants ----------------------------------------------------------
    @invariant()
    def store_equals_model(self) -> None:
        self.view.check(self)

    @invariant()
    def runs_once_unless_a_crash_case(self) -> None:
        for win in self.wins.values():
            # invariant 4, from what the store returned: one first claim at most; any other
            # run follows a second take (lease expired) or a redelivery
            assert win.first_claims <= 1
            assert len(win.runs) <= 1 + max(0, win.taken - 1) + win.redeliveries
            assert win.publishes <= win.taken
            # effectively once: a body runs again only after its previous claim lapsed
            assert len(win.runs) <= 1 + win.stales

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            self.store.delete_all()  # the next example starts on an empty store

    def _drain(self) -> None:
        """Let everything run; then every call's window has run, at or after the call."""
        self.inflight.clear()  # whoever held them is gone
        for _ in range(200):
            if all(
                w.cancelled or (w.runs and w.st == "finished") for w in self.wins.values()
            ) and not (self.broker or self.running):
                break
            if self.exact_clock:
                self.advance(1500)
            else:
                time.sleep(0.05)
            self.take(4)
            while self.inflight:
                self.publish_and_ack(0)
            while self.broker:
                self.claim(0)
            while self.running:
                self.run_ends(0, False)
            self.store_equals_model()
        for win in self.wins.values():
            if win.cancelled:
                assert not win.runs
                continue
            assert win.runs, f"window {win.id} never ran: calls lost"
            assert win.st == "finished"
            assert min(win.runs) >= max(win.calls)  # invariant 2


@pytest.fixture
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The contract suite's harness named by the test's parameter."""
    made = harness_named(request.param, request)
    try:
        yield made
    finally:
        made.close()


def machine_on(harness: Harness, exact_clock: bool, scale: int) -> type[GateMachine]:
    """The model's machine on a store of ``harness`` (one store for every example)."""
    store = model_store(harness, scale)

    class OnStore(GateMachine):
        pass

    OnStore.store, OnStore.view = store, state_view(store, harness)
    OnStore.exact_clock, OnStore.scale = exact_clock, scale
    return OnStore


@pytest.mark.timeout(600)
@pytest.mark.parametrize("harness", ["fakeredis"], indirect=True)
def test_the_store_matches_the_model_on_a_controlled_clock(harness: Harness) -> None:
    run = settings(
        max_examples=150,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    with fake_clock():
        run_state_machine_as_test(machine_on(harness, True, 1), settings=run)


@pytest.mark.parametrize(
    "harness",
    [
        "redis",
        pytest.param("cluster", marks=pytest.mark.cluster),
        "postgres",
        pytest.param("pgbouncer", marks=pytest.mark.pgbouncer),
    ],
    indirect=True,
)
def test_the_store_matches_the_model_on_a_real_clock(harness: Harness) -> None:
    run = settings(
        max_examples=12,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    run_state_machine_as_test(machine_on(harness, False, 10), settings=run)
