"""What every windows' store must do, written once against the store contract's
Protocols (celery_debounce.store.api) and run against each implementation (the
``harness`` fixture, conftest.py). The cases use only the Protocols' members, the
domain types and the typed errors: no key, script, client or reply of any store."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import pytest
from helpers import wait_until

from celery_debounce.aliases import fixed_id
from celery_debounce.errors import DebounceBackendError
from celery_debounce.producer.call import PreparedCall, prepare_call
from celery_debounce.producer.options import build_spec
from celery_debounce.settings import Settings
from celery_debounce.store.api import (
    BaseStore,
    DispatcherStore,
    OperatorStore,
    ProducerStore,
    Store,
    WorkerStore,
)
from celery_debounce.store.domain import (
    CancelOutcomeUnknown,
    ClaimResult,
    FinishResult,
    OutcomeUnknown,
    PayloadTooLarge,
    Released,
    ReplaceRefused,
    StoreUnavailable,
)
from celery_debounce.store.idents import TakenGroup, ident_prefix, shard_of, window_ident
from celery_debounce.store.records import Record
from celery_debounce.store.results import GateResult, HeldFront, TakenWindow
from celery_debounce.worker.retry_queue import worth_keeping

from .conftest import Harness


class Gated(NamedTuple):
    """A call as gated: the store's answer and the call's shard and ident."""

    result: GateResult
    call: PreparedCall

    @property
    def task_id(self) -> str:
        return self.result.task_id


def prepared(
    store: ProducerStore,
    key: str,
    *,
    window: str = "1m",
    max_wait: str = "5m",
    payload: Any = 0,
    task_id: str | None = None,
    exclusive: bool = False,
    max_calls: int | None = None,
    leading: bool = False,
    trailing: bool = True,
    collect: bool = False,
    pad: str = "",
    settings: Settings | None = None,
    replace_payload: bool = False,
    serializer: str = "json",
    task: str = "t",
) -> PreparedCall:
    """One call of ``task`` keyed ``key``, as the producer prepares it."""
    spec = build_spec(
        window,
        "{0}",
        max_wait,
        replace_payload,
        max_calls,
        leading,
        trailing,
        collect=collect,
        exclusive=exclusive,
    )
    options: dict[str, object] = {}
    kwargs = {"pad": pad} if pad else {}
    return prepare_call(
        settings or store.settings,
        task,
        spec,
        (key, payload),
        kwargs,
        options,
        None,
        serializer,
        task_id,
    )


def gate(store: ProducerStore, key: str, **options: Any) -> Gated:
    """One call (:func:`prepared`'s options) through :meth:`ProducerStore.gate`."""
    call = prepared(store, key, **options)
    return Gated(store.gate(call, fixed_id(options.get("task_id"), {})), call)


def take_due(store: DispatcherStore, shard: int, timeout: float = 5.0) -> list[TakenWindow]:
    """The windows of ``shard`` a take returns, once one does."""
    found: list[TakenWindow] = wait_until(lambda: store.take(shard, 10).windows, timeout=timeout)
    return found


def run(store: Store, key: str, **options: Any) -> Gated:
    """A call whose window is due at once, taken, published (acked) and claimed."""
    gated = gate(store, key, window="1ms", max_wait="1s", **options)
    (taken,) = take_due(store, gated.call.shard)
    assert taken.task_id == gated.task_id
    assert store.ack(gated.call.shard, [taken.task_id]) == 1
    assert store.claim(gated.call.shard, taken.task_id, "t") == ClaimResult("queued", True)
    return gated


def held_windows(store: Store, shard: int) -> dict[str, tuple[int, str | None]]:
    """The held windows of ``shard`` as ``open_windows`` reports them: ident -> (held
    since ms, the run each waits for)."""
    return {
        r.ident or "": (r.held_since_ms, r.waits_for)
        for r in store.open_windows(shard)
        if r.held_since_ms is not None
    }


# -- the Protocols -----------------------------------------------------------------------


def test_the_store_satisfies_every_role(store: Store) -> None:
    """Checked statically (mypy runs over this file) and here by member name."""
    producer: ProducerStore = store
    dispatcher: DispatcherStore = store
    worker: WorkerStore = store
    operator: OperatorStore = store
    for role in (BaseStore, ProducerStore, DispatcherStore, WorkerStore, OperatorStore):
        members = {name for name in vars(role) if not name.startswith("_")}
        assert members and all(
            callable(getattr(store, name)) or name in ("settings", "layout") for name in members
        ), role
    assert {id(producer), id(dispatcher), id(worker), id(operator)} == {id(store)}


# -- open or join, atomically ------------------------------------------------------------


def test_racing_calls_open_one_window_and_every_other_call_joins_it(store: Store) -> None:
    threads, per_thread = 8, 5
    results: list[GateResult] = []
    start = threading.Barrier(threads)

    def caller() -> None:
        start.wait()
        for i in range(per_thread):
            results.append(gate(store, "k", payload=i).result)

    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(30)
    assert len(results) == threads * per_thread
    assert sum(r.opened for r in results) == 1
    assert len({r.task_id for r in results}) == 1
    assert sorted(r.calls for r in results) == list(range(1, threads * per_thread + 1))


def test_a_join_moves_the_deadline_never_past_the_openers_ceiling(store: Store) -> None:
    first = gate(store, "k", window="1m", max_wait="90s").result
    assert first.opened and first.calls == 1
    assert first.deadline_ms == first.now_ms + 60_000
    second = gate(store, "k", window="1m", max_wait="90s").result
    assert (second.opened, second.task_id, second.calls) == (False, first.task_id, 2)
    assert second.deadline_ms >= first.deadline_ms
    third = gate(store, "k", window="10m", max_wait="1h").result  # a longer per-call window
    assert third.deadline_ms == first.now_ms + 90_000


def test_a_due_window_is_taken_once_and_the_next_call_opens_a_new_one(store: Store) -> None:
    first = gate(store, "k", window="10ms", max_wait="1s", payload=1)
    (taken,) = take_due(store, first.call.shard)
    assert (taken.task_id, taken.key, taken.task_name, taken.calls) == (first.task_id, "k", "t", 1)
    assert taken.deadline_ms <= taken.taken_ms
    again = gate(store, "k", window="10ms", max_wait="1s", payload=2)
    assert again.result.opened and again.task_id != first.task_id
    assert [w.task_id for w in take_due(store, first.call.shard)] == [again.task_id]


# -- claimed windows, leases -------------------------------------------------------------


def test_a_claimed_window_is_never_pulled_back_a_call_during_its_run_opens_a_new_one(
    store: Store,
) -> None:
    first = run(store, "k")
    shard = first.call.shard
    during = gate(store, "k")  # while the run is in flight
    assert during.result.opened and during.task_id != first.task_id
    assert gate(store, "k").task_id == during.task_id
    # a redelivery under the live claim is a duplicate: it must not run
    assert store.claim(shard, first.task_id, "t") == ClaimResult("claimed", False)
    assert store.finish_run(shard, first.task_id, "SUCCESS") == FinishResult(True, [])
    assert store.finish_run(shard, first.task_id, "SUCCESS").finished  # idempotent
    # a republished message after the run: never claimed again
    assert store.claim(shard, first.task_id, "t") == ClaimResult("finished", False)
    assert _counters(store).get("d|t") == 2  # both duplicates counted (stats)
    assert store.pending(shard, first.call.ident) is not None  # the new window, untouched
    # a record that is gone (past its TTL) runs: at least once
    assert store.claim(shard, "gone", "t") == ClaimResult("", True)


def test_an_unacknowledged_take_is_taken_again_after_its_dispatch_lease(harness: Harness) -> None:
    store = harness.build(dispatch_lease_ms=100)
    first = gate(store, "k", window="1ms", max_wait="1s")
    (taken,) = take_due(store, first.call.shard)
    assert taken.tries == 1
    (again,) = take_due(store, first.call.shard)  # the dispatcher "died": no ack
    assert again.task_id == first.task_id and again.tries == 2
    assert store.ack(first.call.shard, [first.task_id]) == 1
    assert store.take(first.call.shard, 10).windows == []


def test_a_take_stops_once_its_bodies_reach_its_bytes(harness: Harness) -> None:
    """A take leases windows until their bodies reach ``debounce_dispatch_batch_bytes``
    as well as up to its count: at most that plus one window, the first whatever its
    size. The rest stay due for the next take; each window is taken once, leased ones
    that lapsed included."""
    store = harness.build(dispatch_batch_bytes=50_000, dispatch_lease_ms=1_000, shards=1)
    gated = [gate(store, f"k{n}", window="1ms", max_wait="1s", pad="x" * 20_000) for n in range(6)]
    shard = gated[0].call.shard
    latest = max(g.result.deadline_ms for g in gated)
    wait_until(lambda: store.time_ms() > latest, timeout=5)  # all six due: a take's bytes decide
    first = store.take(shard, 10).windows
    second = store.take(shard, 10).windows
    assert [len(first), len(second)] == [3, 3]
    for batch in (first, second):
        assert sum(len(w.record.payload) for w in batch[:-1]) < 50_000
    taken = {w.task_id for w in first + second}
    assert taken == {g.task_id for g in gated}
    assert store.take(shard, 10).windows == []
    # the six lapse unacknowledged: taken again, at most three at a time
    again: list[TakenWindow] = []

    def retaken() -> bool:
        batch = store.take(shard, 10).windows
        assert len(batch) <= 3
        again.extend(batch)
        return len(again) >= 6

    wait_until(retaken, timeout=10)
    assert sorted(w.task_id for w in again) == sorted(taken)


def test_a_released_window_is_taken_again_after_the_delay(store: Store) -> None:
    first = gate(store, "k", window="1ms", max_wait="1s")
    shard = first.call.shard
    (taken,) = take_due(store, shard)
    assert store.release(shard, 50, [Released(taken.task_id, taken.tries)]) == 1
    (again,) = take_due(store, shard)
    assert again.task_id == first.task_id


def test_a_claim_lives_while_renewed_and_a_lapsed_one_runs_again(harness: Harness) -> None:
    store = harness.build(claim_lease_ms=600)
    first, lapsed = run(store, "k"), run(store, "other")
    for _ in range(4):  # 0.8 s of renewals every 0.2 s, with takes between: still live
        time.sleep(0.2)
        store.renew_claims({first.call.shard: [first.task_id, "never-claimed"]})
        store.take(first.call.shard, 10)
        store.take(lapsed.call.shard, 10)
    # not renewed: lapsed within its lease, released by a take; its redelivery runs
    assert store.claim(lapsed.call.shard, lapsed.task_id, "t") == ClaimResult("stale", True)
    store.renew_claims({lapsed.call.shard: [lapsed.task_id]})
    shard = first.call.shard
    # renewed: live, a redelivery is a duplicate (skipped) ...
    assert store.claim(shard, first.task_id, "t") == ClaimResult("claimed", False)
    time.sleep(0.7)  # ... and when the claim then lapses, the window is published again
    assert [w.task_id for w in store.take(shard, 10).windows] == [first.task_id]
    store.renew_claims({shard: [first.task_id]})  # a late renewal brings nothing back
    assert store.claim(shard, first.task_id, "t") == ClaimResult("dispatching", True)
    # a retry of the run takes a live claim over
    assert store.claim(shard, first.task_id, "t", retry=True) == ClaimResult("claimed", True)


def test_an_ended_claim_is_taken_over_by_the_next_delivery(store: Store) -> None:
    first = run(store, "k")
    shard = first.call.shard
    store.end_claim(shard, first.task_id)
    store.take(shard, 10)  # the ended claim lapses here
    assert store.claim(shard, first.task_id, "t") == ClaimResult("stale", True)


def test_a_put_back_window_is_claimed_again_by_its_next_delivery(store: Store) -> None:
    first = run(store, "k")
    shard = first.call.shard
    assert store.put_back(shard, first.task_id)
    assert store.claim(shard, first.task_id, "t") == ClaimResult("queued", True)
    assert not store.put_back(shard, "never-claimed")


def test_a_lapsed_claim_of_the_last_delivery_is_finished_revoked_by_the_expiry_sweep(
    harness: Harness,
) -> None:
    """A claim on the last delivery its quorum queue allows (``last_delivery``) that
    lapses (its worker killed): nothing delivers the message again, so the window is
    neither left stale nor published again; the expiry sweep finishes it as REVOKED
    (returned until its outcome is stored) and frees its exclusive key."""
    store = harness.build(claim_lease_ms=300)
    first = gate(store, "k", window="1ms", max_wait="1s", exclusive=True)
    shard = first.call.shard
    (taken,) = take_due(store, shard)
    assert store.ack(shard, [taken.task_id]) == 1
    claimed = store.claim(shard, first.task_id, "t", last_delivery=True)
    assert claimed == ClaimResult("queued", True)
    second = gate(store, "k", window="1ms", max_wait="1s", exclusive=True, payload=1)
    time.sleep(0.4)  # the claim lapses at the next take: not published, the key held
    assert store.take(shard, 10).windows == []
    swept = wait_until(lambda: store.expire(shard), timeout=5)
    assert [task_id for task_id, _ in swept] == [first.task_id]
    assert store.claim(shard, first.task_id, "t") == ClaimResult("finished", False)
    store.expired(shard, [first.task_id])
    assert store.expire(shard) == []
    (follow,) = take_due(store, shard, timeout=3)  # the key is free
    assert follow.task_id == second.task_id


def test_a_lapsed_claim_of_an_exclusive_window_frees_its_key_for_the_held_follow_up(
    harness: Harness,
) -> None:
    """An exclusive window's claim lapses (its worker was killed): the take that finds
    it lapsed frees the key, so the follow-up held behind it is taken with every call it
    got; the lapsed run's own redelivery finds its claim stale and runs."""
    store = harness.build(claim_lease_ms=300)
    first = run(store, "k", exclusive=True)
    shard = first.call.shard
    second = gate(store, "k", window="1ms", max_wait="1s", exclusive=True, payload=1)
    gate(store, "k", window="1ms", max_wait="1s", exclusive=True, payload=2)
    time.sleep(0.05)
    assert store.take(shard, 10).windows == []  # held behind the live claim
    time.sleep(0.4)  # the claim lapses
    (follow,) = take_due(store, shard, timeout=3)  # the key is free again
    assert follow.task_id == second.task_id and follow.calls == 2
    assert held_windows(store, shard) == {}
    assert store.claim(shard, first.task_id, "t") == ClaimResult("stale", True)


def test_a_quarantined_window_leaves_the_take_for_good_with_its_callers_ids(
    harness: Harness,
) -> None:
    """A taken window the dispatcher sets aside (its record cannot make a message) is
    never taken again, even past its lease; its callers' ids are returned (they are
    told it failed); a later call opens a new window."""
    store = harness.build(dispatch_lease_ms=100)
    opener = gate(store, "k", window="1ms", max_wait="1s", task_id="A")
    assert gate(store, "k", window="1ms", max_wait="1s", task_id="B").task_id == "A"
    shard = opener.call.shard
    (taken,) = take_due(store, shard)
    aliases = store.quarantine(shard, taken.task_id, "cannot make a message")
    assert aliases is not None and [alias["id"] for alias in aliases] == ["B"]
    time.sleep(0.2)  # past the dispatch lease
    assert store.take(shard, 10).windows == []
    assert store.quarantine(shard, "never-taken", "why") is None
    again = gate(store, "k", window="1ms", max_wait="1s")
    (follow,) = take_due(store, shard)
    assert follow.task_id == again.task_id != "A"
    assert store.take(shard, 10).windows == []


# -- holds (debounce_exclusive) ----------------------------------------------------------


def test_an_exclusive_window_due_while_its_key_runs_is_held_until_the_run_ends(
    store: Store,
) -> None:
    first = run(store, "k", exclusive=True)
    shard = first.call.shard
    second = gate(store, "k", window="1ms", max_wait="1s", exclusive=True, payload=1)
    time.sleep(0.05)
    assert store.take(shard, 10).windows == []  # held, not taken
    ((ident, (since, waits_for)),) = held_windows(store, shard).items()
    assert (ident, waits_for) == (first.call.ident, first.task_id) and since > 0
    joined = gate(store, "k", window="1ms", max_wait="1s", exclusive=True, payload=2)
    assert (joined.result.opened, joined.task_id, joined.result.calls) == (False, second.task_id, 2)
    store.finish_run(shard, first.task_id, "SUCCESS")
    (follow,) = take_due(store, shard, timeout=3)
    assert follow.task_id == second.task_id and follow.calls == 2
    assert held_windows(store, shard) == {}


def test_a_run_is_late_past_its_ceiling_or_past_the_end_of_the_run_it_was_held_behind(
    store: Store,
) -> None:
    """``ceiling_lateness_ms`` (the worker's max-wait measure): a run that starts before
    its ceiling is not late; a debounce_exclusive window held past its own ceiling
    behind a run is late only from that run's end; no measure for an unknown window."""
    first = run(store, "k", exclusive=True)  # max wait 1s
    shard = first.call.shard
    assert store.ceiling_lateness_ms(shard, "never-taken") is None
    late = store.ceiling_lateness_ms(shard, first.task_id)
    assert late is not None and -1000 <= late <= 0
    second = gate(store, "k", window="1ms", max_wait="1s", exclusive=True, payload=1)
    time.sleep(0.05)
    assert store.take(shard, 10).windows == []  # held behind the first run
    time.sleep(1.5)  # past its own ceiling (its first call + 1s)
    store.finish_run(shard, first.task_id, "SUCCESS")
    (follow,) = take_due(store, shard, timeout=3)
    assert follow.task_id == second.task_id
    late = store.ceiling_lateness_ms(shard, follow.task_id)
    assert late is not None and late < 300  # over 500 ms past its own ceiling


def test_a_replacing_join_of_another_serializer_is_refused_with_nothing_written(
    store: Store,
) -> None:
    first = gate(store, "k", replace_payload=True, payload=1)
    with pytest.raises(ReplaceRefused, match=first.task_id):
        gate(store, "k", replace_payload=True, payload=2, serializer="pickle")
    joined = gate(store, "k", replace_payload=True, payload=3).result
    assert joined.task_id == first.task_id and joined.calls == 2  # the refused one: none


# -- caller ids --------------------------------------------------------------------------


def test_a_fixed_id_opens_under_it_or_is_recorded_as_an_alias_of_the_window_it_joins(
    store: Store,
) -> None:
    opener = gate(store, "k", window="1ms", max_wait="1s", task_id="A")
    assert opener.result.opened and opener.task_id == "A"
    joiner = gate(store, "k", window="1ms", max_wait="1s", task_id="B")
    assert not joiner.result.opened and joiner.task_id == "A"
    shard = opener.call.shard
    (taken,) = take_due(store, shard)
    store.ack(shard, [taken.task_id])
    assert store.claim(shard, "A", "t").run
    finished = store.finish_run(shard, "A", "SUCCESS")
    assert finished.finished and [alias["id"] for alias in finished.aliases] == ["B"]
    # a caller id in use (A ran) is never reused: the next window gets another id
    again = gate(store, "k", task_id="A")
    assert again.result.opened and again.task_id != "A"


# -- collect bounds, caps ----------------------------------------------------------------


def test_a_collect_window_full_by_bytes_is_due_at_once_and_the_call_opens_the_next(
    harness: Harness,
) -> None:
    store = harness.build(max_payload_bytes=400)
    results = [
        gate(store, "k", payload=i, collect=True, pad="x" * 40, window="1h", max_wait="2h")
        for i in range(12)
    ]
    ids = list(dict.fromkeys(r.task_id for r in results))
    assert len(ids) >= 2
    assert [r.result.opened for r in results].count(True) == len(ids)
    shard = results[0].call.shard
    taken = store.take(shard, 10).windows  # every full window, at once
    assert sorted(w.task_id for w in taken) == sorted(ids[:-1])  # due in the same ms
    assert all(len(w.payload) <= 400 for w in taken)
    assert store.pending(shard, results[0].call.ident) is not None  # the last, open


def test_a_collect_call_too_large_for_an_empty_window_is_refused_with_nothing_written(
    harness: Harness,
) -> None:
    store = harness.build(max_payload_bytes=200)
    # a producer whose own bound is higher (its call passed its check): the store refuses
    producer = replace(store.settings, max_payload_bytes=10_000)
    with pytest.raises(PayloadTooLarge, match="200"):
        gate(store, "k", collect=True, pad="x" * 200, settings=producer)
    ok = gate(store, "k", collect=True)  # nothing was written: this call opens the window
    assert ok.result.opened and ok.result.calls == 1


# -- the operators' reads -----------------------------------------------------------------


def _listed(store: OperatorStore, shard: int, task: str, page: int, **filters: Any) -> list[Record]:
    """The open windows of ``task`` in ``shard`` read ``page`` at a time (at most 100: a
    listing that came back to a window it listed would go on forever)."""
    return list(itertools.islice(store.open_windows(shard, task=task, page=page, **filters), 100))


def _keys_of_one_shard(store: Store, n: int, task: str = "t") -> list[str]:
    """``n`` keys of ``task`` whose windows are in one shard (a store may have several)."""
    shards = store.settings.shards
    keys = [f"k{i}" for i in range(50 * n)]
    first = shard_of(window_ident(task, keys[0]), shards)
    return [k for k in keys if shard_of(window_ident(task, k), shards) == first][:n]


def test_open_windows_are_listed_in_deadline_order_in_bounded_steps_by_task(
    store: Store,
) -> None:
    keys = _keys_of_one_shard(store, 7)
    calls = [gate(store, key, window=f"{60 - i}s", max_wait="5m") for i, key in enumerate(keys)]
    other = gate(store, "k0", task="other")
    shard = calls[0].call.shard
    assert {c.call.shard for c in calls} == {shard}
    in_order = list(reversed(calls))
    for page in (1, 3, 100):
        listed = _listed(store, shard, "t", page)
        assert [r.task_id for r in listed] == [c.task_id for c in in_order]
        assert [r.ident for r in listed] == [c.call.ident for c in in_order]
        assert all(r.calls == 1 for r in listed)
        # at most a limit, the earliest deadlines first
        limited = _listed(store, shard, "t", page, limit=2)
        assert [r.task_id for r in limited] == [c.task_id for c in in_order[:2]]
        # a key glob, exactly as fnmatch (case-sensitive) matches it, a set included
        globbed = _listed(store, shard, "t", page, key_glob=f"{keys[1]}*")
        assert [r.task_id for r in globbed] == [calls[1].task_id]
        sets = _listed(store, shard, "t", page, key_glob=f"[{keys[2][0]}]{keys[2][1:]}")
        assert [r.task_id for r in sets] == [calls[2].task_id]
        assert _listed(store, shard, "t", page, key_glob=keys[1].upper()) == []
    assert [r.task_id for r in _listed(store, other.call.shard, "other", 2)] == [other.task_id]


def test_a_window_is_found_by_id_while_open_and_read_by_id_in_each_state_once_taken(
    store: Store,
) -> None:
    first = gate(store, "k", window="1ms", max_wait="1s")
    shard, task_id = first.call.shard, first.task_id

    def by_id(tid: str, **filters: Any) -> list[str | None]:
        return [r.ident for r in store.open_windows(shard, task_id=tid, **filters)]

    assert by_id(task_id) == [first.call.ident]
    assert by_id(task_id, task="t") == [first.call.ident]
    assert by_id(task_id, task="other") == by_id(task_id, key_glob="no*") == []
    assert by_id("no-such-id") == []
    assert store.taken(task_id) is None  # open: not taken
    take_due(store, shard)
    assert by_id(task_id) == []

    def seen(group: TakenGroup) -> list[str | None]:
        """The states of the window in ``group``, read a window at a time and all at once
        (the same)."""
        read = [list(itertools.islice(store.taken_windows(shard, group, p), 100)) for p in (1, 100)]
        one_by_one, at_once = ([(e.task_id, e.record) for e in r] for r in read)
        assert one_by_one == at_once
        return [record.state for tid, record in at_once if record and tid == task_id]

    found = store.taken(task_id)
    assert found is not None and found[0] == shard
    assert (found[1].state, found[1].ident) == ("dispatching", first.call.ident)
    assert seen("leased") == ["dispatching"] and seen("active") == []
    store.ack(shard, [task_id])
    assert seen("leased") == [] and seen("active") == ["queued"]
    store.claim(shard, task_id, "t")
    assert seen("active") == ["claimed"]
    assert store.taken(task_id)[1].state == "claimed"  # type: ignore[index]
    quarantined = gate(store, "q", window="1ms", max_wait="1s")
    take_due(store, quarantined.call.shard)
    store.quarantine(quarantined.call.shard, quarantined.task_id, "cannot make a message")
    (entry,) = store.taken_windows(quarantined.call.shard, "quarantine")
    assert entry.record is not None and entry.record.state == "quarantined"
    assert entry.record.error is not None and "cannot make a message" in entry.record.error


def test_a_leading_runs_quiet_period_end_is_read_and_a_flush_of_several_flushes_each_window(
    store: Store,
) -> None:
    lead = gate(store, "lead", leading=True, window="1h", max_wait="2h")
    shard = lead.call.shard
    now = store.time_ms()
    (taken,) = take_due(store, shard)
    found = store.taken(taken.task_id)
    assert found is not None and found[1].leading
    end = found[1].quiet_end_ms
    assert end is not None and now + 3_000_000 < end <= now + 3_700_000  # about an hour on
    (entry,) = store.taken_windows(shard, "leased")  # taken, not yet acked
    assert entry.record is not None and entry.record.quiet_end_ms == end
    plain = gate(store, "plain", window="1ms", max_wait="1s")
    (other,) = take_due(store, plain.call.shard)
    found = store.taken(other.task_id)
    assert found is not None and found[1].quiet_end_ms is None  # no leading run
    windows = [gate(store, key) for key in _keys_of_one_shard(store, 3)]
    shard = windows[0].call.shard
    pairs = [(w.call.ident, w.task_id) for w in windows]
    assert store.flush(shard, []) == []
    flushed = store.flush(shard, [*pairs, (windows[0].call.ident, "not-its-id")])
    assert [(r.ident, r.task_id) for r in flushed] == pairs  # the one not its id is not
    assert sorted(w.task_id for w in take_due(store, shard)) == sorted(w.task_id for w in windows)


# -- the counters and gauges (stats, top, the exporter) ----------------------------------


def _counters(store: OperatorStore) -> dict[str, int]:
    now = store.time_ms()
    found: dict[str, int] = {}
    for shard in range(store.settings.shards):
        for name, n in store.snapshot(shard, now).counters.items():
            found[name] = found.get(name, 0) + n
    return found


def test_a_window_is_counted_once_when_first_taken_and_a_reset_returns_the_counters(
    store: Store,
) -> None:
    burst = [gate(store, "a", window="1ms", max_wait="1s", task="cnt") for _ in range(3)]
    capped = [gate(store, "b", max_calls=2, task="cnt") for _ in range(2)]
    dropped = gate(store, "c", task="cnt")
    assert store.cancel(dropped.call.shard, dropped.call.ident) is not None
    wait_until(lambda: store.time_ms() > burst[-1].result.deadline_ms, 5)
    shards = {burst[0].call.shard, capped[0].call.shard}
    taken = [w for s in shards for w in store.take(s, 10).windows]
    assert sorted(w.task_id for w in taken) == sorted({burst[0].task_id, capped[0].task_id})
    for window in taken:  # a lease that passed: taken again, not counted again
        store.release(window.shard, 0, [Released(window.task_id, window.tries)])
        assert [w.task_id for w in take_due(store, window.shard)] == [window.task_id]
    counters = {k: v for k, v in _counters(store).items() if k.endswith("|cnt")}
    late = {k: v for k, v in counters.items() if k.startswith("l") and k[1].isdigit()}
    assert sum(late.values()) == 2
    assert {k: v for k, v in counters.items() if k not in late} == {
        "r|cnt": 2,
        "c|cnt": 5,
        "m|cnt": 1,
        "x|cnt": 1,
        "i|cnt": 6,
    }
    removed: dict[str, int] = {}
    for shard in range(store.settings.shards):
        for name, n in store.reset_counters(shard).items():
            removed[name] = removed.get(name, 0) + n
    assert {k: v for k, v in removed.items() if k.endswith("|cnt")} == counters
    assert not any(k.endswith("|cnt") for k in _counters(store))


def test_the_census_counts_open_and_due_windows_per_task_in_bounded_steps(
    store: Store,
) -> None:
    for key in range(5):
        gate(store, f"k{key}", window="1h", max_wait="2h", task="census_a")
    gate(store, "k0", window="1h", max_wait="2h", task="census_a")  # a join: 2 calls
    due = gate(store, "d", window="1ms", max_wait="1s", task="census_b")
    gate(store, "e", window="1h", max_wait="2h", task="census_b")
    wait_until(lambda: store.time_ms() > due.result.deadline_ms, 5)
    now = store.time_ms()
    totals: dict[str, list[int]] = {}
    batches = 0
    for shard in range(store.settings.shards):
        for rows in store.census(shard, now, page=2):
            batches += 1
            for row in rows:
                seen = totals.setdefault(row.task, [0, 0, 0, -1])
                seen[0] += row.open
                seen[1] += row.due
                seen[2] += row.calls_waiting
                if row.oldest_first_seen_ms >= 0 and (
                    seen[3] < 0 or row.oldest_first_seen_ms < seen[3]
                ):
                    seen[3] = row.oldest_first_seen_ms
    assert batches >= 1
    assert totals["census_a"][:3] == [5, 0, 6]
    assert totals["census_b"][:3] == [2, 1, 2]
    assert 0 < totals["census_b"][3] <= due.result.now_ms
    counts = [store.snapshot(shard, now) for shard in range(store.settings.shards)]
    assert (sum(c.open for c in counts), sum(c.due for c in counts)) == (7, 1)


def test_the_snapshot_reads_every_gauge_of_the_windows(store: Store) -> None:
    runner = run(store, "x", exclusive=True, task="gauge")  # claimed: active
    held = gate(store, "x", window="1ms", max_wait="1s", exclusive=True, task="gauge")
    shard = held.call.shard
    wait_until(lambda: not store.take(shard, 10).windows and held_windows(store, shard), 5)
    leased = gate(store, "l", window="1ms", max_wait="1s", task="gauge")
    take_due(store, leased.call.shard)
    bad = gate(store, "q", window="1ms", max_wait="1s", task="gauge")
    (quarantined,) = take_due(store, bad.call.shard)
    store.quarantine(bad.call.shard, quarantined.task_id, "cannot make a message")
    gate(store, "w", window="1h", max_wait="2h", task="gauge")
    waiting = gate(store, "w", window="1h", max_wait="2h", task="gauge")  # its deadline
    now = store.time_ms()
    snaps = [store.snapshot(shard, now) for shard in range(store.settings.shards)]
    assert sum(s.open for s in snaps) == 2  # held and waiting
    assert sum(s.due for s in snaps) == 0  # held is not due: it waits for its key's run
    assert sum(s.leased for s in snaps) == 1
    assert sum(s.active for s in snaps) == 1
    assert sum(s.quarantined for s in snaps) == 1
    assert sum(s.held for s in snaps) == 1
    assert [f.ident for s in snaps for f in s.held_front] == [held.call.ident]
    firsts = [s.first_due_ms for s in snaps if s.first_due_ms is not None]
    assert firsts and min(firsts) <= waiting.result.deadline_ms
    assert runner.task_id != waiting.task_id


# -- cancel -----------------------------------------------------------------------------


def test_a_cancelled_window_never_runs_and_the_next_call_opens_a_new_one(store: Store) -> None:
    first = gate(store, "k", window="1ms", max_wait="1s")
    alias = gate(store, "k", window="1ms", max_wait="1s", task_id="fixed-by-a-caller")
    shard, ident = first.call.shard, first.call.ident
    assert alias.task_id == first.task_id
    cancelled = store.cancel(shard, ident)
    assert cancelled is not None
    assert (cancelled.record.task_id, cancelled.record.calls) == (first.task_id, 2)
    assert [json.loads(a)["id"] for a in cancelled.aliases] == ["fixed-by-a-caller"]
    assert store.pending(shard, ident) is None
    time.sleep(0.05)
    assert store.take(shard, 10).windows == []  # due by now, and gone
    assert store.cancel(shard, ident) is None  # nothing open
    again = gate(store, "k").result
    assert again.opened and again.task_id != first.task_id


def test_a_cancel_by_id_spares_a_newer_window_and_a_taken_window_is_not_cancelled(
    store: Store,
) -> None:
    first = gate(store, "k", window="1ms", max_wait="1s")
    shard, ident = first.call.shard, first.call.ident
    (taken,) = take_due(store, shard)
    assert store.cancel(shard, ident) is None  # taken: the broker's
    newer = gate(store, "k")
    assert newer.result.opened
    assert store.cancel(shard, ident, first.task_id) is None  # not the window now open
    assert store.pending(shard, ident) is not None
    cancelled = store.cancel(shard, ident, newer.task_id)
    assert cancelled is not None and cancelled.record.task_id == newer.task_id
    assert store.ack(shard, [taken.task_id]) == 1  # the taken window went on as it was


def test_a_cancel_whose_reply_is_lost_gets_its_first_answer_and_acts_once(
    harness: Harness,
) -> None:
    """The cancel is sent again with the same token, and the store answers it with what
    the first one dropped (acting again would find nothing and answer None)."""
    _at_most_once(harness)
    store = harness.build()
    first = gate(store, "k")
    shard, ident = first.call.shard, first.call.ident
    assert store.cancel(shard, "t:nothing-open") is None  # (loads Redis' script first)
    harness.lose_next_reply(store, "cancel")
    cancelled = store.cancel(shard, ident)
    assert cancelled is not None and cancelled.record.task_id == first.task_id
    assert gate(store, "k").result.opened


def test_a_cancel_whose_reply_stays_lost_is_unknown_until_cancelled_by_reads_it(
    harness: Harness,
) -> None:
    _at_most_once(harness)
    store = harness.build()
    first = gate(store, "k")
    gate(store, "k")
    shard, ident = first.call.shard, first.call.ident
    assert store.cancel(shard, "t:nothing-open") is None
    harness.lose_next_reply(store, "cancel", then_refuse=True)
    try:
        started = time.monotonic()
        with pytest.raises(CancelOutcomeUnknown) as lost:
            store.cancel(shard, ident)
        assert time.monotonic() - started < 10  # an error in seconds, never a hang
        with pytest.raises(DebounceBackendError):
            store.cancelled_by(lost.value)  # unreachable: not "it did not run"
    finally:
        harness.outage(False)
    assert wait_until(lambda: _answers(store))
    cancelled = store.cancelled_by(lost.value)
    assert cancelled is not None
    assert (cancelled.record.task_id, cancelled.record.calls) == (first.task_id, 2)
    assert store.pending(shard, ident) is None


def test_the_call_that_reaches_max_calls_closes_the_window_and_the_next_opens_one(
    store: Store,
) -> None:
    calls = [gate(store, "k", max_calls=3, window="1h", max_wait="2h") for _ in range(4)]
    assert [c.result.calls for c in calls] == [1, 2, 3, 1]
    assert len({c.task_id for c in calls[:3]}) == 1 and calls[3].task_id != calls[0].task_id
    (capped,) = store.take(calls[0].call.shard, 10).windows  # due at once
    assert capped.task_id == calls[0].task_id and capped.capped and capped.calls == 3


# -- edges -------------------------------------------------------------------------------


def test_leading_only_runs_the_first_call_and_suppresses_the_quiet_period(store: Store) -> None:
    first = gate(store, "k", leading=True, trailing=False, window="1h", max_wait="2h")
    assert first.result.opened and first.result.edge == "lead"
    later = [
        gate(store, "k", leading=True, trailing=False, payload=i, window="1h", max_wait="2h")
        for i in range(1, 4)
    ]
    assert all(c.result.edge == "suppressed" and not c.result.opened for c in later)
    assert {c.task_id for c in later} == {first.task_id}
    (lead,) = store.take(first.call.shard, 10).windows  # due at once
    assert lead.task_id == first.task_id and lead.leading
    assert store.take(first.call.shard, 10).windows == []  # nothing more runs
    counters = _counters(store)  # every call in, 3 suppressed, 1 leading run of 1 call
    assert {k: counters.get(k) for k in ("i|t", "s|t", "r|t", "e|t", "c|t")} == {
        "i|t": 4,
        "s|t": 3,
        "r|t": 1,
        "e|t": 1,
        "c|t": 1,
    }


def test_leading_and_trailing_runs_once_more_at_the_end_of_a_burst(store: Store) -> None:
    def call(payload: int) -> Gated:
        return gate(
            store, "k", leading=True, trailing=True, payload=payload, window="1h", max_wait="90m"
        )

    first, second, third = call(0), call(1), call(2)
    assert first.result.edge == "lead"
    assert second.result.opened and second.result.edge == ""
    assert second.task_id != first.task_id
    assert third.task_id == second.task_id and third.result.calls == 2
    shard = first.call.shard
    assert [w.task_id for w in store.take(shard, 10).windows] == [first.task_id]
    assert len(store.flush(shard, [(first.call.ident, "")])) == 1  # its deadline comes
    (trailing,) = store.take(shard, 10).windows
    assert trailing.task_id == second.task_id and trailing.calls == 2
    assert not trailing.leading


# -- at most once, under a lost reply ----------------------------------------------------


def _at_most_once(harness: Harness) -> None:
    if harness.resends_after_a_lost_reply:
        pytest.skip(harness.resends_after_a_lost_reply)


def test_a_gate_whose_reply_is_lost_is_outcome_unknown_and_never_sent_again(
    harness: Harness,
) -> None:
    _at_most_once(harness)
    store = harness.build()
    first = gate(store, "k")
    harness.lose_next_reply(store, "gate")
    with pytest.raises(OutcomeUnknown):
        gate(store, "k")
    third = gate(store, "k").result
    assert third.task_id == first.task_id and third.calls == 3  # counted once


def test_a_claim_whose_reply_is_lost_is_outcome_unknown_and_never_sent_again(
    harness: Harness,
) -> None:
    _at_most_once(harness)
    store = harness.build()
    first = gate(store, "k", window="1ms", max_wait="1s")
    shard = first.call.shard
    take_due(store, shard)
    store.ack(shard, [first.task_id])
    # a claim of an id with no window (it runs, writes nothing) loads the script first:
    # else the lost command is a NOSCRIPT that never ran (this test alone on a new server)
    assert store.claim(shard, "no-such-window", "t").run
    harness.lose_next_reply(store, "claim")
    with pytest.raises(OutcomeUnknown) as lost:
        store.claim(shard, first.task_id, "t")
    # an outage: the worker keeps the mark and sends it again once the store answers
    assert worth_keeping(lost.value)
    # the lost claim ran once: a second is a duplicate of it, not a second run
    assert store.claim(shard, first.task_id, "t") == ClaimResult("claimed", False)


def test_a_take_whose_reply_is_lost_loses_no_window(harness: Harness) -> None:
    """The lost take may or may not have leased the window: it is taken again (at once,
    or when that lease ends), once, never lost."""
    _at_most_once(harness)
    store = harness.build(dispatch_lease_ms=500)
    first = gate(store, "k", window="1ms", max_wait="1s")
    shard = first.call.shard
    time.sleep(0.01)
    harness.lose_next_reply(store, "take")
    with pytest.raises(OutcomeUnknown):
        store.take(shard, 10)
    (again,) = take_due(store, shard)
    assert again.task_id == first.task_id and again.tries in (1, 2)
    assert store.ack(shard, [first.task_id]) == 1
    time.sleep(0.6)
    assert store.take(shard, 10).windows == []


def test_an_unreachable_store_raises_its_typed_error_and_writes_nothing(harness: Harness) -> None:
    """A refused connection (nothing sent) is :class:`StoreUnavailable`, for every role's
    writes: the package's error, never a client's class, and never "outcome unknown"."""
    store = harness.build()
    first = gate(store, "k")
    shard, task_id = first.call.shard, first.task_id
    attempts: list[Callable[[], object]] = [
        lambda: gate(store, "k"),
        lambda: store.take(shard, 10),
        lambda: store.ack(shard, [task_id]),
        lambda: store.claim(shard, task_id, "t"),
        lambda: store.finish_run(shard, task_id, "SUCCESS"),
        lambda: store.renew_claims({shard: [task_id]}),
        lambda: store.flush(shard, [(first.call.ident, "")]),
        lambda: store.cancel(shard, first.call.ident),
    ]
    harness.outage(True)
    try:
        for attempt in attempts:
            with pytest.raises(StoreUnavailable) as refused:
                attempt()
            assert worth_keeping(refused.value)  # a worker's mark is kept, sent again
    finally:
        harness.outage(False)
    assert wait_until(lambda: _answers(store))
    again = gate(store, "k").result
    assert again.task_id == first.task_id and again.calls == 2  # nothing was written


def _answers(store: OperatorStore) -> bool:
    try:
        return store.ping()
    except DebounceBackendError:
        return False


def test_pending_payloads_lists_each_open_window_with_its_payload_and_delete_all_empties(
    harness: Harness,
) -> None:
    """The testing helpers' reads: every open window with its first call's payload and
    its call count (only those whose ident starts with the prefix, if given); after
    ``delete_all``, nothing (no window, no counter), and a call opens a new window."""
    store = harness.build()
    first = gate(store, "k1", payload=1)
    gate(store, "k1", payload=2)
    other = gate(store, "k2", payload=3)
    listed = [
        (r.task_id, r.calls, json.loads(r.payload or b"null")[0])
        for shard in range(store.settings.shards)
        for r in store.pending_payloads(shard)
    ]
    assert sorted(listed) == sorted([(first.task_id, 2, ["k1", 1]), (other.task_id, 1, ["k2", 3])])
    mine = [r.ident for r in store.pending_payloads(first.call.shard, first.call.ident)]
    assert mine == [first.call.ident]
    now = store.time_ms()
    assert any(store.snapshot(s, now).counters for s in range(store.settings.shards))
    assert store.delete_all() >= 2
    assert [r for s in range(store.settings.shards) for r in store.pending_payloads(s)] == []
    assert not any(store.snapshot(s, now).counters for s in range(store.settings.shards))
    assert gate(store, "k1").result.opened


def test_pending_reads_a_windows_cap_and_whether_it_trails(store: Store) -> None:
    """``pending`` (what ``debounce_pending`` and ``find`` show) gives an open window's cap
    (its opener's ``debounce_max_calls``) and whether it is a trailing window (opened in a
    leading run's quiet period), on every store."""
    capped = gate(store, "capped", max_calls=5)
    plain = gate(store, "plain")
    gate(store, "edge", leading=True)  # a leading run: closed at once, its quiet period
    trailing = gate(store, "edge", leading=True)  # opens the trailing window
    found = {
        name: store.pending(g.call.shard, g.call.ident)
        for name, g in (("capped", capped), ("plain", plain), ("trailing", trailing))
    }
    assert {name: (r.max_calls, r.trailing) for name, r in found.items() if r} == {
        "capped": (5, False),
        "plain": (None, False),
        "trailing": (None, True),
    }


# -- the members every store has, each exercised here -----------------------------------


def test_task_definitions_are_written_when_new_or_changed_and_read_back_by_name(
    store: Store,
) -> None:
    """``publish_definitions`` writes only what is new or changed (its count says so);
    ``task_definition`` reads the latest by name, None for a task never published;
    ``delete_all`` forgets them with the windows."""
    assert store.task_definition("proj.t") is None
    assert store.publish_definitions({}) == 0
    assert store.publish_definitions({"proj.t": '{"v":1}', "proj.u": '{"v":"ü"}'}) == 2
    assert store.publish_definitions({"proj.t": '{"v":1}', "proj.u": '{"v":"ü"}'}) == 0
    assert store.publish_definitions({"proj.t": '{"v":2}', "proj.u": '{"v":"ü"}'}) == 1
    assert store.task_definition("proj.t") == '{"v":2}'
    assert store.task_definition("proj.u") == '{"v":"ü"}'
    assert store.task_definition("proj.T") is None
    store.delete_all()
    assert store.task_definition("proj.t") is None


def test_gate_many_gates_each_call_in_order_and_reports_each_chunk(store: Store) -> None:
    calls = [prepared(store, key, payload=n) for n, key in enumerate(["a", "b", "a", "c", "a"])]
    chunks: list[range] = []
    outcomes = store.gate_many(calls, chunk_size=2, on_chunk=chunks.append)
    assert all(isinstance(o, GateResult) for o in outcomes), outcomes
    results = [o for o in outcomes if isinstance(o, GateResult)]
    assert [r.opened for r in results] == [True, True, False, True, False]
    assert results[2].task_id == results[4].task_id == results[0].task_id
    assert [r.calls for r in results] == [1, 1, 2, 1, 3]
    assert len({r.task_id for r in results}) == 3
    # each call reported once, in chunks of at most chunk_size (a cluster's are per node)
    assert sorted(i for chunk in chunks for i in chunk) == [0, 1, 2, 3, 4]
    assert all(0 < len(chunk) <= 2 for chunk in chunks)
    assert gate(store, "a").task_id == results[0].task_id  # one window with gate too


def test_gate_many_cuts_its_chunks_by_bytes_as_well_as_by_count(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug class 15: a chunk carries at most CHUNK_BYTES of bodies and options (its first
    call whatever its size), however many calls ``chunk_size`` allows; every call is
    still gated once, in order."""
    from celery_debounce.store import chunks as chunking

    calls = [prepared(store, f"k{n}", payload="x" * 1000) for n in range(7)]
    each = len(calls[0].payload) + len(calls[0].options_json)
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 2 * each + each // 2)
    seen: list[range] = []
    outcomes = store.gate_many(calls, chunk_size=1000, on_chunk=seen.append)
    assert [o.opened for o in outcomes if isinstance(o, GateResult)] == [True] * 7, outcomes
    assert sorted(i for chunk in seen for i in chunk) == list(range(7))
    assert all(len(chunk) <= 2 for chunk in seen) and len(seen) >= 4, seen


def test_a_late_claim_claims_as_a_claim_does_and_a_second_is_a_duplicate(store: Store) -> None:
    first = gate(store, "k", window="1ms", max_wait="1s")
    shard = first.call.shard
    (taken,) = take_due(store, shard)
    assert store.ack(shard, [taken.task_id]) == 1
    assert store.claim_late(shard, first.task_id, "t") == ClaimResult("queued", True)
    assert store.claim_late(shard, first.task_id, "t") == ClaimResult("claimed", False)
    assert store.finish_run(shard, first.task_id, "SUCCESS").finished
    assert store.claim_late(shard, first.task_id, "t") == ClaimResult("finished", False)


def test_heartbeats_and_clean_stops_are_read_back_by_liveness(store: Store) -> None:
    beat = store.heartbeat("dispatcher-a")
    store.heartbeat("dispatcher-b")
    stopped = store.heartbeat("dispatcher-b", alive=False)
    now, alive, gone = store.liveness()
    assert now >= stopped >= beat > 0
    assert [name for name, _ in alive] == ["dispatcher-a"]
    assert alive[0][1] >= beat - 1000  # the store's clock, in ms
    assert [name for name, _ in gone] == ["dispatcher-b"]


def test_layouts_written_are_read_back_with_when(store: Store) -> None:
    now, before = store.layouts()
    later, written = store.layouts(["layout-1"])
    assert later >= now and "layout-1" not in before
    assert set(written) >= {"layout-1"} and written["layout-1"] >= now - 1000
    assert store.layouts()[1]["layout-1"] == written["layout-1"]


def test_a_window_of_another_layout_is_drained_through_this_layouts_plan(
    harness: Harness,
) -> None:
    """A window opened under another shard layout (a changed ``debounce_shards``) is taken
    by a store of this one: from its own shards, or from the shards the other layout's
    name reads (``layout.tags_of``), which its dispatcher drains."""
    old = harness.build(shards=4)
    new = harness.build(shards=1)
    plan = new.layout
    assert plan.name and plan.name != old.layout.name
    assert plan.legacy_shards == () and plan.tags_of("no such layout") == ()
    own = {new.tag(shard) for shard in range(new.settings.shards)}
    assert set(plan.tags_of(plan.name)) <= own
    want = {gate(old, f"k{i}", window="1ms", max_wait="1s").task_id for i in range(8)}
    shards: list[int | str] = [*range(new.settings.shards)]
    shards += [tag for tag in plan.tags_of(old.layout.name) if tag not in own]
    found: set[str] = set()

    def drained() -> bool:
        for shard in shards:
            found.update(window.task_id for window in new.take(shard, 10).windows)
        return found >= want

    wait_until(drained, timeout=10)
    assert found == want


def test_a_queued_window_whose_message_expired_unseen_is_swept_revoked(store: Store) -> None:
    """``expiring`` notes when a published message expires; once it has, past the
    sweep's grace, the expiry sweep finishes that window as REVOKED (a claimed one
    is left to its run)."""
    running = run(store, "k")  # claimed: its run goes on
    expiring = gate(store, "k", window="1ms", max_wait="1s")  # same key, same shard
    shard = expiring.call.shard
    (taken,) = take_due(store, shard)
    assert taken.task_id == expiring.task_id and store.ack(shard, [taken.task_id]) == 1
    store.expiring(shard, [(expiring.task_id, 1), (running.task_id, 1)])
    swept = wait_until(lambda: store.expire(shard), timeout=10)
    assert [task_id for task_id, _ in swept] == [expiring.task_id]
    assert store.claim(shard, running.task_id, "t") == ClaimResult("claimed", False)
    assert store.claim(shard, expiring.task_id, "t") == ClaimResult("finished", False)
    store.expired(shard, [expiring.task_id])
    assert store.expire(shard) == []


def test_the_snapshot_names_the_run_each_held_window_waits_for(store: Store) -> None:
    first = run(store, "k", exclusive=True)
    shard = first.call.shard
    held = gate(store, "k", window="1ms", max_wait="1s", exclusive=True)
    wait_until(lambda: not store.take(shard, 10).windows and held_windows(store, shard), 5)

    def front() -> list[HeldFront]:
        return store.snapshot(shard, store.time_ms()).held_front

    (before,) = front()
    assert before.ident == held.call.ident and before.since_ms <= store.time_ms()
    assert (before.waits_for, before.state) == (first.task_id, "claimed")
    store.finish_run(shard, first.task_id, "SUCCESS")
    # freed at once (Redis), or still held until the next take, waiting for no run
    after = [(f.ident, f.waits_for, f.state) for f in front()]
    assert after in ([], [(held.call.ident, None, None)])


def test_a_collect_windows_calls_so_far_are_read_in_call_order(store: Store) -> None:
    calls = [
        gate(store, "k", payload=n, collect=True, window="1h", max_wait="2h") for n in range(3)
    ]
    shard = calls[0].call.shard
    (pending,) = store.pending_payloads(shard, ident_prefix("t"))
    assert pending.task_id == calls[0].task_id and pending.collect_list
    elements = pending.collected
    assert elements is not None and len(elements) == 3
    # each element: [ms, args, kwargs] of one call, in call order
    assert [json.loads(element)[1] for element in elements] == [["k", n] for n in range(3)]


def test_a_healthy_store_is_reached_with_no_problem_and_says_what_it_reached(
    store: Store,
) -> None:
    gate(store, "k")
    reached = store.reach()
    assert reached.problems == [] and reached.server and reached.notes
    store.check_server()  # a supported server: nothing raised
    assert store.server_checked
    assert store.tag(0) == store.tag(0) and isinstance(store.tag(0), str)


def test_a_wake_listener_wakes_for_a_new_earliest_window_and_sleeps_through_a_join(
    store: Store,
) -> None:
    listener = store.wake_listener()
    stop = threading.Event()
    try:
        listener.subscribe()
        store.refresh_topology()  # a no-op where the servers did not move
        gate(store, "k", window="1h", max_wait="2h")  # the earliest deadline: a wake-up
        started = time.monotonic()
        listener.wait(10, stop)
        assert time.monotonic() - started < 8
        gate(store, "k", window="1h", max_wait="2h")  # a join: nothing to wake for
        started = time.monotonic()
        listener.wait(0.5, stop)
        assert time.monotonic() - started >= 0.4
    finally:
        listener.close()
