"""``debounce_on_outage`` and the breaker, against real servers.

The broker and results live on the session's redis-server; the windows' Redis is
another one: a port nothing listens on (stopped), a socket that accepts and never
answers, or a SIGSTOPped redis-server. Under ``"publish"`` a real worker runs every
call; under ``"raise"`` the call raises as before. Calls after a timed-out one skip
Redis (well under the timeout) until a probe finds it again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from fault_proxy import FaultProxy, evalsha_of
from helpers import debounced, make_app, running_worker, silent_listener, wait_until
from reads import open_count

from celery_debounce import (
    DebounceBackendError,
    DebounceConfigError,
    DebounceKeyError,
    send_task,
)
from celery_debounce.producer import outage as outage_module
from celery_debounce.producer.many import enqueue_many
from celery_debounce.producer.outage import DebounceBreakerOpen, breaker_for, outage_kind
from celery_debounce.signals import outage_fallback
from celery_debounce.store import store_for
from celery_debounce.testing.servers import LocalRedis, free_port

TIMEOUT = 1.0  # debounce_redis_timeout of these tests


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server that accepts connections and never answers (bytes are read, dropped)."""
    with silent_listener() as (port, _):
        yield f"redis://127.0.0.1:{port}"


@pytest.fixture(autouse=True)
def _no_breaker_left() -> Iterator[None]:
    """Each test's apps go with it: so do their breakers (OPEN is process-wide)."""
    yield
    outage_module.OPEN.clear()


@pytest.fixture
def fallbacks() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def receiver(sender: str, **kwargs: Any) -> None:
        seen.append({"task": sender, **kwargs})

    outage_fallback.connect(receiver, weak=False)
    try:
        yield seen
    finally:
        outage_fallback.disconnect(receiver)


#: The outage tests' apps: broker and results on the session's server (make_app), the
#: windows' Redis elsewhere (each its own debounce_redis_url), no dispatcher.
OUTAGE = {"debounce_redis_timeout": TIMEOUT, "debounce_dispatcher": False}


def _empty_broker(redis_server: str) -> None:
    """Empty the broker's DB (make_app's DB 1): what is counted there is this test's."""
    redis.Redis.from_url(f"{redis_server}/1").flushdb()


@pytest.fixture(autouse=True)
def _broker_emptied(redis_server: str) -> None:
    _empty_broker(redis_server)


def _tasks(app: Celery, ran: list[Any]) -> tuple[Any, Any]:
    @debounced(app, name="o.work", debounce="5s", debounce_max_wait="10s")
    def work(x: int) -> int:
        ran.append(x)
        return x

    @debounced(
        app,
        name="o.collect",
        debounce="5s",
        debounce_max_wait="10s",
        debounce_collect=True,
    )
    def collect(calls: list[Any]) -> int:
        # stamped: published as a list of calls (as debounce=False), not as plain args
        ran.extend(("collect", *call.args, call.called_at is not None) for call in calls)
        return len(calls)

    return work, collect


def _every_way_in(app: Celery, work: Any, collect: Any) -> list[Any]:
    """delay, apply_async with options, a fixed id, send_task, enqueue_many, collect."""
    results = [
        work.delay(1),
        work.apply_async((2,), priority=3, headers={"h": "v"}),
        work.apply_async((3,), task_id="fixed-3"),
        send_task(app, "o.work", (4,)),
        collect.delay(5),
    ]
    results += enqueue_many(work, [((6,), {}), ((7,), {})])
    return results


EVERY_CALL = [1, 2, 3, 4, ("collect", 5, True), 6, 7]


def test_publish_with_the_redis_stopped_runs_every_call_once_and_counts_it(
    redis_server: str,
    fallbacks: list[dict[str, Any]],
) -> None:
    app = make_app(
        redis_server,
        debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0",
        **OUTAGE,
        debounce_on_outage="publish",
    )
    ran: list[Any] = []
    work, collect = _tasks(app, ran)
    with running_worker(app):
        results = _every_way_in(app, work, collect)
        assert [r.get(timeout=10) for r in results] == [1, 2, 3, 4, 1, 6, 7]
    assert sorted(ran, key=str) == sorted(EVERY_CALL, key=str)
    assert results[2].id == "fixed-3"  # the published message's id
    assert [f["task_id"] for f in fallbacks] == [r.id for r in results]
    assert {f["reason"] for f in fallbacks} == {"unreachable"}  # refused: nothing sent
    assert breaker_for(app) not in outage_module.OPEN  # refused at once: no breaker


def test_publish_with_the_redis_stopped_resolves_groups_chains_and_chords(
    redis_server: str,
    fallbacks: list[dict[str, Any]],
) -> None:
    """Canvas members keep their frozen ids and canvas options in the plain publish."""
    from celery import chain, chord, group

    app = make_app(
        redis_server,
        debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0",
        **OUTAGE,
        debounce_on_outage="publish",
    )
    work, _ = _tasks(app, [])

    @app.task(shared=False, name="o.total")
    def total(values: list[int]) -> int:
        return sum(values)

    with running_worker(app):
        assert group(work.s(10), work.s(11)).apply_async().get(timeout=10) == [10, 11]
        assert chain(work.s(20), work.s()).apply_async().get(timeout=10) == 20
        assert chord([work.s(1), work.s(2)], total.s()).apply_async().get(timeout=10) == 3
    assert len(fallbacks) == 6


def test_raise_with_the_redis_stopped_raises_as_before(
    redis_server: str,
    fallbacks: list[dict[str, Any]],
) -> None:
    app = make_app(redis_server, debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0", **OUTAGE)
    work, collect = _tasks(app, [])
    for call in (
        lambda: work.delay(1),
        lambda: send_task(app, "o.work", (2,)),
        lambda: collect.delay(3),
        lambda: enqueue_many(work, [((4,), {})]),
    ):
        with pytest.raises(DebounceBackendError, match="unreachable") as info:
            call()
        assert not isinstance(info.value, DebounceBreakerOpen)
    assert fallbacks == []
    assert redis.Redis.from_url(f"{redis_server}/1").llen("celery") == 0  # nothing published


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.monotonic()
    try:
        value = call()
    except DebounceBackendError as exc:
        value = exc
    return time.monotonic() - start, value


def test_publish_with_a_redis_that_never_answers_waits_once_then_skips_it(
    redis_server: str,
    silent_url: str,
    fallbacks: list[dict[str, Any]],
) -> None:
    app = make_app(
        redis_server,
        debounce_redis_url=f"{silent_url}/0",
        **OUTAGE,
        debounce_on_outage="publish",
        debounce_outage_probe_interval=60,
    )
    ran: list[Any] = []
    work, collect = _tasks(app, ran)
    with running_worker(app):
        first, result = _timed(lambda: work.delay(0))
        assert first >= TIMEOUT * 0.9  # it waited the timeout once
        timings = [_timed(lambda: _every_way_in(app, work, collect)) for _ in range(3)]
        assert max(t for t, _ in timings) < TIMEOUT / 2, timings  # all 7 calls, each round
        results = [result, *(r for _, rs in timings for r in rs)]
        wait_until(lambda: len(ran) == 1 + 3 * len(EVERY_CALL), 20)
        assert [r.get(timeout=10) for r in results[:2]] == [0, 1]
    assert sorted(ran, key=str) == sorted([0, *EVERY_CALL * 3], key=str)
    assert len(fallbacks) == len(results)
    assert fallbacks[0]["reason"] in ("unknown", "unreachable")  # timed out
    assert {f["reason"] for f in fallbacks[1:]} == {"breaker"}
    assert outage_module.OPEN == {breaker_for(app)}


def _every_way_in_skips_the_store(app: Celery, work: Any, collect: Any) -> None:
    """With the breaker open, delay, send_task, collect and enqueue_many each raise
    DebounceBreakerOpen at once, without waiting for the store."""
    for call in (
        lambda: work.delay(2),
        lambda: send_task(app, "o.work", (3,)),
        lambda: collect.delay(4),
        lambda: enqueue_many(work, [((5,), {})]),
    ):
        took, error = _timed(call)
        assert took < TIMEOUT / 2
        assert isinstance(error, DebounceBreakerOpen), error
        assert "breaker open since" in str(error)


def test_raise_with_a_redis_that_never_answers_fails_fast_after_the_first_call(
    redis_server: str,
    silent_url: str,
    fallbacks: list[dict[str, Any]],
) -> None:
    app = make_app(
        redis_server,
        debounce_redis_url=f"{silent_url}/0",
        **OUTAGE,
        debounce_outage_probe_interval=60,
    )
    work, collect = _tasks(app, [])
    first, error = _timed(lambda: work.delay(1))
    assert first >= TIMEOUT * 0.9 and isinstance(error, DebounceBackendError)
    assert not isinstance(error, DebounceBreakerOpen)  # the store's own error, waited for
    _every_way_in_skips_the_store(app, work, collect)
    assert fallbacks == []
    assert redis.Redis.from_url(f"{redis_server}/1").llen("celery") == 0


@pytest.fixture
def stoppable() -> Iterator[LocalRedis]:
    server = LocalRedis().start()
    try:
        yield server
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.cleanup()


def test_one_call_probes_after_the_interval_and_its_success_closes_the_breaker(
    redis_server: str,
    stoppable: LocalRedis,
) -> None:
    """A SIGSTOPped redis-server: the breaker opens; while it is open calls fail at
    once; after the interval one call probes (the others still skip); once the server
    answers again, the probe closes the breaker and calls are gated again."""
    app = make_app(
        redis_server,
        debounce_redis_url=f"{stoppable.url}/0",
        **OUTAGE,
        debounce_outage_probe_interval=0.5,
    )
    work, _ = _tasks(app, [])
    opened = work.delay(1)
    os.kill(stoppable.process.pid, signal.SIGSTOP)
    took, error = _timed(lambda: work.delay(2))
    assert took >= TIMEOUT * 0.9 and not isinstance(error, DebounceBreakerOpen)
    assert isinstance(_timed(lambda: work.delay(3))[1], DebounceBreakerOpen)
    breaker = breaker_for(app)
    wait_until(lambda: time.monotonic() >= breaker.probe_at, 5)
    # several threads at once after the interval: exactly one of them waits on Redis
    timings: list[tuple[float, Any]] = []
    threads = [
        threading.Thread(target=lambda: timings.append(_timed(lambda: work.delay(4))))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    slow = [t for t in timings if not isinstance(t[1], DebounceBreakerOpen)]
    assert len(slow) == 1 and slow[0][0] >= TIMEOUT * 0.9, timings
    assert all(t < TIMEOUT / 2 for t, e in timings if isinstance(e, DebounceBreakerOpen))
    os.kill(stoppable.process.pid, signal.SIGCONT)

    def gated() -> bool:
        try:
            return work.delay(1).id == opened.id
        except DebounceBreakerOpen:
            return False
        except DebounceBackendError:  # the probe's stale connection: once at most
            return False

    wait_until(gated, 10, interval=0.1)
    assert breaker not in outage_module.OPEN


def test_a_forked_child_starts_with_the_breaker_closed(
    redis_server: str,
    silent_url: str,
) -> None:
    app = make_app(
        redis_server,
        debounce_redis_url=f"{silent_url}/0",
        **OUTAGE,
        debounce_outage_probe_interval=60,
    )
    work, _ = _tasks(app, [])
    _timed(lambda: work.delay(1))
    assert outage_module.OPEN
    pid = os.fork()
    if pid == 0:  # the child: no breaker open, its own breaker for the app
        code = 0 if not outage_module.OPEN and breaker_for(app).since is None else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert outage_module.OPEN  # the parent's stays open


GREEN_CALLERS = r"""
import json, socket, sys, time
from celery import Celery
from celery_debounce import DebouncedTask  # imported before the patching (--preload)
from gevent import monkey
monkey.patch_all()
import gevent
from celery_debounce.producer import outage

silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(64)
app = Celery("green", set_as_current=False)
app.conf.update(broker_url=sys.argv[1] + "/1", debounce_redis_timeout=1.0,
                debounce_redis_url=f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
                debounce_outage_probe_interval=0.3)

@app.task(base=DebouncedTask, shared=False, debounce="1s", debounce_max_wait="2s")
def job(x): pass

def timed(x):
    start = time.monotonic()
    try:
        job.delay(x)
    except outage.DebounceBreakerOpen:
        return time.monotonic() - start, "open"
    except Exception as exc:
        return time.monotonic() - start, type(exc).__name__
    return time.monotonic() - start, "ok"

first = timed(0)
time.sleep(0.4)  # past the probe interval: the next call probes
started = time.monotonic()
greenlets = [gevent.spawn(timed, i) for i in range(20)]
gevent.joinall(greenlets, timeout=10)
print(json.dumps({"first": first, "calls": [g.value for g in greenlets],
                  "wall": time.monotonic() - started}))
"""


def test_greenlets_patched_after_import_share_one_probe_and_never_block_each_other(
    redis_server: str,
) -> None:
    """gevent patched after the package was imported: while one greenlet probes (it
    waits the timeout), the others skip Redis at once; none waits on another."""
    pytest.importorskip("gevent")
    import json
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", GREEN_CALLERS, redis_server],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["first"][0] >= TIMEOUT * 0.9 and out["first"][1] != "open"
    probes = [c for c in out["calls"] if c[1] != "open"]
    skipped = [c for c in out["calls"] if c[1] == "open"]
    assert len(probes) == 1 and probes[0][0] >= TIMEOUT * 0.9, out
    assert len(skipped) == 19 and max(t for t, _ in skipped) < TIMEOUT / 2, out


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ("error", "refused"),
        ("error-readonly", "refused"),
        ("error-loading", "refused"),
        ("error-noperm", None),
        ("drop", "unknown"),
    ],
)
def test_which_errors_are_an_outage(
    fault: str,
    kind: str | None,
    fault_proxy: FaultProxy,
    redis_server: str,
    redis_client: redis.Redis,
    fallbacks: list[dict[str, Any]],
) -> None:
    """OOM, READONLY, LOADING (nothing ran) and a lost reply (it may have run) fall
    back under "publish"; NOPERM is configuration: it raises under every policy."""
    app = make_app(
        redis_server,
        debounce_redis_url=f"{fault_proxy.url}/0",
        **OUTAGE,
        debounce_on_outage="publish",
    )
    work, _ = _tasks(app, [])
    work.delay(0)
    fault_proxy.arm(fault, evalsha_of(store_for(app).scripts["gate"].sha))
    if kind is None:
        with pytest.raises(DebounceBackendError) as info:
            work.delay(1)
        assert outage_kind(info.value) is None and fallbacks == []
    else:
        result = work.delay(1)
        assert [(f["reason"], f["task_id"]) for f in fallbacks] == [(kind, result.id)]
        assert redis.Redis.from_url(f"{redis_server}/1").llen("celery") == 1  # published
    assert fault_proxy.fired == 1
    assert breaker_for(app) not in outage_module.OPEN  # none of them waited


def test_enqueue_many_publishes_only_the_calls_an_outage_kept_out(
    fault_proxy: FaultProxy,
    redis_server: str,
    redis_client: redis.Redis,
    fallbacks: list[dict[str, Any]],
) -> None:
    """One call of a bulk batch refused (OOM): under "publish" that one is published
    plainly, the others are gated into their windows (none published twice)."""
    app = make_app(
        redis_server,
        debounce_redis_url=f"{fault_proxy.url}/0",
        **OUTAGE,
        debounce_on_outage="publish",
    )
    work, _ = _tasks(app, [])
    work.delay(0)  # the store has read the server's version
    fault_proxy.arm("error", evalsha_of(store_for(app).scripts["gate"].sha))
    results = enqueue_many(work, [((i,), {}) for i in range(1, 5)], chunk_size=2)
    assert fault_proxy.fired == 1
    assert len(fallbacks) == 1 and fallbacks[0]["reason"] == "refused"
    plain = fallbacks[0]["task_id"]
    assert plain in [r.id for r in results]
    windows = {r.id for r in results} - {plain}
    assert len(windows) == 3
    assert open_count(app) == 4  # the delay(0) window and three
    assert redis.Redis.from_url(f"{redis_server}/1").llen("celery") == 1  # only the plain one


def test_bad_values_are_refused_naming_the_option_and_nothing_is_written(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    app = make_app(redis_server, debounce_on_outage="later")
    with pytest.raises(DebounceConfigError, match=r"debounce_on_outage='later'"):
        store_for(app)
    app = make_app(redis_server, debounce_outage_probe_interval=-1)
    with pytest.raises(DebounceConfigError, match="debounce_outage_probe_interval"):
        store_for(app)
    app = make_app(redis_server)
    work, _ = _tasks(app, [])
    with pytest.raises(DebounceConfigError, match=r"debounce_on_outage='Publish'"):
        work.apply_async((1,), debounce_on_outage="Publish")

    def job() -> None: ...

    with pytest.raises(DebounceConfigError, match=r"debounce_on_outage=True"):
        debounced(
            app,
            lazy=False,
            debounce="1s",
            debounce_max_wait="2s",
            debounce_on_outage=True,
        )(job)
    assert redis_client.keys("debounce:*") == []  # Redis only: no key of any kind written


def test_the_per_call_option_overrides_the_setting_and_errors_of_the_call_still_raise(
    redis_server: str,
    fallbacks: list[dict[str, Any]],
) -> None:
    app = make_app(redis_server, debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0", **OUTAGE)
    work, _ = _tasks(app, [])
    result = work.apply_async((1,), debounce_on_outage="publish")
    assert [f["task_id"] for f in fallbacks] == [result.id]
    with pytest.raises(DebounceBackendError):
        send_task(app, "o.work", (2,), debounce_on_outage="raise")
    with pytest.raises(DebounceKeyError):  # a key error is never an outage
        work.apply_async((1,), debounce_key="{missing}", debounce_on_outage="publish")
    assert len(fallbacks) == 1


@pytest.fixture
def registry() -> Iterator[Any]:
    """A fresh Prometheus registry with the package's metrics enabled on it."""
    prometheus_client = pytest.importorskip("prometheus_client")
    from celery_debounce.ops import metrics

    reg = prometheus_client.CollectorRegistry()
    enabled = metrics.enable(reg)
    try:
        yield reg
    finally:
        enabled.disable()


def _fallbacks_counted(registry: Any, task: str, reason: str) -> float:
    """``celery_debounce_outage_fallbacks_total{task, reason}`` (0 when absent)."""
    labels = {"task": task, "reason": reason}
    return registry.get_sample_value("celery_debounce_outage_fallbacks_total", labels) or 0.0


def test_the_fallbacks_counter_counts_each_published_call_by_reason(
    redis_server: str,
    silent_url: str,
    registry: Any,
    fallbacks: list[dict[str, Any]],
) -> None:
    """Under "publish", ``celery_debounce_outage_fallbacks_total`` counts every call
    published plainly, labelled by task and reason (a stopped Redis: unreachable; a
    silent one: the first call timed out, the rest skipped it behind the breaker);
    under "raise" nothing is published and nothing is counted."""
    stopped = make_app(
        redis_server,
        debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0",
        **OUTAGE,
        debounce_on_outage="publish",
    )
    work, collect = _tasks(stopped, [])
    _every_way_in(stopped, work, collect)
    assert _fallbacks_counted(registry, "o.work", "unreachable") == len(EVERY_CALL) - 1
    assert _fallbacks_counted(registry, "o.collect", "unreachable") == 1

    _empty_broker(redis_server)
    silent = make_app(
        redis_server,
        debounce_redis_url=f"{silent_url}/0",
        **OUTAGE,
        debounce_on_outage="publish",
        debounce_outage_probe_interval=60,
    )
    quiet, _ = _tasks(silent, [])
    first, _ = _timed(lambda: quiet.delay(0))
    assert first >= TIMEOUT * 0.9
    timed_out = sum(_fallbacks_counted(registry, "o.work", r) for r in ("unknown", "unreachable"))
    assert timed_out == len(EVERY_CALL)  # the stopped app's six, and this one
    for i in range(3):
        quiet.delay(i)
    assert _fallbacks_counted(registry, "o.work", "breaker") == 3
    assert len(fallbacks) == len(EVERY_CALL) + 4  # one count per signal sent

    _empty_broker(redis_server)
    raising = make_app(
        redis_server, debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0", **OUTAGE
    )
    strict, _ = _tasks(raising, [])
    with pytest.raises(DebounceBackendError):
        strict.delay(1)
    assert _fallbacks_counted(registry, "o.work", "unreachable") + _fallbacks_counted(
        registry, "o.work", "unknown"
    ) == len(EVERY_CALL)  # unchanged: "raise" counts nothing
    assert redis.Redis.from_url(f"{redis_server}/1").llen("celery") == 0  # nor published


def test_enqueue_many_per_call_policy_overrides_the_setting(
    redis_server: str,
    fallbacks: list[dict[str, Any]],
) -> None:
    """``enqueue_many(..., debounce_on_outage=...)`` with the windows' Redis stopped:
    "publish" over the default "raise" publishes every call once (a real worker runs
    each, the signal and the counter see each); "raise" over a "publish" setting
    raises and publishes nothing."""
    app = make_app(redis_server, debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0", **OUTAGE)
    ran: list[Any] = []
    work, _ = _tasks(app, ran)
    with pytest.raises(DebounceBackendError):  # the setting's "raise", for comparison
        enqueue_many(work, [((0,), {})])
    with running_worker(app):
        results = enqueue_many(
            work, [((i,), {}) for i in range(1, 6)], chunk_size=2, debounce_on_outage="publish"
        )
        assert [r.get(timeout=10) for r in results] == [1, 2, 3, 4, 5]
    assert sorted(ran) == [1, 2, 3, 4, 5]
    assert [f["task_id"] for f in fallbacks] == [r.id for r in results]
    assert {f["reason"] for f in fallbacks} == {"unreachable"}

    _empty_broker(redis_server)
    app = make_app(
        redis_server,
        debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0",
        **OUTAGE,
        debounce_on_outage="publish",
    )
    work, _ = _tasks(app, [])
    with pytest.raises(DebounceBackendError, match="unreachable"):
        enqueue_many(work, [((i,), {}) for i in range(3)], debounce_on_outage="raise")
    assert len(fallbacks) == 5  # none added
    assert redis.Redis.from_url(f"{redis_server}/1").llen("celery") == 0


def test_enqueue_many_per_call_publish_behind_an_open_breaker(
    redis_server: str,
    silent_url: str,
    fallbacks: list[dict[str, Any]],
) -> None:
    """A silent Redis under the default "raise": once the breaker is open, a batch
    with ``debounce_on_outage="publish"`` skips Redis (well under the timeout) and
    publishes every call; the same batch without the option raises at once."""
    app = make_app(
        redis_server,
        debounce_redis_url=f"{silent_url}/0",
        **OUTAGE,
        debounce_outage_probe_interval=60,
    )
    work, _ = _tasks(app, [])
    took, error = _timed(lambda: work.delay(0))
    assert took >= TIMEOUT * 0.9 and isinstance(error, DebounceBackendError)
    batch = [((i,), {}) for i in range(1, 4)]
    took, error = _timed(lambda: enqueue_many(work, batch))
    assert took < TIMEOUT / 2 and isinstance(error, DebounceBreakerOpen), error
    assert fallbacks == []
    took, results = _timed(lambda: enqueue_many(work, batch, debounce_on_outage="publish"))
    assert took < TIMEOUT / 2, took
    assert [f["task_id"] for f in fallbacks] == [r.id for r in results]
    assert {f["reason"] for f in fallbacks} == {"breaker"}
    assert redis.Redis.from_url(f"{redis_server}/1").llen("celery") == 3


@pytest.fixture
def postgres_url() -> Iterator[tuple[Any, str]]:
    """A private PostgreSQL server (it is frozen by the test) and its migrated URL."""
    pytest.importorskip("psycopg")
    from celery_debounce.store.postgres import PostgresStore
    from celery_debounce.testing.postgres import LocalPostgres, find_postgres_bindir

    if find_postgres_bindir() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries not installed: in CI they must be")
        pytest.skip("PostgreSQL server binaries not installed (scripts/ensure-postgres.sh)")
    with LocalPostgres() as server:
        with PostgresStore(server.url()) as store:
            store.migrate()
        try:
            yield server, server.url()
        finally:
            server.thaw()


def _postgres_app(redis_server: str, url: str, **conf: Any) -> Celery:
    return make_app(
        redis_server,
        debounce_store_url=url,
        debounce_redis_url=None,
        debounce_postgres_timeout=TIMEOUT,
        debounce_dispatcher=False,
        debounce_outage_probe_interval=60,
        **conf,
    )


def _open_windows(url: str) -> set[str]:
    from celery_debounce.store.postgres import PostgresStore

    with PostgresStore(url) as store:
        assert [w.task_id for w in store.take(0, 10).windows] == []  # not due yet
        return {w.task_id for w in store.pending_payloads(0)}


def test_raise_with_a_postgres_that_never_answers_fails_fast_after_the_first_call(
    redis_server: str, fallbacks: list[dict[str, Any]], postgres_url: tuple[Any, str]
) -> None:
    """The breaker covers PostgreSQL as it covers Redis: a server stopped mid-deployment
    (SIGSTOP: it still accepts bytes) costs the first call its timeout, then the next
    calls fail at once with ``DebounceBreakerOpen``, nothing written anywhere."""
    server, url = postgres_url
    app = _postgres_app(redis_server, url)
    work, collect = _tasks(app, [])
    opened = work.delay(0).id  # the pool holds a connection; the schema was checked
    server.freeze()
    try:
        first, error = _timed(lambda: work.delay(1))
        assert first >= TIMEOUT * 0.9 and isinstance(error, DebounceBackendError)
        assert not isinstance(error, DebounceBreakerOpen)  # the store's own, waited for
        _every_way_in_skips_the_store(app, work, collect)
    finally:
        server.thaw()
    assert fallbacks == []
    listed = _open_windows(url)
    # the opener's window, and perhaps the timed-out call's (its outcome is unknown:
    # the thawed server may still run it); none of the four calls the breaker skipped
    assert opened in listed and len(listed - {opened}) <= 1, listed


def test_publish_with_a_postgres_that_never_answers_waits_once_then_publishes_every_call(
    redis_server: str, fallbacks: list[dict[str, Any]], postgres_url: tuple[Any, str]
) -> None:
    """Under ``debounce_on_outage="publish"`` no call is lost while PostgreSQL is frozen:
    the first waits its timeout and is published plainly, every later way in is
    published at once behind the breaker (each a message on the broker), and none wrote
    a window."""
    server, url = postgres_url
    _empty_broker(redis_server)
    app = _postgres_app(redis_server, url, debounce_on_outage="publish")
    work, collect = _tasks(app, [])
    opened = work.delay(0).id
    server.freeze()
    try:
        first, result = _timed(lambda: work.delay(1))
        assert first >= TIMEOUT * 0.9 and not isinstance(result, BaseException), result
        took, results = _timed(lambda: _every_way_in(app, work, collect))
        assert took < TIMEOUT / 2 and not isinstance(results, BaseException), results
    finally:
        server.thaw()
    published = 1 + len(EVERY_CALL)
    assert len(fallbacks) == published
    assert fallbacks[0]["reason"] in ("unknown", "unreachable")  # timed out
    assert {f["reason"] for f in fallbacks[1:]} == {"breaker"}
    broker = redis.Redis.from_url(f"{redis_server}/1")
    # kombu keeps a priority's messages in a list of its own ("celery" + sep + priority)
    queued = sum(broker.llen(name) for name in broker.scan_iter(match="celery*", _type="list"))
    assert queued == published
    listed = _open_windows(url)
    assert opened in listed and len(listed - {opened}) <= 1, listed  # as above
