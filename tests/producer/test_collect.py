"""Issue 11, item 2: ``debounce_collect=True``, the run receives every call of its window.

Scripts on fakeredis and a real redis-server; runs on a real worker with a real
redis-server (broker, results and windows).
"""

from __future__ import annotations

import json
import multiprocessing
from datetime import datetime
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounce_command, debounced, make_app, running_worker, wait_until
from reads import nothing_stored, open_count

from celery_debounce import (
    DebounceConfigError,
    DebouncedCall,
    DebouncedTask,
    DebouncePayloadError,
    send_task,
)
from celery_debounce.aliases import fixed_id
from celery_debounce.ops.read_view import list_windows
from celery_debounce.producer.call import prepare_call
from celery_debounce.producer.gate import GateResult, enter
from celery_debounce.producer.options import build_spec
from celery_debounce.store import WindowStore as Backend
from celery_debounce.store import store_for
from celery_debounce.store.redis.codec import gate_args, gate_keys, parse_reply

pytestmark = pytest.mark.usefixtures("store")


def call(
    backend: Backend,
    key: str,
    *,
    seq: int = 0,
    max_calls: int | None = None,
    collect: bool = True,
    task_id: str | None = None,
    pad: str = "",
) -> GateResult:
    spec = build_spec("1h", "{0}", "2h", False, max_calls, collect=collect)
    options: dict[str, object] = {}
    prepared = prepare_call(
        backend.settings, "t", spec, (key, seq), {"pad": pad}, options, None, "json", task_id
    )
    return enter(backend, prepared, fixed_id(task_id, options))


def elements(body: bytes) -> list[list[Any]]:
    args, kwargs, embed = json.loads(body)
    assert kwargs == {} and embed == {} and len(args) == 1
    return args[0]  # type: ignore[no-any-return]


def keys(backend: Backend) -> set[str]:
    return {k.decode() for k in backend.client.scan_iter(match="debounce:*")}


# -- scripts -----------------------------------------------------------------------
def test_a_collect_window_keeps_every_call_in_order(backend: Backend) -> None:
    tag = backend.tag(0)
    results = [call(backend, "k", seq=i) for i in range(5)]
    assert len({r.task_id for r in results}) == 1 and [r.calls for r in results] == [1, 2, 3, 4, 5]
    tid = results[0].task_id
    # pending: one list of elements, in call order, in the window's slot
    assert f"{tag}:calls:{tid}" in keys(backend)
    rec = backend.client.hgetall(f"{tag}:open:1:t:k")
    assert rec[b"cl"] == tid.encode() and rec[b"p"] == b"{}"
    flush = backend.client.zadd(f"{tag}:due", {"1:t:k": 0})  # due now
    assert flush == 0
    (taken,) = backend.take(0, 10).windows
    got = elements(taken.payload)
    assert [e[1:] for e in got] == [[["k", i], {"pad": ""}] for i in range(5)]
    assert [e[0] for e in got] == sorted(e[0] for e in got)  # Redis ms of each call
    assert [e[0] for e in got] == [r.now_ms for r in results]
    assert int(backend.client.hget(f"{tag}:win:{tid}", "cb")) == len(taken.payload)
    # the list is gone, spliced into the record's body; the record has no cl any more
    assert not any(k.startswith(f"{tag}:calls:") for k in keys(backend))
    assert backend.client.hget(f"{tag}:win:{tid}", "cl") is None
    # taken again (lease expired): the same body, not spliced twice
    backend.client.zadd(f"{tag}:leased", {tid: 0})
    (again,) = backend.take(0, 10).windows
    assert again.payload == taken.payload and again.tries == 2


def test_a_window_full_by_count_is_dispatched_at_once_and_the_next_call_opens_one(
    backend: Backend,
) -> None:
    tag = backend.tag(0)
    first = [call(backend, "k", seq=i, max_calls=3) for i in range(3)]
    assert first[2].deadline_ms == first[2].now_ms  # due at once
    nxt = call(backend, "k", seq=3, max_calls=3)
    assert nxt.opened and nxt.task_id != first[0].task_id
    (taken,) = backend.take(0, 10).windows
    assert taken.task_id == first[0].task_id and taken.capped
    assert [e[1][1] for e in elements(taken.payload)] == [0, 1, 2]
    assert backend.client.llen(f"{tag}:calls:{nxt.task_id}") == 1


@pytest.mark.redis_only("reads the record's fields and the calls list in Redis")
def test_a_window_full_by_bytes_is_dispatched_at_once_and_the_call_opens_the_next(
    app_factory: Any,
) -> None:
    app = app_factory(debounce_max_payload_bytes=400)
    backend = store_for(app)
    tag = backend.tag(0)
    results = []
    for i in range(12):
        results.append(call(backend, "k", seq=i, pad="x" * 40))
    ids = list(dict.fromkeys(r.task_id for r in results))
    assert len(ids) >= 2
    # each window holds consecutive calls; the call that did not fit opened the next one
    first_of = [r.calls for r in results]
    assert first_of[0] == 1 and first_of.count(1) == len(ids)
    closer = results[first_of.index(1, 1)]
    assert closer.opened
    # the full window is due at once (closed as the cap closes it: cx 2)
    rec = backend.client.hgetall(f"{tag}:win:{ids[0]}")
    assert rec[b"st"] == b"dispatching" and rec[b"cx"] == b"2"
    assert int(rec[b"cb"]) <= 400
    taken = backend.take(0, 10).windows
    bodies = {w.task_id: w for w in taken}
    seqs: list[int] = []
    for tid in ids[:-1]:  # every full window, in order; the last one is still open
        body = bodies[tid].payload
        assert len(body) <= 400 and len(body) == int(backend.client.hget(f"{tag}:win:{tid}", "cb"))
        seqs += [e[1][1] for e in elements(body)]
    assert backend.client.zscore(f"{tag}:due", "1:t:k") is not None  # the last, pending
    tail = [json.loads(e)[1][1] for e in backend.client.lrange(f"{tag}:calls:{ids[-1]}", 0, -1)]
    assert seqs + tail == list(range(12))  # nothing lost, nothing twice, in order


@pytest.mark.redis_only("no Redis key of any kind")
def test_a_call_too_large_for_an_empty_window_is_refused_with_nothing_written(
    app_factory: Any, redis_client: redis.Redis
) -> None:
    app = app_factory(debounce_max_payload_bytes=200)
    backend = store_for(app)
    with pytest.raises(DebouncePayloadError, match="debounce_max_payload_bytes=200"):
        call(backend, "k", pad="x" * 200)
    assert keys(backend) == set()


def test_a_call_of_the_other_mode_closes_the_window_and_opens_its_own(backend: Backend) -> None:
    plain = call(backend, "k", collect=False)
    collected = call(backend, "k", seq=1)
    assert collected.opened and collected.task_id != plain.task_id
    back = call(backend, "k", seq=2, collect=False)
    assert back.opened and back.task_id not in (plain.task_id, collected.task_id)
    taken = {w.task_id: w for w in backend.take(0, 10).windows}
    assert json.loads(taken[plain.task_id].payload) == [["k", 0], {"pad": ""}, {}]
    assert [e[1] for e in elements(taken[collected.task_id].payload)] == [["k", 1]]


def test_cancelling_a_collect_window_deletes_its_call_list(backend: Backend) -> None:
    tag = backend.tag(0)
    result = call(backend, "k")
    call(backend, "k", seq=1, task_id="fixed-1")
    cancelled = backend.cancel(0, "1:t:k")
    assert cancelled is not None and cancelled.record.task_id == result.task_id
    assert cancelled.record.calls == 2
    assert keys(backend) <= {f"{tag}:stats"}


# -- options -----------------------------------------------------------------------
def test_unsupported_serializers_and_options_are_refused_at_registration(app: Celery) -> None:
    with pytest.raises(DebounceConfigError, match="debounce_collect=True needs serializer='json'"):

        @debounced(
            app,
            lazy=False,
            debounce="1s",
            debounce_max_wait="2s",
            debounce_collect=True,
            serializer="pickle",
        )
        def pickled(calls: list[DebouncedCall]) -> None:
            pass

    with pytest.raises(DebounceConfigError, match="debounce_replace_payload=True"):

        @debounced(
            app,
            lazy=False,
            debounce="1s",
            debounce_max_wait="2s",
            debounce_collect=True,
            debounce_replace_payload=True,
        )
        def replaced(calls: list[DebouncedCall]) -> None:
            pass

    with pytest.raises(DebounceConfigError, match="debounce_collect='yes'"):

        @debounced(
            app,
            lazy=False,
            debounce="1s",
            debounce_max_wait="2s",
            debounce_collect="yes",
        )
        def bad(calls: list[DebouncedCall]) -> None:
            pass


def test_an_app_serializer_other_than_json_is_refused_when_the_task_is_bound(
    app_factory: Any,
) -> None:
    app = app_factory(task_serializer="pickle", accept_content=["json", "pickle"])
    with pytest.raises(DebounceConfigError, match="serializer is 'pickle'"):

        @debounced(
            app,
            lazy=False,
            debounce="1s",
            debounce_max_wait="2s",
            debounce_collect=True,
        )
        def report(calls: list[DebouncedCall]) -> None:
            pass


def test_a_per_call_serializer_or_mode_change_is_refused(
    app: Celery, redis_client: redis.Redis
) -> None:
    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_collect=True,
    )
    def report(calls: list[DebouncedCall]) -> None:
        pass

    with pytest.raises(DebounceConfigError, match=r"serializer='json'.*'pickle'"):
        report.apply_async(kwargs={"x": 1}, serializer="pickle")
    with pytest.raises(DebounceConfigError, match="debounce_collect=False on a call"):
        report.apply_async(kwargs={"x": 1}, debounce_collect=False)
    assert nothing_stored(app)


def test_collect_refused_with_leading(
    app: Celery, app_factory: Any, redis_client: redis.Redis
) -> None:
    """docs/design.md, "Collect and the leading edge": refused at registration, per call
    and by name, naming both options and values, before anything is written."""
    both = r"debounce_collect=True with debounce_leading=True"
    for trailing in (True, False):
        with pytest.raises(DebounceConfigError, match=both):

            @debounced(
                app,
                lazy=False,
                debounce="1s",
                debounce_max_wait="2s",
                debounce_collect=True,
                debounce_leading=True,
                debounce_trailing=trailing,
            )
            def leading(calls: list[DebouncedCall]) -> None:
                pass

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_collect=True,
    )
    def report(calls: list[DebouncedCall]) -> None:
        pass

    with pytest.raises(DebounceConfigError, match=both):
        report.apply_async(kwargs={"x": 1}, debounce_leading=True)
    with pytest.raises(DebounceConfigError, match=both):
        send_task(
            app_factory(),
            "not.registered",
            kwargs={"x": 1},
            debounce="1h",
            debounce_max_wait="2h",
            debounce_collect=True,
            debounce_leading=True,
        )

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_leading=True,
    )
    def lead(x: int) -> None:
        pass

    with pytest.raises(DebounceConfigError, match="debounce_collect=True on a call"):
        lead.apply_async((1,), debounce_collect=True)
    assert nothing_stored(app)
    # the trailing edge (the default, or said explicitly) is the ordinary collect window
    assert report.apply_async(kwargs={"x": 1}, debounce_trailing=True).id
    assert open_count(app) == 1


def test_a_collect_call_sends_argv_15_16_after_blanks(backend: Backend) -> None:
    plain = prepare_call(
        backend.settings, "t", build_spec("1h", "{0}", "2h", False), ("k", 0), {}, {}, None, "json"
    )
    assert len(gate_args(backend, plain)) == 7  # the hot path's ARGV, unchanged
    for cap, blanks in ((None, [""] * 7), (3, ["", "", "", "", 3, "", ""])):
        spec = build_spec("1h", "{0}", "2h", False, cap, collect=True)
        prepared = prepare_call(backend.settings, "t", spec, ("k", 0), {}, {}, None, "json")
        args = gate_args(backend, prepared)
        assert args[7:14] == blanks  # ARGV[8..14]: no fixed id, no edge
        assert args[14:] == [backend.settings.max_payload_bytes, prepared.collect_embed]


def test_blank_edge_and_collect_argv_mean_not_given(backend: Backend) -> None:
    tag = backend.tag(0)
    plain = prepare_call(
        backend.settings, "t", build_spec("1h", "{0}", "2h", False), ("b", 0), {}, {}, None, "json"
    )
    # a plain call with '' in ARGV[8..16]: exactly a plain call
    result = parse_reply(
        backend.run("gate", gate_keys(backend, plain), gate_args(backend, plain) + [""] * 9)
    )
    assert result.opened and result.edge == "" and result.calls == 1
    assert set(backend.client.hgetall(f"{tag}:open:1:t:b")) == {b"id", b"fs", b"mw", b"n", b"p"}
    # plus the calls-in counter (gate.lua's i|<task>), which expires on its own
    assert keys(backend) == {f"{tag}:open:1:t:b", f"{tag}:due", f"{tag}:stats"}
    assert 0 < backend.client.pttl(f"{tag}:stats") <= 3_600_000
    # a collect call (ARGV[13..14] '') ignores a running quiet period of its ident
    lead = prepare_call(
        backend.settings,
        "t",
        build_spec("1h", "{0}", "2h", False, None, True, True),
        ("q", 0),
        {},
        {},
        None,
        "json",
    )
    assert enter(backend, lead).edge == "lead"
    assert backend.client.hget(f"{tag}:quiet:1:t:q", "n") == b"1"
    collected = call(backend, "q")
    assert collected.opened and collected.edge == "" and collected.task_id != lead.task_id
    record = backend.client.hgetall(f"{tag}:open:1:t:q")
    assert b"cl" in record and b"tr" not in record
    assert backend.client.hget(f"{tag}:quiet:1:t:q", "n") == b"1"  # not moved, not counted


# -- real worker ---------------------------------------------------------------------
def test_key_templates_resolve_per_call_and_each_run_gets_its_calls(app: Celery) -> None:
    runs: list[list[DebouncedCall]] = []

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{user_id}",
        debounce_collect=True,
    )
    def report(calls: list[DebouncedCall]) -> int:
        runs.append(calls)
        return sum(c.kwargs["change"] for c in calls)

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="pos:{0}",
        debounce_collect=True,
        bind=True,
    )
    def by_position(self: Any, calls: list[DebouncedCall]) -> list[Any]:
        return [[list(c.args), c.task_id] for c in calls]

    with running_worker(app):
        # the function takes (calls); the calls are checked against nothing and keyed
        # by their own kwargs ({user_id}) or args ({0})
        u1 = [report.delay(user_id="u1", change=i) for i in (1, 2, 3)]
        u2 = [report.delay(user_id="u2", change=10)]
        pos = [
            by_position.delay("a", 1),
            by_position.apply_async(("a", 2), task_id="mine"),
            by_position.delay("b", 3),
        ]
        assert len({r.id for r in u1}) == 1 and u2[0].id != u1[0].id
        assert report.debounce_pending(user_id="u1").calls == 3  # type: ignore[union-attr]
        assert by_position.debounce_pending("a").calls == 2  # type: ignore[union-attr]
        for key in ("u1", "u2"):
            report.debounce_flush(user_id=key)
        for key in ("a", "b"):
            by_position.debounce_flush(key)
        # each call's AsyncResult resolves to its run's result
        assert [r.get(timeout=20) for r in u1] == [6, 6, 6]
        assert u2[0].get(timeout=20) == 10
        assert pos[0].get(timeout=20) == [[["a", 1], None], [["a", 2], "mine"]]
        assert pos[1].get(timeout=20) == pos[0].get(timeout=20)  # its own id, an alias
        assert pos[2].get(timeout=20) == [[["b", 3], None]]
    calls = next(r for r in runs if len(r) == 3)
    assert [c.kwargs for c in calls] == [{"user_id": "u1", "change": i} for i in (1, 2, 3)]
    assert all(isinstance(c.called_at, datetime) for c in calls)
    assert calls[0].called_at <= calls[1].called_at <= calls[2].called_at  # type: ignore[operator]


def test_bypass_eager_and_direct_calls_still_get_a_list(app_factory: Any) -> None:
    app = app_factory(task_always_eager=True)

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_collect=True,
    )
    def report(calls: list[DebouncedCall]) -> list[Any]:
        return [[list(c.args), c.kwargs] for c in calls]

    assert report.delay(1, x=2).get() == [[[1], {"x": 2}]]
    assert report.apply_async((3,), debounce=False).get() == [[[3], {}]]
    assert report([DebouncedCall((4,), {})]) == [[[4], {}]]  # a direct call, as in unit tests
    with pytest.raises(TypeError, match="list of its window's calls"):
        report(5)

    class Collecting(DebouncedTask):  # an intermediate base class carrying the option
        debounce_collect = True

    @app.task(base=Collecting, shared=False, bind=True, debounce="1h", debounce_max_wait="2h")
    def bound(self: Any, calls: list[DebouncedCall]) -> list[Any]:
        return [list(c.args) for c in calls]

    assert bound.delay("x").get() == [["x"]]


def test_inspect_shows_collected_calls_and_bytes(app: Celery) -> None:
    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{user_id}",
        debounce_collect=True,
    )
    def report(calls: list[DebouncedCall]) -> None:
        pass

    for i in range(3):
        report.delay(user_id="u1", change=i)
    (info,) = list_windows(app)
    data = info.as_json()
    assert data["calls"] == 3 and data["collected_bytes"] > 0
    assert report.debounce_pending(user_id="u1").collected_bytes == data["collected_bytes"]  # type: ignore[union-attr]


def test_send_task_by_name_declares_collect_per_call(app: Celery, app_factory: Any) -> None:
    worker_app = app

    @debounced(
        worker_app,
        name="by.name",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{k}",
        debounce_collect=True,
    )
    def by_name(calls: list[DebouncedCall]) -> list[Any]:
        return [c.kwargs["v"] for c in calls]

    producer = app_factory()  # does not have the task registered
    opts = {
        "debounce": "1h",
        "debounce_max_wait": "2h",
        "debounce_key": "{k}",
        "debounce_collect": True,
    }
    first = send_task(producer, "by.name", kwargs={"k": "x", "v": 1}, **opts)
    assert send_task(producer, "by.name", kwargs={"k": "x", "v": 2}, **opts).id == first.id
    with running_worker(worker_app):
        by_name.debounce_flush(k="x")
        assert first.get(timeout=20) == [1, 2]


def test_a_burst_of_1000_calls_from_4_processes_is_one_run_with_every_call(
    redis_server: str, redis_client: redis.Redis
) -> None:
    from collect_producer import produce

    producers, each = 4, 250
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(producers), ctx.Queue()
    procs = [
        ctx.Process(target=produce, args=(redis_server, p, each, barrier, out))
        for p in range(producers)
    ]
    for proc in procs:
        proc.start()
    try:
        results = dict(out.get(timeout=120) for _ in procs)
    finally:
        for proc in procs:
            proc.join(30)
    assert [proc.exitcode for proc in procs] == [0] * producers
    ids = {tid for batch in results.values() for tid in batch}
    assert len(ids) == 1  # one window
    app = make_app(redis_server, name="collect-burst")
    received: list[list[DebouncedCall]] = []

    @debounced(
        app,
        name="collect.report",
        debounce="60s",
        debounce_max_wait="120s",
        debounce_key="{user_id}",
        debounce_collect=True,
    )
    def report(calls: list[DebouncedCall]) -> int:
        received.append(calls)
        return len(calls)

    assert report.debounce_pending(user_id="u1").calls == producers * each  # type: ignore[union-attr]
    with running_worker(app):
        report.debounce_flush(user_id="u1")
        result = app.AsyncResult(ids.pop())
        assert result.get(timeout=30) == producers * each
        wait_until(lambda: received)
    (calls,) = [r for r in received if len(r) > 1]
    assert len(calls) == producers * each
    for p in range(producers):  # call order kept per producer, nothing lost or doubled
        assert [c.kwargs["seq"] for c in calls if c.kwargs["producer"] == p] == list(range(each))
    assert {c.kwargs["user_id"] for c in calls} == {"u1"}
    times = [c.called_at for c in calls]
    assert times == sorted(times)  # type: ignore[type-var]


@pytest.mark.redis_only("the CLI subprocess's app keeps its windows in Redis")
def test_celery_debounce_inspect_json_shows_collected_calls_and_bytes(
    app: Celery, redis_server: str
) -> None:
    import os
    from pathlib import Path

    @debounced(
        app,
        name="collect.inspected",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{user_id}",
        debounce_collect=True,
    )
    def inspected(calls: list[DebouncedCall]) -> None:
        pass

    for i in range(4):
        inspected.delay(user_id="u1", change=i)
    here = Path(__file__).parents[1]
    env = {
        **os.environ,
        "DEBOUNCE_TEST_REDIS_URL": redis_server,
        "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
    }
    out = debounce_command("cli_app", env, "inspect", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert row["task"] == "collect.inspected" and row["calls"] == 4
    tag = "debounce:{0}"
    client = redis.Redis.from_url(f"{redis_server}/0")
    assert row["collected_bytes"] == int(
        client.hget(f"{tag}:open:{row['task'].__len__()}:collect.inspected:u1", "cb")
    )
    elements = client.lrange(f"{tag}:calls:{row['task_id']}", 0, -1)
    assert row["collected_bytes"] == 10 + 2 + sum(len(e) for e in elements) + len(elements) - 1


def test_testing_helpers_show_and_run_a_collect_window(app: Celery) -> None:
    from celery_debounce.testing import debounce_windows, run_windows

    @debounced(
        app,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{user_id}",
        debounce_collect=True,
    )
    def report(calls: list[DebouncedCall]) -> list[int]:
        return [c.kwargs["change"] for c in calls]

    for i in range(3):
        report.delay(user_id="u1", change=i)
    (window,) = debounce_windows(app, report)
    (calls,) = window.args
    assert [c.kwargs["change"] for c in calls] == [0, 1, 2] and window.kwargs == {}
    (result,) = run_windows(app, report)
    assert result.get() == [0, 1, 2]


def test_enqueue_many_and_a_retried_run_keep_every_call(app: Celery) -> None:
    from celery_debounce import enqueue_many

    attempts: list[int] = []

    @debounced(
        app,
        bind=True,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{k}",
        debounce_collect=True,
        max_retries=2,
        default_retry_delay=0.05,
    )
    def flaky(self: Any, calls: list[DebouncedCall]) -> list[int]:
        attempts.append(self.request.retries)
        if self.request.retries < 1:
            raise self.retry()
        return [c.kwargs["v"] for c in calls]

    results = enqueue_many(flaky, [((), {"k": "a", "v": i}) for i in range(50)])
    assert len({r.id for r in results}) == 1
    with running_worker(app):
        flaky.debounce_flush(k="a")
        assert results[0].get(timeout=20) == list(range(50))  # the retry got every call
    assert attempts == [0, 1]


def test_a_chord_and_a_chain_of_collect_calls_resolve_every_member(app: Celery) -> None:
    """Canvas members (ids fixed by the canvas) joining one collect window: the run gets
    every call once with its member id, and every member id resolves (the chord's
    body runs, the chain's tail runs): none waits forever."""
    from celery import chain, chord

    @debounced(
        app,
        name="canvas.coll",
        debounce="300ms",
        debounce_max_wait="5s",
        debounce_key="{0}",
        debounce_collect=True,
    )
    def coll(calls: list[DebouncedCall]) -> list[Any]:
        return sorted([c.args[1], c.task_id is not None] for c in calls)

    @app.task(shared=False, name="canvas.count")
    def count(results: list[Any]) -> int:
        return len(results)

    with running_worker(app):
        header = [coll.s("k", i) for i in range(3)]
        done = chord(header, count.s()).apply_async()
        assert done.get(timeout=15) == 3
        runs = [r.get(timeout=5) for r in done.parent.results]
        assert runs == [[[0, True], [1, True], [2, True]]] * 3
        tail = chain(coll.s("c", 7), count.s()).apply_async()
        assert tail.get(timeout=15) == 1


@pytest.mark.redis_only("the windows' Redis down (debounce_redis_url)")
def test_unicode_keys_and_payloads_through_edge_and_collect_and_an_outage_is_an_error(
    app_factory: Any, redis_client: redis.Redis
) -> None:
    """Non-ASCII keys name the quiet period and the call list (``<tag>:quiet:<ident>``,
    ``<tag>:calls:<cl>``) and non-ASCII payloads are spliced byte for byte; with the
    windows' Redis down a collect call raises DebounceBackendError in seconds."""
    import socket
    import time

    from celery_debounce import DebounceBackendError

    app = app_factory()
    got: list[list[Any]] = []

    @debounced(
        app,
        name="uni.coll·é",
        debounce="300ms",
        debounce_max_wait="5s",
        debounce_key="{0}",
        debounce_collect=True,
    )
    def coll(calls: list[DebouncedCall]) -> int:
        got.append([[list(c.args), c.kwargs] for c in calls])
        return len(calls)

    @debounced(
        app,
        name="uni.edge·é",
        debounce="5s",
        debounce_max_wait="10s",
        debounce_key="{0}",
        debounce_leading=True,
        debounce_trailing=False,
    )
    def lead(key: str) -> str:
        return key

    with running_worker(app):
        parts = [coll.delay("ключ🔑", v="日本語\u2028"), coll.delay("ключ🔑", v="é\x00")]
        assert parts[0].id == parts[1].id and parts[0].get(timeout=15) == 2
        first = lead.delay("клавиша🎹")
        suppressed = lead.delay("клавиша🎹")
        assert suppressed.id == first.id and suppressed.get(timeout=15) == "клавиша🎹"
    assert got == [[[["ключ🔑"], {"v": "日本語\u2028"}], [["ключ🔑"], {"v": "é\x00"}]]]

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    dead = listener.getsockname()[1]
    listener.close()
    down = app_factory(debounce_redis_url=f"redis://127.0.0.1:{dead}/0")

    @debounced(
        down,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_collect=True,
    )
    def lost(calls: list[DebouncedCall]) -> None:  # pragma: no cover - never run
        pass

    start = time.monotonic()
    with pytest.raises(DebounceBackendError):
        lost.delay(1)
    assert time.monotonic() - start < 10
