"""Stateful property test: the real Lua scripts against a small pure-Python model.

Hypothesis interleaves calls (keys, payloads, per-call windows and max waits,
replace flag), clock advances, dispatcher steps (take, publish+ack, failed
publish+release, crash before or after publishing) and worker steps (claim,
finish, death mid-run with redelivery). After every step the whole Redis
keyspace of the package must equal the model's, and the invariants of
docs/guarantees.md must hold. At the end everything is drained: every call's
window must have run, at or after the call.

Two runs of the same machine:

* fakeredis + lupa with a controlled clock: the seam is fakeredis's ``TIME``
  command, whose module-level ``time`` is replaced for the test
  (``fakeredis.commands_mixins.server_mixin.time``). The scripts are unchanged.
* a real redis-server with the real clock (shorter): the model then takes
  "now" from each script's own reply, so it stays exact.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
import redis
from fakeredis.commands_mixins import server_mixin
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from celery_debounce.backend import Backend, script_source
from celery_debounce.call import PreparedCall
from celery_debounce.dispatcher import take_due
from celery_debounce.gate import enter
from celery_debounce.keys import window_ident
from celery_debounce.options import DebounceSpec
from celery_debounce.settings import Settings

TASK = "model.task"
KEYS = ["a", "b", "c", "k:{x}", "d"]
LEASE_MS = 1000
RELEASE_MS = 300
T0 = 1_700_000_000_000  # fake clock start, ms


class Clock:
    """Stands in for the ``time`` module inside fakeredis's TIME command."""

    now_ms: int | None = None

    @classmethod
    def time(cls) -> float:
        return time.time() if cls.now_ms is None else cls.now_ms / 1000


@contextmanager
def fake_clock() -> Iterator[None]:
    saved = server_mixin.time
    server_mixin.time = Clock  # type: ignore[assignment]
    Clock.now_ms = T0
    try:
        yield
    finally:
        server_mixin.time = saved
        Clock.now_ms = None


def make_settings(prefix: str, lease_ms: int) -> Settings:
    return Settings(
        redis_url="redis://unused", key_prefix=prefix, shards=1, dispatcher=False,
        poll_interval_ms=1000, dispatch_batch=3, dispatch_lease_ms=lease_ms,
        history_ttl_ms=86_400_000, record_ttl_ms=86_400_000, redis_timeout_s=3.0,
        max_key_length=1024, max_payload_bytes=1 << 20,
    )


def backend_on(client: redis.Redis, settings: Settings) -> Backend:
    """A Backend on an existing client (fakeredis or real)."""
    backend = Backend.__new__(Backend)
    backend.settings = settings
    backend.client = client
    backend.scripts = {
        name: client.register_script(script_source(name))
        for name in ("gate", "take", "ack", "release", "claim", "finish")
    }
    return backend


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


class GateMachine(RuleBasedStateMachine):
    client: redis.Redis  # set per example on the fake clock, per class on a real server
    exact_clock: bool = True
    scale: int = 1  # durations are divided by this (the real-clock run is 10x faster)

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"m{uuid.uuid4().hex[:8]}"
        if self.exact_clock:  # a fresh server and clock per example: replays are exact
            Clock.now_ms = T0
            self.client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
        self.ids = itertools.count()
        self.lease_ms = LEASE_MS // self.scale
        self.release_ms = RELEASE_MS // self.scale
        self.settings = make_settings(self.prefix, self.lease_ms)
        self.tag = self.settings.tag(0)
        self.backend = backend_on(self.client, self.settings)
        self.open: dict[str, Win] = {}  # ident -> pending window
        self.wins: dict[str, Win] = {}  # id -> every window ever opened
        self.leased: dict[str, int] = {}
        self.active: dict[str, int] = {}
        # (id, tries) a live dispatcher holds (taken, not yet published)
        self.inflight: list[tuple[str, int]] = []
        self.broker: list[str] = []  # messages waiting for a worker
        self.running: list[str] = []  # runs in progress
        self.last_now = 0

    # -- clock ---------------------------------------------------------------
    def now(self) -> int:
        assert Clock.now_ms is not None
        return Clock.now_ms

    def seen_now(self, reported: int) -> int:
        """The script's own clock: exact under the fake clock, monotonic on a real one."""
        if self.exact_clock:
            assert reported == self.now()
        assert reported >= self.last_now
        self.last_now = reported
        return reported

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
    )
    def call(self, key: str, payload: bytes, window: int, extra: int, replace: bool) -> None:
        ident = window_ident(TASK, key)
        window, extra = max(1, window // self.scale), extra // self.scale
        spec = DebounceSpec(window, window + extra, None, replace)
        call = PreparedCall(TASK, key, ident, 0, f"id-{next(self.ids):05d}", spec,
                            "application/data", payload, "{}")
        result = enter(self.backend, call)
        now = self.seen_now(result.now_ms)
        win = self.open.get(ident)
        if win is None:
            assert result.opened and result.task_id == call.task_id
            win = Win(call.task_id, ident, now, min(now + window, now + window + extra),
                      now + window + extra, 1, payload)
            self.open[ident] = win
            self.wins[win.id] = win
        else:
            assert not result.opened and result.task_id == win.id
            win.dl = min(now + window, win.mw)
            win.n += 1
            if replace:
                win.payload = payload
        win.calls.append(now)
        assert (result.deadline_ms, result.calls) == (win.dl, win.n)
        assert win.fs <= win.dl <= win.mw  # invariant 3: never past the ceiling

    # -- dispatcher ----------------------------------------------------------
    @rule(limit=st.integers(1, 4))
    def take(self, limit: int) -> None:
        reply = take_due(self.backend, 0, limit)
        now = self.seen_now(reply.now_ms)
        expected: list[str] = []
        leases = sorted(self.leased.items(), key=lambda kv: (kv[1], kv[0].encode()))
        for tid, _ in [kv for kv in leases if kv[1] <= now][:limit]:
            win = self.wins[tid]
            if win.st == "dispatching":
                self.leased[tid] = now + self.lease_ms
                win.tries += 1
                expected.append(tid)
            else:
                del self.leased[tid]
        due = sorted(self.open.values(), key=lambda w: (w.dl, w.ident.encode()))
        for win in due:
            if win.dl > now or len(expected) >= limit:
                break
            del self.open[win.ident]
            win.st, win.ta, win.tries = "dispatching", now, 1
            self.leased[win.id] = now + self.lease_ms
            expected.append(win.id)
        assert [w.task_id for w in reply.windows] == expected
        for w in reply.windows:
            model = self.wins[w.task_id]
            assert w.ident == model.ident and w.payload == model.payload
            assert (w.first_seen_ms, w.deadline_ms, w.max_wait_ms, w.calls, w.tries) == (
                model.fs, model.dl, model.mw, model.n, model.tries)
            assert w.taken_ms >= w.deadline_ms  # never early
        self.inflight.extend((tid, self.wins[tid].tries) for tid in expected)
        nexts = [max(0, w.dl - now) for w in self.open.values()]
        nexts += [max(0, u - now) for u in self.leased.values()]
        assert reply.next_in_ms == (min(nexts) if nexts else -1)
        if len(expected) < limit:  # latency: nothing due is left behind by a pass
            assert all(w.dl > now for w in self.open.values())

    def _ack(self, tid: str) -> None:
        count = self.backend.run("ack", [f"{self.tag}:leased", f"{self.tag}:active"],
                                 [self.tag, tid])
        win = self.wins[tid]
        self.leased.pop(tid, None)
        became = win.st == "dispatching"
        if became:
            win.st = "queued"
            win.pa = self.now() if self.exact_clock else None
            self.active[tid] = win.pa if win.pa is not None else -1
        assert count == (1 if became else 0)

    @precondition(lambda self: self.inflight)
    @rule(i=st.integers(0, 20))
    def publish_and_ack(self, i: int) -> None:
        tid, _ = self.inflight.pop(i % len(self.inflight))
        self._publish(tid)
        self._ack(tid)

    @precondition(lambda self: self.inflight)
    @rule(i=st.integers(0, 20))
    def publish_fails_and_release(self, i: int) -> None:
        tid, tries = self.inflight.pop(i % len(self.inflight))
        released = self.backend.run("release", [f"{self.tag}:leased"],
                                    [self.release_ms, self.tag, tid, tries])
        win = self.wins[tid]
        # only a lease that is still this dispatcher's moves (not one taken over since)
        if tid in self.leased and win.st == "dispatching" and win.tries == tries:
            if self.exact_clock:
                new = self.now() + self.release_ms
                assert released == (1 if new != self.leased[tid] else 0)
                self.leased[tid] = new
            else:  # release.lua reports no time: read the new expiry back
                self.leased[tid] = int(self.client.zscore(f"{self.tag}:leased", tid) or 0)
                assert self.leased[tid] >= self.last_now
        else:
            assert released == 0

    @precondition(lambda self: self.inflight)
    @rule(i=st.integers(0, 20), published=st.booleans())
    def dispatcher_dies(self, i: int, published: bool) -> None:
        """SIGKILL between take and ack: the message may or may not have reached the broker."""
        tid, _ = self.inflight.pop(i % len(self.inflight))
        if published:
            self._publish(tid)

    def _publish(self, tid: str) -> None:
        win = self.wins[tid]
        win.publishes += 1
        self.broker.append(tid)

    # -- worker --------------------------------------------------------------
    @precondition(lambda self: self.broker)
    @rule(i=st.integers(0, 20))
    def claim(self, i: int) -> None:
        tid = self.broker.pop(i % len(self.broker))
        before = self.backend.run(
            "claim", [f"{self.tag}:win:{tid}", f"{self.tag}:leased", f"{self.tag}:active"], [tid])
        win = self.wins[tid]
        assert before == win.st.encode()
        self.leased.pop(tid, None)
        now = self.now() if self.exact_clock else None
        if win.st in ("dispatching", "queued"):
            win.st, win.ca = "claimed", now
            self.active.setdefault(tid, now if now is not None else -1)
        assert all(c <= (now if now is not None else c) for c in win.calls)
        win.runs.append(now if now is not None else time.time_ns())
        self.running.append(tid)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 20), dies=st.booleans())
    def run_ends(self, i: int, dies: bool) -> None:
        tid = self.running.pop(i % len(self.running))
        win = self.wins[tid]
        if dies:  # worker killed mid-run with acks_late: the broker redelivers
            win.redeliveries += 1
            self.broker.append(tid)
            return
        done = self.backend.run(
            "finish", [f"{self.tag}:win:{tid}", f"{self.tag}:leased", f"{self.tag}:active"],
            [tid, "SUCCESS", self.settings.history_ttl_ms])
        assert done == 1
        self.leased.pop(tid, None)
        self.active.pop(tid, None)
        win.st = "finished"
        win.fa = self.now() if self.exact_clock else None

    # -- invariants ----------------------------------------------------------
    @invariant()
    def redis_equals_model(self) -> None:
        c, tag = self.client, self.tag
        assert {m.decode(): int(s) for m, s in c.zrange(f"{tag}:due", 0, -1, withscores=True)} \
            == {w.ident: w.dl for w in self.open.values()}  # invariant 1: one open per ident
        leased = {m.decode(): int(s) for m, s in c.zrange(f"{tag}:leased", 0, -1, withscores=True)}
        assert leased == self.leased
        active = {m.decode(): int(s) for m, s in c.zrange(f"{tag}:active", 0, -1, withscores=True)}
        assert set(active) == set(self.active)
        if self.exact_clock:
            assert active == self.active
        keys = {k.decode() for k in c.scan_iter(match=f"{self.prefix}:*", count=1000)}
        keys.discard(f"{tag}:stats")  # dispatch counters, not window state
        expected_keys = {f"{tag}:open:{i}" for i in self.open}
        expected_keys |= {f"{tag}:win:{w.id}" for w in self.wins.values() if w.st != "pending"}
        expected_keys |= {f"{tag}:{z}" for z, m in
                          (("due", self.open), ("leased", self.leased), ("active", self.active))
                          if m}
        assert keys == expected_keys
        for win in self.wins.values():
            key = f"{tag}:open:{win.ident}" if win.st == "pending" else f"{tag}:win:{win.id}"
            rec = {k.decode(): v for k, v in c.hgetall(key).items()}
            self._check_record(win, rec)

    def _check_record(self, win: Win, rec: dict[str, bytes]) -> None:
        # mw holds the max wait (ceiling = fs + mw); a pending window's deadline is
        # only its due score (checked above), a taken one's is copied into dl
        want: dict[str, Any] = {"id": win.id, "fs": win.fs, "mw": win.mw - win.fs,
                                "n": win.n, "ct": "application/data"}
        if win.st == "pending":
            assert "dl" not in rec
        else:
            want.update(dl=win.dl, st=win.st, i=win.ident, ta=win.ta, tries=win.tries)
        if win.st == "finished":
            want.update(rs="SUCCESS")
        assert "o" not in rec  # default options ("{}") are not stored
        got = {k: rec.get(k, b"").decode() for k in want}
        assert got == {k: str(v) for k, v in want.items()}, win.id
        assert rec.get("p") == (None if win.st == "finished" else win.payload)
        if self.exact_clock:
            for name in ("pa", "ca", "fa"):
                value = getattr(win, name)
                assert rec.get(name) == (None if value is None else str(value).encode())
        # invariant 5: once handed to the broker, the record's call data never changes
        snapshot = {k: v for k, v in rec.items() if k in ("id", "fs", "dl", "mw", "n", "p", "o")}
        if win.st in ("queued", "claimed"):
            if win.frozen is None:
                win.frozen = snapshot
            assert snapshot == win.frozen

    @invariant()
    def runs_once_unless_a_crash_case(self) -> None:
        for win in self.wins.values():
            # invariant 4: more runs than one only from a duplicate publish or a redelivery
            assert len(win.runs) <= 1 + max(0, win.publishes - 1) + win.redeliveries

    def teardown(self) -> None:
        try:
            self._drain()
        finally:
            for key in self.client.scan_iter(match=f"{self.prefix}:*", count=1000):
                self.client.delete(key)

    def _drain(self) -> None:
        """Let everything run; then every call's window has run, at or after the call."""
        self.inflight.clear()  # whoever held them is gone
        for _ in range(200):
            if all(w.runs and w.st == "finished" for w in self.wins.values()) and not (
                    self.broker or self.running):
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
            self.redis_equals_model()
        for win in self.wins.values():
            assert win.runs, f"window {win.id} never ran: calls lost"
            assert win.st == "finished"
            if self.exact_clock:  # invariant 2: the run starts at or after every call
                assert min(win.runs) >= max(win.calls)


@pytest.mark.timeout(600)
def test_scripts_match_the_model_on_a_controlled_clock() -> None:
    run = settings(max_examples=150, stateful_step_count=40, deadline=None,
                   suppress_health_check=list(HealthCheck))
    with fake_clock():
        run_state_machine_as_test(GateMachine, settings=run)


def test_scripts_match_the_model_on_a_real_redis_server(redis_client: redis.Redis) -> None:
    class OnReal(GateMachine):
        client = redis_client
        exact_clock = False
        scale = 10

        def now(self) -> int:
            return self.last_now

    run = settings(max_examples=12, stateful_step_count=25, deadline=None,
                   suppress_health_check=list(HealthCheck))
    run_state_machine_as_test(OnReal, settings=run)

