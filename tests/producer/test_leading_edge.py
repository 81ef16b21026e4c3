"""Issue 11, item 1: ``debounce_leading`` / ``debounce_trailing`` (lodash's
``debounce(func, wait, {leading, trailing, maxWait})``). The timeline rules of
docs/concepts.md ("Leading and trailing edge"), one test each: on the scripts
(fakeredis and a real redis-server) and on a real worker."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, running_worker, wait_until
from prometheus_client import CollectorRegistry
from reads import nothing_stored

from celery_debounce import (
    DebounceAdmin,
    DebounceBackendError,
    DebounceConfigError,
    enqueue_many,
)
from celery_debounce.aliases import fixed_id
from celery_debounce.ops import metrics
from celery_debounce.ops.cli import render_stats, render_table
from celery_debounce.ops.read_view import list_windows
from celery_debounce.producer.call import prepare_call
from celery_debounce.producer.gate import GateResult, enter
from celery_debounce.producer.options import build_spec
from celery_debounce.signals import call_suppressed, leading_run
from celery_debounce.store import WindowStore
from celery_debounce.store.idents import window_ident
from celery_debounce.store.redis.codec import gate_args
from celery_debounce.store.redis.keys import quiet_key

pytestmark = pytest.mark.usefixtures("store")

LEAD = (True, False)
BOTH = (True, True)
TRAIL = (False, True)


def call(
    backend: WindowStore,
    key: str,
    edge: tuple[bool, bool],
    *,
    payload: int = 0,
    window: str = "1h",
    max_wait: str = "2h",
    replace: bool = False,
    task_id: str | None = None,
) -> GateResult:
    spec = build_spec(window, "{0}", max_wait, replace, None, *edge)
    options: dict[str, object] = {}
    prepared = prepare_call(
        backend.settings, "t", spec, (key, payload), {}, options, None, "json", task_id
    )
    return enter(backend, prepared, fixed_id(task_id, options))


def record(backend: WindowStore, key: str) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in backend.client.hgetall(key).items() if k != b"p"}


def admin_of(backend: WindowStore) -> DebounceAdmin:
    admin = DebounceAdmin.__new__(DebounceAdmin)
    admin.app, admin.store, admin.settings = None, backend, backend.settings  # type: ignore[assignment]
    return admin


# -- rule 1: a leading call runs at once --------------------------------------------------
def test_rule_1_a_leading_call_is_due_at_once_and_starts_a_quiet_period(
    backend: WindowStore,
) -> None:
    tag = backend.tag(0)
    first = call(backend, "k", LEAD)
    assert first.opened and first.edge == "lead" and first.calls == 1
    assert first.deadline_ms == first.now_ms  # due now, not after the hour
    rec = record(backend, f"{tag}:win:{first.task_id}")
    assert rec["st"] == "dispatching" and rec["ld"] == "1" and rec["tries"] == "0"
    assert "cx" not in rec  # a leading run, not a cap close
    assert backend.client.zscore(f"{tag}:leased", first.task_id) == first.now_ms
    assert backend.client.zscore(f"{tag}:due", "1:t:k") is None
    quiet = record(backend, f"{tag}:quiet:1:t:k")
    assert quiet == {
        "id": first.task_id,
        "fs": str(first.now_ms),
        "mw": "7200000",
        "dl": str(first.now_ms + 3_600_000),
        "n": "1",
        "m": "L",
    }
    assert 0 < backend.client.pttl(f"{tag}:quiet:1:t:k") <= 3_600_000
    (taken,) = backend.take(0, 10).windows
    assert taken.task_id == first.task_id and taken.leading and not taken.capped
    assert taken.payload == b'[["k", 0], {}, {}]'
    row = admin_of(backend).stats(census=False).tasks["t"]
    assert (row.runs, row.calls, row.leading_runs, row.suppressed) == (1, 1, 1, 0)


# -- rule 2: leading only, calls in the quiet period are suppressed ------------------------
def test_rule_2_leading_only_suppresses_calls_in_the_quiet_period(backend: WindowStore) -> None:
    tag = backend.tag(0)
    first = call(backend, "k", LEAD)
    later = [call(backend, "k", LEAD, payload=i) for i in range(1, 4)]
    assert all(r.edge == "suppressed" and not r.opened for r in later)
    assert {r.task_id for r in later} == {first.task_id}  # the run that carries them
    assert [r.calls for r in later] == [2, 3, 4]
    assert not backend.client.exists(f"{tag}:open:1:t:k")  # no window: nothing more runs
    assert backend.client.zcard(f"{tag}:due") == 0
    assert [w.task_id for w in backend.take(0, 10).windows] == [first.task_id]
    row = admin_of(backend).stats(census=False).tasks["t"]
    assert (row.runs, row.leading_runs, row.suppressed) == (1, 1, 3)


# -- rule 3: the quiet period slides, bounded by the leading call's max wait ----------------
def test_rule_3_the_quiet_period_slides_up_to_the_leading_calls_ceiling(
    backend: WindowStore,
) -> None:
    tag = backend.tag(0)
    first = call(backend, "k", LEAD, window="1h", max_wait="90m")
    later = call(backend, "k", LEAD, window="1h")
    assert later.deadline_ms == min(later.now_ms + 3_600_000, first.now_ms + 5_400_000)
    assert backend.client.hget(f"{tag}:quiet:1:t:k", "dl") == str(later.deadline_ms).encode()
    # a call with a long window of its own cannot push it past the ceiling
    longer = call(backend, "k", LEAD, window="2h", max_wait="3h")
    assert longer.deadline_ms == first.now_ms + 5_400_000


# -- rule 4: after the quiet period the next call is a new leading call -------------------
def test_rule_4_after_the_quiet_period_the_next_call_leads_again(backend: WindowStore) -> None:
    tag = backend.tag(0)
    first = call(backend, "k", LEAD, window="1s", max_wait="1s")
    # end the quiet period (as time would): its end is in the past
    backend.client.hset(f"{tag}:quiet:1:t:k", "dl", first.now_ms - 1)
    again = call(backend, "k", LEAD)
    assert again.edge == "lead" and again.opened and again.task_id != first.task_id
    # the quiet key expires with the quiet period
    wait_until(
        lambda: (
            call(backend, "x", LEAD, window="1s", max_wait="1s").edge == "lead"
            if not backend.client.exists(f"{tag}:quiet:1:t:x")
            else False
        ),
        timeout=10,
    )


# -- rule 5: leading and trailing ----------------------------------------------------------
def test_rule_5_leading_and_trailing_runs_once_more_at_the_end_of_the_quiet_period(
    backend: WindowStore,
) -> None:
    tag = backend.tag(0)
    first = call(backend, "k", BOTH, window="1h", max_wait="90m")
    assert first.edge == "lead"
    second = call(backend, "k", BOTH, payload=1, window="1h")
    third = call(backend, "k", BOTH, payload=2, window="1h")
    assert second.opened and second.edge == "" and second.task_id != first.task_id
    assert third.task_id == second.task_id and third.calls == 2
    rec = record(backend, f"{tag}:open:1:t:k")
    # the trailing window inherits the leading call's first seen and max wait: its
    # deadline is the quiet period's end, never past the leading call's ceiling
    assert rec["fs"] == str(first.now_ms) and rec["mw"] == "5400000" and rec["tr"] == "1"
    due = backend.client.zscore(f"{tag}:due", "1:t:k")
    assert due == min(third.now_ms + 3_600_000, first.now_ms + 5_400_000)
    assert backend.client.hget(f"{tag}:quiet:1:t:k", "dl") == str(int(due)).encode()
    # only the leading run is due now; the trailing one carries the first payload
    assert [w.task_id for w in backend.take(0, 10).windows] == [first.task_id]
    backend.client.zadd(f"{tag}:due", {"1:t:k": 0})  # its deadline comes
    (trailing,) = backend.take(0, 10).windows
    assert trailing.task_id == second.task_id and trailing.calls == 2
    assert trailing.payload == b'[["k", 1], {}, {}]' and not trailing.leading


def test_rule_5_the_trailing_run_carries_the_newest_payload_when_configured(
    backend: WindowStore,
) -> None:
    tag = backend.tag(0)
    call(backend, "k", BOTH, replace=True)
    call(backend, "k", BOTH, payload=1, replace=True)
    call(backend, "k", BOTH, payload=2, replace=True)
    backend.take(0, 10)
    backend.client.zadd(f"{tag}:due", {"1:t:k": 0})
    (trailing,) = backend.take(0, 10).windows
    assert trailing.payload == b'[["k", 2], {}, {}]'


# -- rule 6: a burst of one runs once ------------------------------------------------------
def test_rule_6_a_burst_of_one_runs_once(backend: WindowStore) -> None:
    tag = backend.tag(0)
    only = call(backend, "k", BOTH)
    assert only.edge == "lead"
    assert [w.task_id for w in backend.take(0, 10).windows] == [only.task_id]
    assert not backend.client.exists(f"{tag}:open:1:t:k")
    assert backend.client.zcard(f"{tag}:due") == 0  # no trailing window: nothing more runs
    backend.client.hset(f"{tag}:quiet:1:t:k", "dl", 0)  # the quiet period ends
    assert backend.take(0, 10).windows == []


# -- rule 7: the mode is per call; trailing-only calls ignore the quiet period -------------
def test_rule_7_a_trailing_only_call_ignores_the_quiet_period_and_leading_calls_join_it(
    backend: WindowStore,
) -> None:
    tag = backend.tag(0)
    plain = call(backend, "k", TRAIL)
    assert plain.opened and plain.edge == ""
    # no quiet period, a window open: a leading call joins it (its effect is pending)
    joined = call(backend, "k", LEAD)
    assert joined.task_id == plain.task_id and joined.edge == "" and joined.calls == 2
    assert not backend.client.exists(f"{tag}:quiet:1:t:k")
    lead = call(backend, "j", LEAD)
    after = call(backend, "j", TRAIL)  # a trailing-only call opens its own window
    assert after.opened and after.task_id != lead.task_id and after.edge == ""


def test_a_trailing_only_call_sends_nothing_extra(backend: WindowStore) -> None:
    spec = build_spec("1h", "{0}", "2h", False)
    assert spec.edge is None
    prepared = prepare_call(backend.settings, "t", spec, ("k",), {}, {}, None, "json")
    assert len(gate_args(backend, prepared)) == 7  # the hot path's ARGV, unchanged
    lead = prepare_call(
        backend.settings,
        "t",
        build_spec("1h", "{0}", "2h", False, None, True, True),
        ("k",),
        {},
        {},
        None,
        "json",
    )
    assert gate_args(backend, lead)[7:] == [
        "",
        "",
        "",
        "",
        "",
        b"B",
        backend.settings.history_ttl_ms,
    ]
    capped = prepare_call(
        backend.settings,
        "t",
        build_spec("1h", "{0}", "2h", False, 3, True, False),
        ("k",),
        {},
        {},
        None,
        "json",
    )
    assert gate_args(backend, capped)[7:] == [
        "",
        "",
        "",
        "",
        3,
        b"L",
        backend.settings.history_ttl_ms,
    ]


def test_a_leading_call_with_a_caller_chosen_id(backend: WindowStore) -> None:
    first = call(backend, "k", BOTH, task_id="mine")
    assert first.task_id == "mine" and first.edge == "lead"
    second = call(backend, "k", BOTH, task_id="other")
    assert second.opened and second.task_id == "other"  # opens the trailing window


# -- the options -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("debounce_leading", 1),
        ("debounce_leading", "yes"),
        ("debounce_trailing", None),
        ("debounce_trailing", 0),
    ],
)
def test_edge_options_are_strict_bools(app: Celery, name: str, bad: Any) -> None:
    with pytest.raises(
        DebounceConfigError, match=rf"^[\w.]+: {name}={bad!r}: expected True or False"
    ):

        @debounced(
            app,
            lazy=False,
            debounce="1s",
            debounce_max_wait="1m",
            **{name: bad},
        )
        def job() -> None:  # pragma: no cover - never registered
            pass


def test_neither_edge_is_refused_at_registration(app: Celery) -> None:
    with pytest.raises(
        DebounceConfigError, match=r"^[\w.]+: debounce_leading=False, debounce_trailing=False: "
    ):

        @debounced(
            app,
            lazy=False,
            debounce="1s",
            debounce_max_wait="1m",
            debounce_trailing=False,
        )
        def job() -> None:  # pragma: no cover - never registered
            pass


def test_neither_edge_is_refused_per_call_and_writes_nothing(
    app: Celery, redis_client: redis.Redis
) -> None:
    @debounced(
        app,
        debounce="1s",
        debounce_max_wait="1m",
        debounce_leading=True,
    )
    def job(x: int) -> None:  # pragma: no cover - never run
        pass

    with pytest.raises(DebounceConfigError, match=r"^debounce_leading=False, debounce_trailing"):
        job.apply_async((1,), debounce_leading=False, debounce_trailing=False)
    with pytest.raises(DebounceConfigError, match=r"^debounce_trailing='no': expected"):
        job.apply_async((1,), debounce_trailing="no")
    with pytest.raises(DebounceConfigError, match=r"cannot be combined with task_id="):
        job.apply_async((1,), task_id="fixed", debounce_trailing=False)  # see design.md
    assert nothing_stored(app)


# -- on a real worker ----------------------------------------------------------------
def _settled(app: Celery) -> bool:
    return not list_windows(app, states=["pending", "dispatching", "queued", "claimed"])


def test_worker_leading_only_burst_runs_once_at_once_and_suppresses_the_rest(app: Celery) -> None:
    runs: list[tuple[str, int, float]] = []

    @debounced(
        app,
        bind=True,
        debounce="20s",
        debounce_max_wait="1m",
        debounce_key="{user}",
        debounce_leading=True,
        debounce_trailing=False,
    )
    def refresh(self: Any, user: str, i: int) -> int:
        runs.append((self.request.id, i, time.time()))
        return i

    suppressed: list[dict[str, Any]] = []

    def on_suppressed(sender: str, **kw: Any) -> None:
        suppressed.append(kw)

    call_suppressed.connect(on_suppressed, weak=False)
    registry = CollectorRegistry()
    enabled = metrics.enable(registry)
    try:
        with running_worker(app):
            start = time.time()
            results = [refresh.delay("u1", i) for i in range(10)]
            # the leading call runs at once (well before the 20 s window) ...
            assert results[0].get(timeout=15) == 0
            assert runs[0][2] - start < 15
            # ... and every suppressed call resolves to that run
            assert {r.id for r in results} == {results[0].id}
            assert all(r.get(timeout=5) == 0 for r in results)
            wait_until(lambda: _settled(app))
            assert len(runs) == 1
    finally:
        call_suppressed.disconnect(on_suppressed)
        enabled.disable()
    labels = {"task": refresh.name}
    assert registry.get_sample_value("celery_debounce_leading_runs_total", labels) == 1
    assert registry.get_sample_value("celery_debounce_calls_suppressed_total", labels) == 9
    assert registry.get_sample_value("celery_debounce_windows_opened_total", labels) == 1
    assert len(suppressed) == 9 and {s["task_id"] for s in suppressed} == {results[0].id}
    row = DebounceAdmin(app).stats().tasks[refresh.name]
    assert (row.runs, row.calls, row.leading_runs, row.suppressed) == (1, 1, 1, 9)


@pytest.mark.redis_only("reads the quiet period's Redis key")
def test_worker_leading_and_trailing_burst_runs_first_then_trailing(app: Celery) -> None:
    runs: list[tuple[str, int, float]] = []

    @debounced(
        app,
        bind=True,
        debounce="3s",
        debounce_max_wait="1m",
        debounce_key="{user}",
        debounce_leading=True,
        debounce_replace_payload=True,
    )
    def refresh(self: Any, user: str, i: int) -> int:
        runs.append((self.request.id, i, time.time()))
        return i

    leads: list[dict[str, Any]] = []

    def on_lead(sender: str, **kw: Any) -> None:
        leads.append(kw)

    leading_run.connect(on_lead, weak=False)
    try:
        with running_worker(app):
            results = [refresh.delay("u1", i) for i in range(5)]
            burst_end = time.time()
            assert results[0].get(timeout=20) == 0  # the first call, at once
            trailing_id = results[1].id
            assert trailing_id != results[0].id
            assert {r.id for r in results[1:]} == {trailing_id}
            assert results[4].get(timeout=30) == 4  # the newest payload, at the end
            wait_until(lambda: _settled(app))
            # burst of one: runs once, not twice
            single = refresh.delay("u2", 7)
            assert single.get(timeout=20) == 7
            wait_until(lambda: not quiet_running(refresh, "u2", 7), timeout=15)
            wait_until(lambda: _settled(app))
    finally:
        leading_run.disconnect(on_lead)
    assert [(r[0], r[1]) for r in runs] == [(results[0].id, 0), (trailing_id, 4), (single.id, 7)]
    assert runs[1][2] >= burst_end + 2  # the trailing run waited for the quiet period
    assert sorted(x["task_id"] for x in leads) == sorted([results[0].id, single.id])
    row = DebounceAdmin(app).stats().tasks[refresh.name]
    assert (row.runs, row.calls, row.leading_runs, row.suppressed) == (3, 6, 2, 0)


@pytest.mark.redis_only("reads the quiet period's Redis key")
def test_worker_a_burst_of_one_runs_once(app: Celery) -> None:
    runs: list[str] = []

    @debounced(
        app,
        bind=True,
        debounce="2s",
        debounce_max_wait="1m",
        debounce_leading=True,
    )
    def ping(self: Any, x: int) -> int:
        runs.append(self.request.id)
        return x

    with running_worker(app):
        result = ping.delay(1)
        assert result.get(timeout=20) == 1
        # the quiet period ends with no trailing run
        wait_until(lambda: not quiet_running(ping, 1), timeout=15)
        wait_until(lambda: _settled(app))
    assert runs == [result.id]


def quiet_running(task: Any, *args: Any) -> bool:
    admin = DebounceAdmin(task.app)
    ident = window_ident(task.name, task._debounce_key_of(args, {}, None))
    return bool(admin.store.client.exists(quiet_key(admin.store.tag(0), ident)))


def test_worker_the_ceiling_bounds_the_quiet_period(app: Celery) -> None:
    """A stream that never pauses for a whole window: the quiet period ends at the
    leading call's max wait, so the next call leads again (leading only)."""
    runs: list[tuple[int, float]] = []

    @debounced(
        app,
        debounce="3s",
        debounce_max_wait="4s",
        debounce_key="{user}",
        debounce_leading=True,
        debounce_trailing=False,
    )
    def refresh(user: str, i: int) -> int:
        runs.append((i, time.time()))
        return i

    with running_worker(app):
        start = time.time()
        results = [(refresh.delay("u1", 0), start)]
        i = 0
        while time.time() - start < 7:  # a call every 0.5 s: never a 3 s pause
            i += 1
            results.append((refresh.delay("u1", i), time.time()))
            time.sleep(0.5)
        leads = list(dict.fromkeys(r.id for r, _ in results))  # in call order
        assert len(leads) >= 2  # the ceiling (4 s) ended the first quiet period
        second_lead = next(at for r, at in results if r.id == leads[1])
        assert second_lead >= start + 3  # not before the ceiling (1 s slack for clocks)
        for r, _ in results:
            r.get(timeout=20)
        wait_until(lambda: _settled(app))
    assert runs[0][0] == 0 and len(runs) == len(leads)  # one run per quiet period


def test_worker_per_call_override(app: Celery) -> None:
    runs: list[int] = []

    @debounced(
        app,
        debounce="30s",
        debounce_max_wait="1m",
        debounce_key="{user}",
    )
    def refresh(user: str, i: int) -> int:
        runs.append(i)
        return i

    with running_worker(app):
        start = time.time()
        lead = refresh.apply_async(("u1", 0), debounce_leading=True, debounce_trailing=False)
        assert lead.get(timeout=20) == 0 and time.time() - start < 20  # not after 30 s
        again = refresh.apply_async(("u1", 1), debounce_leading=True, debounce_trailing=False)
        assert again.id == lead.id and again.get(timeout=5) == 0  # suppressed
        wait_until(lambda: _settled(app))
    assert runs == [0]


def test_inspect_shows_the_edge_state(app: Celery) -> None:
    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_leading=True,
    )
    def job(x: int) -> None:  # pragma: no cover - never run (no worker)
        pass

    lead = job.delay(1)
    trailing = job.delay(1)
    plain = job.apply_async((2,), debounce_leading=False)
    by_id = {w.task_id: w for w in list_windows(app)}
    assert (by_id[lead.id].state, by_id[lead.id].edge) == ("dispatching", "leading")
    assert (by_id[trailing.id].state, by_id[trailing.id].edge) == ("pending", "trailing")
    assert by_id[plain.id].edge is None
    assert by_id[trailing.id].as_json()["edge"] == "trailing"
    assert by_id[trailing.id].first_seen == by_id[lead.id].first_seen  # inherited
    assert DebounceAdmin(app).find(lead.id).edge == "leading"  # type: ignore[union-attr]
    assert job.debounce_pending(1).edge == "trailing"  # type: ignore[union-attr]
    # the leading run shows its quiet period's end: the trailing window's deadline
    assert by_id[lead.id].quiet_until == by_id[trailing.id].deadline
    assert by_id[trailing.id].quiet_until is None
    assert DebounceAdmin(app).find(lead.id).quiet_until == by_id[trailing.id].deadline  # type: ignore[union-attr]
    table = render_table(list(by_id.values()), time.time())
    assert "dispatching (leading)" in table and "pending (trailing)" in table
    assert "quiet period ends in 59m" in table or "quiet period ends in 1h" in table


def test_enqueue_many_follows_the_edge_rules(app: Celery) -> None:
    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{0}",
        debounce_leading=True,
        debounce_trailing=False,
    )
    def job(user: str, i: int) -> None:  # pragma: no cover - never run (no worker)
        pass

    results = enqueue_many(job, [(("u1", i), {}) for i in range(5)] + [(("u2", 0), {})])
    assert len({r.id for r in results[:5]}) == 1  # one leading run, four suppressed
    assert results[5].id != results[0].id
    by_id = {w.task_id: w for w in list_windows(app)}
    assert {by_id[r.id].edge for r in results} == {"leading"}
    stats = DebounceAdmin(app).stats()
    assert stats.tasks[job.name].suppressed == 4
    as_json = stats.as_json()["tasks"][0]
    assert (as_json["leading_runs"], as_json["suppressed"]) == (0, 4)  # runs: when taken
    header, row = render_stats(stats).splitlines()[1:3]
    assert "LEADING" in header
    at = header.index("SUPPRESSED")  # the table's columns are aligned
    assert row[at:].split()[0] == "4"


def test_enqueue_many_refuses_a_fixed_id_and_writes_nothing(
    app: Celery, redis_client: redis.Redis
) -> None:
    """``enqueue_many(..., task_id=...)`` gives no call that id (each call gets its own
    or joins a window): a caller waiting on ``AsyncResult(task_id)`` would wait forever,
    and with leading only it would slip past the fixed-id refusal. Refused by name."""

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{0}",
        debounce_leading=True,
        debounce_trailing=False,
    )
    def job(user: str) -> None:  # pragma: no cover - never run (no worker)
        pass

    with pytest.raises(DebounceConfigError, match=r"^task_id='fixed': enqueue_many"):
        enqueue_many(job, [(("u1",), {}), (("u1",), {})], task_id="fixed")
    assert nothing_stored(app)


@pytest.mark.redis_only("the windows' Redis down (debounce_redis_url)")
def test_a_leading_call_during_a_redis_outage_is_an_error_not_a_lost_run(
    app_factory: Any, redis_client: redis.Redis
) -> None:
    """The leading run is a window written by the one gate call: with the windows'
    Redis down the call raises DebounceBackendError in seconds and nothing is
    written anywhere (no quiet period without its run)."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    dead = listener.getsockname()[1]
    listener.close()  # nothing listens there: connections are refused
    app = app_factory(debounce_redis_url=f"redis://127.0.0.1:{dead}/0")

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_leading=True,
        debounce_trailing=False,
    )
    def job(x: int) -> None:  # pragma: no cover - never run
        pass

    start = time.monotonic()
    with pytest.raises(DebounceBackendError):
        job.delay(1)
    assert time.monotonic() - start < 10
    assert not list(redis_client.scan_iter(match="debounce:*"))  # Redis only: no key


def test_canvas_with_both_edges_resolves_every_member_and_leading_only_is_refused(
    app: Celery,
) -> None:
    """A chord whose members are edge calls: the first leads, the rest join the trailing
    window as aliases; every member id resolves and the chord's body runs. Leading
    only in a group is refused before anything is written (a suppressed member's id
    would never resolve: docs/design.md)."""
    from celery import chord, group

    runs: list[int] = []

    @debounced(
        app,
        name="canvas.edge",
        debounce="500ms",
        debounce_max_wait="5s",
        debounce_key="{0}",
        debounce_leading=True,
        debounce_trailing=True,
    )
    def edge(key: str, x: int) -> int:
        runs.append(x)
        return x

    @app.task(shared=False, name="canvas.total")
    def total(results: list[int]) -> list[int]:
        return results

    with running_worker(app):
        done = chord([edge.s("k", i) for i in range(3)], total.s()).apply_async()
        assert done.get(timeout=15) == [0, 1, 1]  # leading run 0, trailing run: 1st payload
        with pytest.raises(DebounceConfigError, match="cannot be combined with task_id="):
            group(edge.s("g", i).set(debounce_trailing=False) for i in range(2)).apply_async()
        wait_until(lambda: _settled(app))
    assert sorted(runs) == [0, 1]
    assert not list_windows(app, key_glob="g")
