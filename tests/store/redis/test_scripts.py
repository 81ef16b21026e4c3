"""The Lua scripts, driven directly, on fakeredis (fast) and on the real redis-server."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from helpers import wait_until

from celery_debounce.aliases import fixed_id
from celery_debounce.errors import DebounceBackendError
from celery_debounce.ops.admin import flush_window
from celery_debounce.producer.call import prepare_call
from celery_debounce.producer.gate import GateResult, enter
from celery_debounce.producer.options import build_spec
from celery_debounce.store import WindowStore
from celery_debounce.store.redis.keys import claims_key
from celery_debounce.store.redis.translate import ALIASES_FULL


def call(
    backend: WindowStore,
    key: str,
    window: str = "1m",
    max_wait: str = "5m",
    replace: bool = False,
    payload: int = 0,
    task: str = "t",
    task_id: str | None = None,
    exclusive: bool = False,
) -> GateResult:
    spec = build_spec(window, "{0}", max_wait, replace, exclusive=exclusive)
    options: dict[str, object] = {}
    prepared = prepare_call(
        backend.settings, task, spec, (key, payload), {}, options, None, "json", task_id
    )
    return enter(backend, prepared, fixed_id(task_id, options))


def test_open_then_join_moves_the_deadline_never_past_the_ceiling(backend: WindowStore) -> None:
    first = call(backend, "k", window="1m", max_wait="90s")
    assert first.opened and first.calls == 1
    assert first.deadline_ms == first.now_ms + 60_000
    second = call(backend, "k", window="1m", max_wait="90s")
    assert not second.opened and second.task_id == first.task_id and second.calls == 2
    assert second.deadline_ms >= first.deadline_ms
    # a longer per-call window cannot push past the opener's ceiling (first_seen + 90 s)
    third = call(backend, "k", window="10m", max_wait="1h")
    assert third.deadline_ms == first.now_ms + 90_000


def test_take_closes_the_window_and_the_next_call_opens_a_new_one(backend: WindowStore) -> None:
    first = call(backend, "k", window="10ms", max_wait="1s", payload=1)
    taken = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert [w.task_id for w in taken] == [first.task_id]
    assert taken[0].key == "k" and taken[0].task_name == "t" and taken[0].calls == 1
    assert taken[0].deadline_ms <= taken[0].taken_ms
    again = call(backend, "k", window="10ms", max_wait="1s", payload=2)
    assert again.opened and again.task_id != first.task_id
    # taken once: a second take returns only the new window
    later = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert [w.task_id for w in later] == [again.task_id]


def test_replace_payload_keeps_the_newest_arguments(backend: WindowStore) -> None:
    call(backend, "k", window="10ms", max_wait="1s", payload=1, replace=True)
    call(backend, "k", window="10ms", max_wait="1s", payload=2, replace=True)
    call(backend, "k", window="10ms", max_wait="1s", payload=3, replace=False)
    (window,) = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert window.payload == b'[["k", 2], {}, {}]'  # protocol-2 body: args, kwargs, embed


def test_an_unconfirmed_publish_is_taken_again_after_its_lease(backend: WindowStore) -> None:
    backend.settings = replace(backend.settings, dispatch_lease_ms=50)
    first = call(backend, "k", window="1ms", max_wait="1s")
    (taken,) = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert taken.tries == 1
    # the dispatcher "died": no ack. After the lease, the same window comes back.
    (again,) = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert again.task_id == first.task_id and again.tries == 2
    tag = backend.tag(0)
    backend.run("ack", [f"{tag}:leased", f"{tag}:active"], [tag, first.task_id])
    assert backend.client.hget(f"{tag}:win:{first.task_id}", "st") == b"queued"


def test_claim_and_finish_leave_only_a_ttld_history(backend: WindowStore) -> None:
    first = call(backend, "k", window="1ms", max_wait="1s")
    wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    tag = backend.tag(0)
    keys = backend._record_keys(0, first.task_id)
    assert backend.run("claim", keys, _claim(backend, first.task_id))[0] == b"dispatching"
    assert backend.run("finish", keys, [first.task_id, "SUCCESS", 60_000])[0] == 1
    assert backend.client.hget(keys[0], "st") == b"finished"
    assert 0 < backend.client.pttl(keys[0]) <= 60_000
    # only the TTL'd history record and the TTL'd dispatch counters remain
    assert sorted(backend.client.keys("*")) == sorted([keys[0].encode(), f"{tag}:stats".encode()])
    assert backend.client.pttl(f"{tag}:stats") > 0


def test_claim_refuses_a_finished_or_claimed_record(backend: WindowStore) -> None:
    first = call(backend, "k", window="1ms", max_wait="1s")
    wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    tag = backend.tag(0)
    keys = backend._record_keys(0, first.task_id)
    assert backend.run("claim", keys, _claim(backend, first.task_id))[0] == b"dispatching"
    claimed_at = backend.client.hget(keys[0], "ca")
    # a redelivered message under a live claim: a duplicate, not run, record left as it is
    assert backend.run("claim", keys, _claim(backend, first.task_id))[::2] == [b"claimed", 0]
    assert backend.client.hget(keys[0], "ca") == claimed_at
    assert backend.run("finish", keys, [first.task_id, "SUCCESS", 60_000])[0] == 1
    record = backend.client.hgetall(keys[0])
    # a republished message after the run: never claimed again, not run
    assert backend.run("claim", keys, _claim(backend, first.task_id))[::2] == [b"finished", 0]
    assert backend.client.hgetall(keys[0]) == record
    assert backend.client.zscore(f"{tag}:active", first.task_id) is None
    assert backend.client.zscore(f"{tag}:leased", first.task_id) is None
    # a record that is gone
    assert backend.run("claim", [f"{tag}:win:gone", *keys[1:]], _claim(backend, "gone"))[0] == b""


def test_a_claim_lives_while_renewed_and_a_lapsed_one_is_released(backend: WindowStore) -> None:
    """A claim lasts one claim lease; renew.lua extends it (never recreating one that
    left); past its lease take.lua releases it: out of the active set, state stale."""
    backend.settings = replace(backend.settings, claim_lease_ms=1000)
    tag = backend.tag(0)
    first = call(backend, "k", window="1ms", max_wait="1s")
    wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    keys = backend._record_keys(0, first.task_id)
    assert backend.run("claim", keys, _claim(backend, first.task_id))[2] == 1
    claims = claims_key(backend.tag(0))
    for _ in range(4):  # 1.2 s of renewals every 0.3 s: still claimed
        time.sleep(0.3)
        backend.renew_claims({0: [first.task_id, "never-claimed"]})
        backend.take(0, 10)
    assert backend.client.hget(keys[0], "st") == b"claimed"
    assert backend.client.zscore(claims, "never-claimed") is None  # XX: not created
    # no renewal: stale within the lease, released by the next take
    wait_until(
        lambda: backend.take(0, 10) and backend.client.hget(keys[0], "st") == b"stale", timeout=3
    )
    assert backend.client.zscore(f"{tag}:active", first.task_id) is None
    assert not backend.client.exists(claims)
    backend.renew_claims({0: [first.task_id]})  # a late renewal brings nothing back
    assert not backend.client.exists(claims)
    # a redelivery of the stale window runs (at least once for a run that died)
    before, _, run = backend.run("claim", keys, _claim(backend, first.task_id))
    assert (before, run) == (b"stale", 1)
    assert backend.client.hget(keys[0], "st") == b"claimed"


def test_a_duplicate_skipped_under_a_claim_that_then_lapses_is_published_again(
    backend: WindowStore,
) -> None:
    """A delivery skipped because a claim was live (RabbitMQ requeues a dead worker's
    message at once, before its claim lapses) must not lose the run: when that claim
    lapses, take.lua publishes the window again (same id), and it runs."""
    backend.settings = replace(backend.settings, claim_lease_ms=1000)
    first = call(backend, "k", window="1ms", max_wait="1s", payload=5)
    wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    keys = backend._record_keys(0, first.task_id)
    assert backend.run("claim", keys, _claim(backend, first.task_id))[2] == 1
    assert backend.run("claim", keys, _claim(backend, first.task_id))[::2] == [b"claimed", 0]
    assert backend.client.hget(f"{backend.tag(0)}:stats", "d|t") == b"1"
    (again,) = wait_until(lambda: backend.take(0, 10).windows, timeout=4)
    assert again.task_id == first.task_id and again.payload == b'[["k", 5], {}, {}]'
    assert backend.run("claim", keys, _claim(backend, first.task_id))[::2] == [b"dispatching", 1]
    # a retry of the run takes a live claim over
    retry = backend._claim_args(first.task_id, "t", True)
    assert backend.run("claim", keys, retry)[::2] == [b"claimed", 1]


@pytest.mark.parametrize("end", ["finish", "stale claim"])
def test_an_exclusive_window_due_while_its_key_runs_is_held_until_the_run_ends(
    backend: WindowStore, end: str
) -> None:
    """debounce_exclusive: a window of a key whose window is in progress (taken, queued
    or claimed) is held: not taken, still open to calls; the run's end (finish.lua, or
    its claim lapsing) makes it due at once. A non-exclusive window is never held."""
    backend.settings = replace(backend.settings, claim_lease_ms=1000)
    tag = backend.tag(0)
    first = call(backend, "k", window="1ms", max_wait="1s", exclusive=True)
    (taken,) = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert taken.task_id == first.task_id
    assert backend.client.hget(f"{tag}:run:1:t:k", "id") == first.task_id.encode()
    keys = backend._record_keys(0, first.task_id)
    backend.run("claim", keys, _claim(backend, first.task_id))
    second = call(backend, "k", window="1ms", max_wait="1s", exclusive=True, payload=1)
    other = call(backend, "other", window="1ms", max_wait="1s", exclusive=True)
    plain = call(backend, "plain", window="1ms", max_wait="1s")  # not exclusive
    time.sleep(0.05)
    got = {w.task_id for w in backend.take(0, 10).windows}
    assert got == {other.task_id, plain.task_id}  # k is held
    assert backend.client.zscore(f"{tag}:held", "1:t:k") is not None
    ((ident, (since, waits_for)),) = backend.held(0).items()  # what inspect shows
    assert (ident, waits_for) == ("1:t:k", first.task_id) and since > 0
    # it keeps absorbing calls
    joined = call(backend, "k", window="1ms", max_wait="1s", exclusive=True, payload=2)
    assert not joined.opened and joined.task_id == second.task_id and joined.calls == 2
    time.sleep(0.05)
    assert backend.take(0, 10).windows == []  # held again, not taken
    if end == "finish":
        backend.run("finish", keys, [first.task_id, "SUCCESS", 60_000])
    else:  # its worker died: no renewal; the lapsed claim frees the key
        time.sleep(1.1)
    (follow,) = wait_until(lambda: backend.take(0, 10).windows, timeout=3)
    assert follow.task_id == second.task_id and follow.calls == 2
    assert backend.client.hget(f"{tag}:run:1:t:k", "id") == second.task_id.encode()
    assert backend.client.zscore(f"{tag}:held", "1:t:k") is None
    stats = backend.client.hgetall(f"{tag}:stats")
    assert stats[b"h|t"] == b"1" and int(stats[b"hm|t"]) > 0


def test_claims_and_held_keys_of_the_wrong_type_never_block_a_take_or_a_finish(
    backend: WindowStore,
) -> None:
    """A foreign write to <tag>:claims or <tag>:held (a string) must not fail every take
    of the shard, nor the finish of a run (bug class: one bad item blocks the others)."""
    tag = backend.tag(0)
    backend.client.set(f"{tag}:claims", "x")
    backend.client.set(f"{tag}:held", "x")
    first = call(backend, "k", window="1ms", max_wait="1s", exclusive=True)
    (taken,) = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert taken.task_id == first.task_id
    keys = backend._record_keys(0, first.task_id)
    with pytest.raises(DebounceBackendError):  # the claim fails; the run goes on (warned)
        backend.run("claim", keys, _claim(backend, first.task_id))
    assert backend.run("finish", keys, [first.task_id, "SUCCESS", 60_000])[0] == 1
    second = call(backend, "k", window="1ms", max_wait="1s", exclusive=True)
    (again,) = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert again.task_id == second.task_id


def _claim(backend: WindowStore, task_id: str) -> list[object]:
    """claim.lua's ARGV for a first delivery of ``task_id`` (task name ``t``)."""
    return backend._claim_args(task_id, "t", False)


def _record(backend: WindowStore, task_id: str) -> dict[bytes, bytes]:
    return backend.client.hgetall(f"{backend.tag(0)}:win:{task_id}")


@pytest.mark.parametrize("stage", ["dispatching", "claimed", "finished", "lease expired"])
def test_a_reused_caller_id_never_overwrites_a_record(backend: WindowStore, stage: str) -> None:
    """Window 1 has id X; a call with id X while window 1 is at `stage` opens window 2
    under another id; both are taken, neither record is touched by the other."""
    backend.settings = replace(backend.settings, dispatch_lease_ms=50)
    tag = backend.tag(0)
    first = call(backend, "k", window="1ms", max_wait="1s", task_id="reindex-7", payload=1)
    assert first.task_id == "reindex-7"
    (_taken,) = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    keys = backend._record_keys(0, "reindex-7")
    if stage in ("claimed", "finished"):
        backend.run("claim", keys, _claim(backend, "reindex-7"))
    if stage == "finished":
        backend.run("finish", keys, ["reindex-7", "SUCCESS", 60_000])
    before = _record(backend, "reindex-7")
    second = call(backend, "k", window="1ms", max_wait="1s", task_id="reindex-7", payload=2)
    assert second.opened and second.task_id != "reindex-7"
    assert _record(backend, "reindex-7") == before
    ids = set()
    for _ in range(2 if stage == "lease expired" else 1):  # the dead dispatcher's lease
        ids |= {w.task_id for w in wait_until(lambda: backend.take(0, 10).windows, timeout=5)}
    assert second.task_id in ids
    assert ids == ({second.task_id, "reindex-7"} if stage == "lease expired" else {second.task_id})
    rec2 = _record(backend, second.task_id)
    assert rec2[b"st"] == b"dispatching" and rec2[b"p"] == b'[["k", 2], {}, {}]'
    assert rec2[b"a1"] == b'{"id": "reindex-7"}'  # the caller's id resolves to window 2 too
    assert _record(backend, "reindex-7")[b"p" if stage != "finished" else b"st"] == (
        b'[["k", 1], {}, {}]' if stage != "finished" else b"finished"
    )
    # finishing run 1 leaves window 2 alone
    backend.run("finish", keys, ["reindex-7", "SUCCESS", 60_000])
    assert _record(backend, second.task_id)[b"st"] == b"dispatching"
    assert backend.client.zscore(f"{tag}:leased", second.task_id) is not None


def test_a_caller_id_in_use_by_a_pending_window_of_another_key(backend: WindowStore) -> None:
    first = call(backend, "a", task_id="X")
    second = call(backend, "b", task_id="X")
    assert first.task_id == "X" and second.opened and second.task_id != "X"
    # the same key with the same id joins its own window, no alias
    again = call(backend, "a", task_id="X")
    assert not again.opened and again.task_id == "X"
    tag = backend.tag(0)
    assert backend.client.hget(f"{tag}:open:1:t:a", "na") is None
    # joining a window with another id records the caller's id as an alias
    third = call(backend, "b", task_id="Y")
    assert third.task_id == second.task_id
    assert backend.client.hmget(f"{tag}:open:1:t:b", "na", "a1", "a2") == [
        b"2",
        b'{"id": "X"}',
        b'{"id": "Y"}',
    ]
    # the id index forgets X once its window is taken or cancelled
    assert backend.client.hgetall(f"{tag}:ids") == {b"X": b"1:t:a"}


def test_a_window_taken_over_an_existing_record_gets_a_new_id(backend: WindowStore) -> None:
    """A window opened under an id in use without the gate's check (a record written
    before, a reused returned id) is never renamed over that record."""
    tag = backend.tag(0)
    backend.client.hset(f"{tag}:win:X", mapping={"id": "X", "st": "claimed"})
    call(backend, "k", window="1ms", max_wait="1s")
    # make the open window carry the id in use
    backend.client.hset(f"{tag}:open:1:t:k", "id", "X")
    (taken,) = wait_until(lambda: backend.take(0, 10).windows, timeout=5)
    assert taken.task_id.startswith("X~")
    assert backend.client.hgetall(f"{tag}:win:X") == {b"id": b"X", b"st": b"claimed"}
    rec = _record(backend, taken.task_id)
    assert rec[b"id"] == taken.task_id.encode() and rec[b"a1"] == b'{"id":"X"}'


def test_killed_runs_leave_no_key_behind_after_the_record_ttl(backend: WindowStore) -> None:
    """Runs claimed and never finished (worker killed without acks_late): once their
    records expire, take.lua prunes their ids from the active set; nothing but the
    TTL'd stats is left."""
    backend.settings = replace(
        backend.settings, record_ttl_ms=1000, dispatch_lease_ms=500, claim_lease_ms=1000
    )
    tag = backend.tag(0)
    ids = [call(backend, f"k{i}", window="1ms", max_wait="1s").task_id for i in range(5)]
    ids += [call(backend, "chosen", window="1ms", max_wait="1s", task_id="mine").task_id]
    taken: list[str] = []
    wait_until(
        lambda: (
            taken.extend(w.task_id for w in backend.take(0, 10).windows) or len(taken) == len(ids)
        ),
        timeout=5,
    )
    assert sorted(taken) == sorted(ids)
    backend.run("ack", [f"{tag}:leased", f"{tag}:active"], [tag, *ids[:3]])
    for tid in ids[2:]:  # claimed, then the worker dies: no finish
        backend.run("claim", backend._record_keys(0, tid), _claim(backend, tid))
    assert backend.client.zcard(f"{tag}:active") == len(ids)
    wait_until(lambda: not backend.client.exists(*(f"{tag}:win:{t}" for t in ids)), timeout=10)
    wait_until(
        lambda: backend.take(0, 10).next_in_ms == -1 and not backend.client.exists(f"{tag}:active"),
        timeout=10,
    )
    assert backend.client.keys("*") == [f"{tag}:stats".encode()]
    assert backend.client.pttl(f"{tag}:stats") > 0


def test_a_call_after_flush_opens_a_new_window_and_cannot_move_the_flushed_one(
    backend: WindowStore,
) -> None:
    first = call(backend, "k", window="1h", max_wait="2h", payload=1)
    flushed = flush_window(backend, 0, "1:t:k")
    assert flushed is not None and flushed.task_id == first.task_id and flushed.calls == 1
    assert flushed.deadline * 1000 >= first.now_ms
    # a call between the flush and the take: a new window; the flushed deadline stays
    later = call(backend, "k", window="1h", max_wait="2h", payload=2)
    assert later.opened and later.task_id != first.task_id
    assert flush_window(backend, 0, "1:t:k", first.task_id) is None  # already closed
    (taken,) = backend.take(0, 10).windows
    assert taken.task_id == first.task_id and taken.tries == 1
    assert taken.deadline_ms == round(flushed.deadline * 1000)
    assert taken.payload == b'[["k", 1], {}, {}]'
    assert backend.take(0, 10).windows == []  # the new window waits for its hour
    tag = backend.tag(0)
    assert backend.client.hget(f"{tag}:stats", "r|t") == b"1"  # counted once, when taken


def test_aliases_are_bounded_and_a_call_past_the_bound_writes_nothing(
    backend: WindowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("celery_debounce.store.redis.codec.MAX_ALIASES", 2)
    first = call(backend, "k")
    call(backend, "k", task_id="A")
    call(backend, "k", task_id="B")
    tag = backend.tag(0)
    before = backend.client.hgetall(f"{tag}:open:1:t:k")
    due = backend.client.zscore(f"{tag}:due", "1:t:k")
    with pytest.raises(DebounceBackendError, match=ALIASES_FULL):
        call(backend, "k", task_id="C")
    assert backend.client.hgetall(f"{tag}:open:1:t:k") == before
    assert backend.client.zscore(f"{tag}:due", "1:t:k") == due
    assert call(backend, "k").task_id == first.task_id  # default calls still join


def test_the_calls_in_counter_never_leaves_the_stats_hash_without_a_ttl(
    backend: WindowStore,
) -> None:
    """gate.lua counts each call in ``<tag>:stats`` (``i|<task>``): the call that creates
    the hash gives it a TTL (an hour without a history TTL), a later call keeps the TTL it
    has, and a hash found without one (planted) gets one with the next task's first call."""
    tag = backend.tag(0)
    stats = f"{tag}:stats"
    call(backend, "k1", task="a")
    assert backend.client.hget(stats, "i|a") == b"1"
    assert 3_500_000 < backend.client.pttl(stats) <= 3_600_000
    backend.client.pexpire(stats, 50_000)
    call(backend, "k1", task="a")
    call(backend, "k2", task="b")
    assert backend.client.hmget(stats, "i|a", "i|b") == [b"2", b"1"]
    assert 0 < backend.client.pttl(stats) <= 50_000  # kept, not moved
    backend.client.persist(stats)  # Redis only: a hash without a TTL
    call(backend, "k3", task="c")
    assert 3_500_000 < backend.client.pttl(stats) <= 3_600_000
