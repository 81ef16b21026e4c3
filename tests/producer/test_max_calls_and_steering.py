"""Issue 11, items 3 and 4: ``debounce_max_calls`` (a cap on calls per window) and
steering a window by the task's own arguments (``debounce_pending/flush/cancel``,
``testing.assert_pending``). Scripts on fakeredis and a real redis-server; runs on a
real worker."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import TaskRevokedError
from helpers import debounced, running_worker, wait_until
from reads import nothing_stored

from celery_debounce import DebounceAdmin, DebounceConfigError, WindowNotFound
from celery_debounce.aliases import fixed_id
from celery_debounce.ops.read_view import list_windows
from celery_debounce.producer.call import prepare_call
from celery_debounce.producer.gate import GateResult, enter
from celery_debounce.producer.options import build_spec
from celery_debounce.signals import window_closed_by_cap
from celery_debounce.store import WindowStore
from celery_debounce.store.redis.codec import gate_args
from celery_debounce.testing import assert_not_pending, assert_pending

pytestmark = pytest.mark.usefixtures("store")


def call(
    backend: WindowStore,
    key: str,
    max_calls: int | None,
    *,
    payload: int = 0,
    task_id: str | None = None,
    window: str = "1h",
) -> GateResult:
    spec = build_spec(window, "{0}", "2h", False, max_calls)
    options: dict[str, object] = {}
    prepared = prepare_call(
        backend.settings, "t", spec, (key, payload), {}, options, None, "json", task_id
    )
    return enter(backend, prepared, fixed_id(task_id, options))


def keys(backend: WindowStore) -> set[str]:
    return {k.decode() for k in backend.client.scan_iter(match="debounce:*")}


# -- the cap, at the script level ------------------------------------------------------
def test_the_nth_call_closes_the_window_and_the_next_call_opens_a_new_one(
    backend: WindowStore,
) -> None:
    tag = backend.tag(0)
    first = [call(backend, "k", 3, payload=i) for i in range(3)]
    assert [r.calls for r in first] == [1, 2, 3]
    assert len({r.task_id for r in first}) == 1
    assert [r.opened for r in first] == [True, False, False]
    closer = first[2]
    assert closer.deadline_ms == closer.now_ms  # due at once, not after the hour
    tid = closer.task_id
    # closed as flush.lua closes: no open window, a dispatching record with an
    # already expired lease, marked closed by the cap; the cap stays readable
    assert f"{tag}:open:1:t:k" not in keys(backend)
    assert backend.client.zscore(f"{tag}:due", "1:t:k") is None
    assert backend.client.zscore(f"{tag}:leased", tid) == closer.now_ms
    rec = {
        k.decode(): v.decode()
        for k, v in backend.client.hgetall(f"{tag}:win:{tid}").items()
        if k != b"p"
    }
    assert rec["st"] == "dispatching" and rec["tries"] == "0" and rec["cx"] == "1"
    assert rec["mc"] == "3" and rec["n"] == "3" and rec["dl"] == str(closer.now_ms)
    # the next call opens a new window
    fourth = call(backend, "k", 3, payload=9)
    assert fourth.opened and fourth.task_id != tid and fourth.calls == 1
    # the closed window is taken at once by the next pass, with the opener's payload
    (taken,) = backend.take(0, 10).windows
    assert taken.task_id == tid and taken.calls == 3 and taken.capped and taken.tries == 1
    assert taken.payload == b'[["k", 0], {}, {}]'
    assert backend.client.pttl(f"{tag}:win:{tid}") > 0  # the record TTL, set at the take
    stats = DebounceAdmin.__new__(DebounceAdmin)
    stats.app, stats.store, stats.settings = None, backend, backend.settings  # type: ignore[assignment]
    row = stats.stats(census=False).tasks["t"]
    assert (row.runs, row.calls, row.closed_by_cap) == (1, 3, 1)
    # counted once: taken again after its lease expired, it is not counted again
    backend.client.zadd(f"{tag}:leased", {tid: 0})
    (again,) = backend.take(0, 10).windows
    assert again.task_id == tid and again.tries == 2
    assert stats.stats(census=False).tasks["t"].closed_by_cap == 1


def test_max_calls_one_makes_each_call_its_own_window_due_at_once(backend: WindowStore) -> None:
    results = [call(backend, "k", 1, payload=i) for i in range(3)]
    assert all(r.opened and r.calls == 1 and r.deadline_ms == r.now_ms for r in results)
    assert len({r.task_id for r in results}) == 3
    taken = backend.take(0, 10).windows
    assert sorted(w.task_id for w in taken) == sorted(r.task_id for r in results)
    assert all(w.capped for w in taken)
    assert not backend.client.zcard(f"{backend.tag(0)}:due")


def test_a_windows_cap_is_its_openers(backend: WindowStore) -> None:
    """Like the max wait: the call that opens a window sets its cap; joiners count
    against it whatever cap they carry (or none)."""
    opener = call(backend, "k", 2)
    joined = call(backend, "k", None)  # no cap of its own: still the window's 2nd call
    assert joined.task_id == opener.task_id and joined.deadline_ms == joined.now_ms
    uncapped = call(backend, "u", None)
    for _ in range(3):
        late = call(backend, "u", 1)  # a cap on a joiner does not close an uncapped window
        assert late.task_id == uncapped.task_id and late.deadline_ms > late.now_ms


def test_a_call_without_max_calls_sends_nothing_extra_and_stores_no_cap(
    backend: WindowStore,
) -> None:
    spec = build_spec("1h", "{0}", "2h", False)
    prepared = prepare_call(backend.settings, "t", spec, ("k",), {}, {}, None, "json")
    assert len(gate_args(backend, prepared)) == 7  # the hot path's ARGV, unchanged
    capped = prepare_call(
        backend.settings, "t", build_spec("1h", "{0}", "2h", False, 5), ("k",), {}, {}, None, "json"
    )
    assert gate_args(backend, capped)[7:] == ["", "", "", "", 5]
    enter(backend, prepared)
    tag = backend.tag(0)
    assert backend.client.hget(f"{tag}:open:1:t:k", "mc") is None
    enter(backend, capped)
    assert backend.client.hget(f"{tag}:open:1:t:k", "mc") is None  # the opener had none


def test_the_cap_with_caller_chosen_ids(backend: WindowStore) -> None:
    tag = backend.tag(0)
    first = call(backend, "k", 2, task_id="mine")
    assert first.task_id == "mine" and backend.client.hget(f"{tag}:ids", "mine") == b"1:t:k"
    second = call(backend, "k", 2, task_id="other")
    assert second.task_id == "mine" and second.deadline_ms == second.now_ms
    assert backend.client.hget(f"{tag}:ids", "mine") is None  # left the index when closed
    assert backend.client.hget(f"{tag}:win:mine", "a1") == b'{"id": "other"}'
    # "mine" is now a taken record: a new call under it opens under a fallback id
    third = call(backend, "k", 2, task_id="mine")
    assert third.opened and third.task_id != "mine"


# -- the option ---------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, True, "3", 2.5, 2**31])
def test_a_bad_max_calls_is_refused_at_registration(app: Celery, bad: Any) -> None:
    with pytest.raises(
        DebounceConfigError,
        match=rf"^[\w.]+: debounce_max_calls={bad!r}: expected a positive integer",
    ):

        @debounced(
            app,
            lazy=False,
            debounce="1s",
            debounce_max_wait="1m",
            debounce_max_calls=bad,
        )
        def job() -> None:  # pragma: no cover - never registered
            pass


def test_a_bad_per_call_max_calls_raises_and_writes_nothing(
    app: Celery, redis_client: redis.Redis
) -> None:
    @debounced(app, debounce="1s", debounce_max_wait="1m")
    def job(x: int) -> None:  # pragma: no cover - never run
        pass

    with pytest.raises(DebounceConfigError, match=r"^debounce_max_calls=0: expected"):
        job.apply_async((1,), debounce_max_calls=0)
    assert nothing_stored(app)


def test_a_burst_of_25_with_max_calls_10_runs_10_10_then_5(app: Celery) -> None:
    """The first two windows run at their 10th call, without waiting for the quiet
    period; the last one (5 calls) waits for it."""
    runs: list[tuple[str, float]] = []

    @debounced(
        app,
        bind=True,
        debounce="6s",
        debounce_max_wait="1m",
        debounce_key="report:{user}",
        debounce_max_calls=10,
    )
    def build_report(self: Any, user: str, i: int) -> int:
        runs.append((self.request.id, time.time()))
        return i

    closed: list[dict[str, Any]] = []

    def on_closed(sender: str, **kw: Any) -> None:
        closed.append(kw)

    window_closed_by_cap.connect(on_closed, weak=False)
    try:
        with running_worker(app):
            results = [build_report.delay("u1", i) for i in range(25)]
            burst_end = time.time()
            ids = [r.id for r in results]
            sizes = list(Counter(ids).values())
            assert sizes == [10, 10, 5]  # call order: 10 calls per window, then 5
            assert ids[:10] == [ids[0]] * 10 and ids[10:20] == [ids[10]] * 10
            # the two full windows run with the quiet period of the last one still open
            assert results[0].get(timeout=20) == 0 and results[10].get(timeout=20) == 10
            assert_pending(build_report, "u1", 0, calls=5)  # any i: the key is the user
            assert len(runs) == 2
            assert results[20].get(timeout=30) == 20  # after its 6 s quiet period
            assert runs[2][1] >= burst_end + 5  # the last one waited (Redis vs local clock)
            wait_until(
                lambda: (
                    not list_windows(app, states=["pending", "dispatching", "queued", "claimed"])
                )
            )
    finally:
        window_closed_by_cap.disconnect(on_closed)
    assert [r[0] for r in runs] == [ids[0], ids[10], ids[20]]
    admin = DebounceAdmin(app)
    row = admin.stats().tasks[build_report.name]
    assert (row.runs, row.calls, row.closed_by_cap) == (3, 25, 2)
    assert sorted(c["task_id"] for c in closed) == sorted([ids[0], ids[10]])
    assert all(c["calls"] == 10 for c in closed)


def test_inspect_shows_the_cap_of_an_open_window(app: Celery) -> None:
    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_max_calls=4,
    )
    def job(x: int) -> None:  # pragma: no cover - never run
        pass

    job.delay(1)
    job.apply_async((2,), debounce_max_calls=None)  # None: the task's cap applies
    job.apply_async((3,), debounce_max_calls=7)
    caps = sorted(w.max_calls or 0 for w in list_windows(app))
    assert caps == [4, 4, 7]
    (info,) = [w for w in list_windows(app) if w.max_calls == 7]
    assert info.as_json()["max_calls"] == 7
    assert job.debounce_pending(3).max_calls == 7


# -- steering by arguments -------------------------------------------------------------
def test_pending_flush_and_cancel_by_the_tasks_own_arguments(app: Celery) -> None:
    runs: list[tuple[str, int]] = []

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="report:{user_id}",
    )
    def build_report(user_id: str, revision: int = 0) -> str:
        runs.append((user_id, revision))
        return f"built {user_id}@{revision}"

    assert build_report.debounce_pending("u1") is None
    with pytest.raises(WindowNotFound):
        build_report.debounce_flush("u1")
    with pytest.raises(WindowNotFound):
        build_report.debounce_cancel("u1")
    with running_worker(app):
        first = [build_report.delay("u1", revision=i) for i in range(3)]
        other = build_report.delay(user_id="u2")
        pending = build_report.debounce_pending("u1")
        assert pending is not None
        assert (pending.task_id, pending.key, pending.calls) == (first[0].id, "report:u1", 3)
        assert build_report.debounce_pending(user_id="u2").task_id == other.id
        flushed = build_report.debounce_flush("u1", revision=99)  # revision plays no part
        assert flushed.task_id == first[0].id and flushed.calls == 3
        assert first[2].get(timeout=20) == "built u1@0"  # runs now, not in an hour
        assert build_report.debounce_pending("u1") is None
        cancelled = build_report.debounce_cancel("u2")
        assert cancelled.task_id == other.id and cancelled.calls == 1
        with pytest.raises(TaskRevokedError):
            other.get(timeout=10)
        assert build_report.debounce_pending("u2") is None
    assert runs == [("u1", 0)]


def test_steering_resolves_the_key_exactly_as_a_call(app: Celery) -> None:
    @debounced(app, debounce="1h", debounce_max_wait="2h")
    def digest(a: int, b: int = 2, *, c: dict[str, int] | None = None) -> None:
        pass  # pragma: no cover - never run

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k:{a}",
    )
    def templated(a: int, b: int = 0) -> None:
        pass  # pragma: no cover - never run

    r = digest.delay(1, c={"y": 1, "x": 2})  # default digest of all the arguments
    # the same call spelled differently: by name, default written out, keys reordered
    assert digest.debounce_pending(a=1, b=2, c={"x": 2, "y": 1}).task_id == r.id
    assert digest.debounce_pending(1, c={"x": 2}) is None  # other arguments, other key
    o = templated.apply_async((5,), debounce_key="custom:{b}")  # per-call key override
    assert templated.debounce_pending(5) is None
    assert templated.debounce_pending(5, debounce_key="custom:{b}").task_id == o.id
    assert templated.debounce_pending(a=9, b=0, debounce_key="custom:{b}").task_id == o.id
    # what a call refuses, steering refuses the same way, before reading anything
    with pytest.raises(TypeError):
        templated.debounce_pending()  # Celery's signature check: a missing argument
    with pytest.raises(DebounceConfigError, match=r"debounce_key='\{zz'"):
        templated.debounce_pending(1, debounce_key="{zz")


def test_steering_a_task_without_a_window_is_a_clear_error(app: Celery) -> None:
    @debounced(app)
    def plain(x: int) -> None:
        pass  # pragma: no cover - never run

    with pytest.raises(DebounceConfigError, match="has no debounce window"):
        plain.debounce_pending(1)


def test_assert_pending_and_assert_not_pending(app: Celery) -> None:
    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="u:{user}",
    )
    def touch(user: str, n: int = 0) -> None:
        pass  # pragma: no cover - never run

    assert_not_pending(touch, "a")
    with pytest.raises(AssertionError, match=r"no pending debounce window for .*\('a'\)"):
        assert_pending(touch, "a")
    touch.delay("a", 1)
    touch.delay("a", 2)
    window = assert_pending(touch, "a", calls=2)
    assert window.key == "u:a"
    with pytest.raises(AssertionError, match=r"has 2 call\(s\), expected 3"):
        assert_pending(touch, "a", calls=3)
    with pytest.raises(AssertionError, match="unexpected pending debounce window"):
        assert_not_pending(touch, user="a")
    touch.debounce_cancel("a")
    assert_not_pending(touch, "a")


def test_enqueue_many_and_send_task_honour_the_cap(app: Celery) -> None:
    from celery_debounce import enqueue_many, send_task

    @debounced(app, debounce="1h", debounce_max_wait="2h", debounce_key="k")
    def job(i: int) -> None:  # pragma: no cover - never run
        pass

    results = enqueue_many(job, [((i,), {}) for i in range(7)], debounce_max_calls=3)
    assert list(Counter(r.id for r in results).values()) == [3, 3, 1]
    assert_pending(job, 0, calls=1)
    by_name = [send_task(app, job.name, (i,), debounce_max_calls=2) for i in range(2)]
    # joiners: the window closes at its 3rd call, the opener's cap (theirs, 2, is ignored)
    assert by_name[0].id == by_name[1].id == results[6].id
    assert_not_pending(job, 0)
