"""Foreign data under the package prefix and stale dispatchers must not block others.

* A key of the wrong Redis type where a window record should be (``open:<ident>``,
  ``win:<id>`` of a leased window, the stats hash), or a record with missing
  fields: the dispatcher sets it aside with an ERROR log line and every other
  window of the shard keeps flowing.
* ``release.lua`` moves a lease only while it is still the caller's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import redis
from celery import Celery
from fault_app import build
from helpers import debounced, make_app, running_worker, wait_until

from celery_debounce import DebounceBackendError
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.ops.read_view import list_windows
from celery_debounce.store import store_for

pytestmark = pytest.mark.slow


def runs(client: redis.Redis, key: str) -> list[str]:
    return [r.decode() for r in client.lrange(f"runs:{key}", 0, -1)]


def open_key(client: redis.Redis, key: str) -> bytes:
    (name,) = client.keys(f"debounce:{{0}}:open:*:k:{key}")
    return bytes(name)


def test_wrong_type_keys_and_broken_records_do_not_block_the_shard(
    redis_server: str,
    redis_client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = build(redis_server, lease=0.3)
    record = app.tasks["faults.record"]
    backend = store_for(app)
    # a window taken by a dispatcher that then died, whose record is overwritten by a string
    leased = record.delay("leased").id
    wait_until(lambda: backend.take(0, 10).windows, 5)
    redis_client.delete(f"debounce:{{0}}:win:{leased}")
    redis_client.set(f"debounce:{{0}}:win:{leased}", "not a hash")
    # an open window whose record is replaced by a list
    record.delay("open")
    bad_open = open_key(redis_client, "open")
    redis_client.delete(bad_open)
    redis_client.rpush(bad_open, "x")
    # an open record missing its deadline and call count
    broken = record.delay("broken").id
    redis_client.hdel(open_key(redis_client, "broken"), "dl", "n")
    # the stats counters overwritten by a string
    redis_client.set("debounce:{0}:stats", "0")
    good = [record.delay(f"g{i}") for i in range(3)]

    caplog.set_level(logging.ERROR, "celery_debounce.dispatcher")
    with running_worker(app):
        wait_until(lambda: all(runs(redis_client, f"g{i}") == [good[i].id] for i in range(3)), 15)
        quarantined = wait_until(
            lambda: (q := list_windows(app, states=["quarantined"])) and len(q) == 2 and q, 10
        )
        # the shard keeps flowing: a new call after the bad entries runs too
        again = record.delay("g0").id
        wait_until(lambda: runs(redis_client, "g0") == [good[0].id, again], 15)
    assert {w.task_id for w in quarantined} == {leased, broken}
    wrong_type = next(w for w in quarantined if w.task_id == leased)
    assert "WRONGTYPE" in (wrong_type.error or "")
    assert "unreadable record" in (next(w for w in quarantined if w.task_id == broken).error or "")
    assert f"skipped debounce:{{0}}:win:{leased}: WRONGTYPE" in caplog.text
    assert f"skipped {bad_open.decode()}: WRONGTYPE" in caplog.text
    assert f"quarantined window {broken}: unreadable record" in caplog.text
    assert not runs(redis_client, "leased") and not runs(redis_client, "broken")
    # left for an operator, out of the due and lease sets
    assert redis_client.type(bad_open) == b"list"
    assert not redis_client.zscore("debounce:{0}:leased", leased)
    assert redis_client.zcard("debounce:{0}:due") == 0
    # the one key whose open record is foreign gets a clear error, writes nothing
    with pytest.raises(DebounceBackendError, match="WRONGTYPE"):
        record.delay("open")
    assert redis_client.zcard("debounce:{0}:due") == 0


def test_release_leaves_a_lease_another_dispatcher_took_over(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    app = build(redis_server, lease=0.2)
    backend = store_for(app)
    tag = backend.tag(0)
    tid = app.tasks["faults.record"].delay("k").id
    (first,) = wait_until(lambda: backend.take(0, 10).windows, 5)  # dispatcher A
    # A's publish hangs past the lease; dispatcher B takes the window again
    (second,) = wait_until(lambda: backend.take(0, 10).windows, 5)
    assert (first.task_id, first.tries, second.tries) == (tid, 1, 2)
    lease = redis_client.zscore(f"{tag}:leased", tid)
    # A's publish fails at last: its release must not move B's lease
    time.sleep(0.01)
    assert backend.run("release", [f"{tag}:leased"], [1000, tag, tid, first.tries])[0] == 0
    assert redis_client.zscore(f"{tag}:leased", tid) == lease
    # B's own failed publish is released
    assert backend.run("release", [f"{tag}:leased"], [1000, tag, tid, second.tries])[0] == 1
    assert redis_client.zscore(f"{tag}:leased", tid) > lease


def test_an_expired_message_finishes_its_window_as_revoked(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    """The worker drops an expired message without running it (task_revoked), and that
    signal finishes the window: no dispatcher runs beside the worker, so the expiry
    sweep (expire.lua, expires + 2 s) cannot be what finished it."""
    app = build(redis_server, debounce_dispatcher=False)
    tid = app.tasks["faults.record"].apply_async(("exp",), expires=0.3).id
    dispatcher = Dispatcher(app, name="test")
    wait_until(lambda: dispatcher.dispatch_once()[0], 5)  # published, no worker yet
    record = f"debounce:{{0}}:win:{tid}"
    assert redis_client.hget(record, "st") == b"queued"
    time.sleep(0.5)  # the message expires in the broker queue
    with running_worker(app):
        wait_until(lambda: redis_client.hget(record, "st") == b"finished", 10)
    assert redis_client.hget(record, "rs") == b"REVOKED"
    assert not runs(redis_client, "exp")
    assert not redis_client.zrange("debounce:{0}:active", 0, -1)


def _expiring_task(app: Celery, seconds: float = 0.0) -> Any:
    @debounced(
        app,
        name="rob.expiring",
        debounce="100ms",
        debounce_key="{0}",
        debounce_max_wait="1s",
    )
    def expiring(key: str) -> str:
        time.sleep(seconds)
        return key

    return expiring


def test_a_window_whose_message_expires_unseen_finishes_revoked_with_its_aliases(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    """Rule "every id resolves": a window published with ``expires=1`` to a queue no
    worker reads. No worker signal ever fires, yet once ``expires`` (plus the grace)
    has passed the dispatcher finishes the window as REVOKED and every id a caller
    holds (its own and a fixed-id alias) raises ``TaskRevokedError``; before, the
    window stayed ``queued`` and ``.get()`` waited until the record's TTL."""
    from celery.exceptions import TaskRevokedError

    app = make_app(redis_server, debounce_dispatcher=False)
    task = _expiring_task(app)
    first = task.apply_async(("x",), expires=1)
    alias = task.apply_async(("x",), expires=1, task_id="expiring-alias")
    dispatcher = Dispatcher(app, name="expiry")
    dispatcher.start()
    try:
        record = f"debounce:{{0}}:win:{first.id}"
        wait_until(lambda: redis_client.hget(record, "st") == b"queued", 5)
        for result in (first, app.AsyncResult(alias.id)):
            with pytest.raises(TaskRevokedError):
                result.get(timeout=10)
    finally:
        dispatcher.stop()
    assert redis_client.hget(record, "st") == b"finished"
    assert redis_client.hget(record, "rs") == b"REVOKED"
    assert not redis_client.zrange("debounce:{0}:active", 0, -1)
    assert not redis_client.zrange("debounce:{0}:expiring", 0, -1)


def test_expire_returns_a_window_it_finished_until_its_outcome_is_stored(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    """Script level: ``expire.lua`` finishes a queued window whose message expired
    and returns it (with its aliases) again on every call until the dispatcher has
    stored the outcome (``store.expired``): a lost reply or a dispatcher killed in
    between never leaves its callers waiting. A claimed window is left as it is and a
    dispatching one is looked at again later."""
    from celery_debounce.store import EXPIRY_GRACE_MS

    store = store_for(make_app(redis_server))
    tag = "debounce:{0}"
    past = store.time_ms() - EXPIRY_GRACE_MS - 1000
    for tid, st in (("q1", "queued"), ("c1", "claimed"), ("d1", "dispatching")):
        redis_client.hset(
            f"{tag}:win:{tid}",
            mapping={"st": st, "id": tid, "na": 1, "a1": f'{{"id": "al-{tid}"}}'},
        )
        redis_client.zadd(f"{tag}:expiring", {tid: past})
        redis_client.zadd(f"{tag}:active", {tid: past})
    first = store.expire(0)
    assert first == [("q1", [{"id": "al-q1"}])]
    assert store.expire(0) == first  # the reply was lost: returned again
    assert redis_client.hget(f"{tag}:win:q1", "st") == b"finished"
    assert redis_client.hget(f"{tag}:win:q1", "rs") == b"REVOKED"
    assert redis_client.hget(f"{tag}:win:c1", "st") == b"claimed"
    store.expired(0, ["q1"])
    assert store.expire(0) == []
    assert redis_client.zrange(f"{tag}:expiring", 0, -1) == [b"d1"]  # looked at again
    assert redis_client.zrange(f"{tag}:active", 0, -1) == [b"c1", b"d1"]


def test_a_run_claimed_before_its_expires_is_never_revoked_by_the_expiry(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    """The other side of the rule: a window whose run started before ``expires`` and
    is still running when ``expires`` (plus the grace) passes is left alone: it stays
    ``claimed``, its result is not REVOKED, and it finishes as SUCCESS."""
    app = make_app(redis_server)
    task = _expiring_task(app, seconds=4.5)
    call = task.apply_async(("y",), expires=1)
    record = f"debounce:{{0}}:win:{call.id}"
    with running_worker(app):
        wait_until(lambda: redis_client.hget(record, "st") == b"claimed", 5)
        time.sleep(3.2)  # past expires + the grace, while the run is going on
        assert redis_client.hget(record, "st") == b"claimed"
        assert call.state != "REVOKED"
        assert call.get(timeout=10) == "y"
    assert redis_client.hget(record, "rs") == b"SUCCESS"


def test_a_dispatcher_without_the_task_publishes_with_the_payloads_serializer(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """A standalone dispatcher need not import the tasks; a pickled window stays pickled
    (send_task would otherwise encode it with the app's default serializer, json)."""
    runs: list[Any] = []

    def register(app: Celery) -> Any:
        @debounced(
            app,
            name="rob.pickled",
            debounce="100ms",
            debounce_key="k",
            debounce_max_wait="1s",
            serializer="pickle",
        )
        def pickled(x: Any) -> None:
            runs.append(x)

        return pickled

    producer, worker, dispatcher_app = (
        app_factory(accept_content=["json", "pickle"], debounce_dispatcher=False) for _ in range(3)
    )
    task = register(producer)
    register(worker)
    task.delay({1, 2})
    with running_worker(worker):
        dispatcher = Dispatcher(dispatcher_app, name="standalone")
        wait_until(lambda: dispatcher.dispatch_once()[0], 5)
        wait_until(lambda: runs, 10)
    assert runs == [{1, 2}]
    assert not list_windows(producer, states=["quarantined"])


def test_a_state_a_newer_version_wrote_is_read_and_claimed_not_refused(
    redis_server: str, redis_client: redis.Redis
) -> None:
    """During a deploy a newer package's scripts may write a state this one does not
    know. Reading it (a claim, an operator's read) passes it through as it is: a reader
    that refused it would fail a claim whose run the script already decided."""
    app = build(redis_server, lease=0.3)
    backend = store_for(app)
    task_id = app.tasks["faults.record"].delay("newer").id
    (taken,) = wait_until(lambda: backend.take(0, 10).windows, 5)
    assert backend.ack(0, [taken.task_id]) == 1
    redis_client.hset(f"debounce:{{0}}:win:{task_id}", "st", "parked")
    found = backend.taken(task_id)
    assert found is not None and found[1].state == "parked"
    claimed = backend.claim(0, task_id, "faults.record")
    assert claimed.before == "parked"  # the script's own verdict, whatever it is
