"""``celery debounce doctor``: each invariant broken by hand is found (key and task) and
repaired, a second run finds nothing, and a healthy store under load has no finding.
Single node and Redis Cluster."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import CliRunner
from helpers import debounced, make_app, running_worker, wait_until

from celery_debounce.ops.doctor import Finding, diagnose
from celery_debounce.store import WindowStore, store_for
from celery_debounce.store.idents import shard_of, window_ident
from celery_debounce.store.redis.keys import (
    active_key,
    calls_key,
    claims_key,
    due_key,
    held_key,
    open_key,
    run_key,
    win_key,
)


@pytest.fixture(params=["node", pytest.param("cluster", marks=pytest.mark.cluster)])
def factory(request: pytest.FixtureRequest, redis_server: str) -> Iterator[Callable[..., Celery]]:
    redis.Redis.from_url(f"{redis_server}/0").flushall()
    if request.param == "node":
        yield lambda **conf: make_app(redis_server, **conf)
        return
    cluster = request.getfixturevalue("redis_cluster")
    cluster.flushall()
    yield lambda **conf: make_app(
        redis_server,
        **{
            "debounce_redis_url": f"{cluster.url}/0",
            "debounce_redis_cluster": True,
            "debounce_shards": 3,
            **conf,
        },
    )


def _tasks(app: Celery) -> tuple[Any, Any]:
    @debounced(
        app,
        name="doc.work",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k{0}",
    )
    def work(x: int) -> int:
        return x

    @debounced(
        app,
        name="doc.quick",
        debounce="50ms",
        debounce_max_wait="200ms",
        debounce_key="q{0}",
        debounce_exclusive=True,
    )
    def quick(x: int) -> int:
        time.sleep(0.3)  # longer than its max wait: the next window of its key is held
        return x

    return work, quick


def _shard_tag(store: WindowStore, task: str, key: str) -> tuple[str, str]:
    ident = window_ident(task, key)
    tag = store.tag(shard_of(ident, store.settings.shards))
    assert store.client.exists(open_key(tag, ident))
    return tag, ident


def _break_everything(store: WindowStore, work: Any) -> dict[str, str]:
    """One broken invariant per check; the key each finding must name, by check."""
    c = store.client
    for n in (1, 2, 3):
        work.delay(n)
    tag, lost = _shard_tag(store, "doc.work", "k1")
    c.zrem(due_key(tag), lost)  # an open window nobody would take
    tag2, held = _shard_tag(store, "doc.work", "k2")
    c.hset(open_key(tag2, held), "hs", "1")
    c.zadd(held_key(tag2), {held: 1})  # held behind no run
    ghost = window_ident("doc.work", "gone")
    c.zadd(held_key(tag2), {ghost: 1})  # held with no window at all
    tag3 = store.tag(0)
    c.hset(
        win_key(tag3, "dead-claim"), mapping={"st": "claimed", "i": window_ident("doc.work", "dc")}
    )
    c.pexpire(win_key(tag3, "dead-claim"), 600_000)
    c.zadd(claims_key(tag3), {"dead-claim": 1000})  # lease ended in 1970
    c.zadd(active_key(tag3), {"dead-claim": 1000})
    stuck = window_ident("doc.work", "stuck")
    c.hset(run_key(tag3, stuck), "id", "no-such-window")
    c.pexpire(run_key(tag3, stuck), 600_000)
    unleased = window_ident("doc.work", "unleased")
    c.hset(run_key(tag3, unleased), "id", "claimed-no-lease")
    c.pexpire(run_key(tag3, unleased), 600_000)
    c.hset(win_key(tag3, "claimed-no-lease"), mapping={"st": "claimed", "i": unleased})
    c.pexpire(win_key(tag3, "claimed-no-lease"), 600_000)
    c.rpush(calls_key(tag3, "orphan-list"), "[]")
    c.hset(win_key(tag3, "forever"), mapping={"st": "finished", "i": window_ident("doc.work", "f")})
    # healthy without a TTL: closed by its cap, not yet taken (take.lua sets it), quarantined
    capped = work.apply_async((4,), debounce_max_calls=1)
    assert c.hget(
        win_key(
            store.tag(shard_of(window_ident("doc.work", "k4"), store.settings.shards)), capped.id
        ),
        "st",
    )
    c.hset(win_key(tag3, "quarantined"), mapping={"st": "quarantined", "qe": "bad"})
    return {
        "open_without_due": open_key(tag, lost),
        "held_without_run": held_key(tag2),
        "held_without_window": held_key(tag2),
        "claim_expired": win_key(tag3, "dead-claim"),
        "run_without_window": run_key(tag3, stuck),
        "claim_without_lease": run_key(tag3, unleased),
        "calls_without_window": calls_key(tag3, "orphan-list"),
        "no_ttl": win_key(tag3, "forever"),
    }


def _by_check(findings: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.check, []).append(f)
    return out


def test_doctor_finds_and_repairs_each_broken_invariant(factory: Callable[..., Celery]) -> None:
    app = factory()
    work, _quick = _tasks(app)
    store = store_for(app)
    broken = _break_everything(store, work)
    found = _by_check(diagnose(store))
    assert set(found) == set(broken), found
    for check, key in broken.items():
        assert key in [f.key for f in found[check]], (check, found[check])
    assert len(found["held_without_run"]) == len(found["held_without_window"]) == 1
    assert [f.key for f in found["no_ttl"]] == [broken["no_ttl"]]  # not the healthy ones
    assert all(
        f.task == "doc.work" for c, fs in found.items() for f in fs if c != "calls_without_window"
    ), found
    assert not any(f.repaired for fs in found.values() for f in fs)
    assert _by_check(diagnose(store)).keys() == broken.keys()  # reporting changed nothing

    repaired = diagnose(store, repair=True)
    assert {f.check for f in repaired} == set(broken) and all(f.repaired for f in repaired)
    assert diagnose(store) == []  # healed
    assert diagnose(store, repair=True) == []  # and a second repair does nothing
    c = store.client
    tag, lost = _shard_tag(store, "doc.work", "k1")
    assert c.zscore(due_key(tag), lost) is not None
    tag3 = store.tag(0)
    assert c.hget(win_key(tag3, "dead-claim"), "st") == b"stale"
    assert c.hget(win_key(tag3, "claimed-no-lease"), "st") == b"stale"
    assert c.exists(calls_key(tag3, "orphan-list")) == 0
    assert c.pttl(win_key(tag3, "forever")) > 0


def test_the_command_exits_1_with_findings_and_0_when_healthy(
    factory: Callable[..., Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery.bin.celery import celery as celery_cli

    app = factory()
    work, _ = _tasks(app)
    store = store_for(app)
    work.delay(1)
    tag, lost = _shard_tag(store, "doc.work", "k1")
    store.client.zrem(due_key(tag), lost)
    import celery_debounce.ops.cli as cli_module  # the app given by -A: this one

    monkeypatch.setattr(cli_module, "_admin", lambda ctx: cli_module.DebounceAdmin(app))
    runner = CliRunner()
    first = runner.invoke(celery_cli, ["debounce", "doctor", "-j"])
    assert first.exit_code == 1, first.output
    out = json.loads(first.output)
    assert out["ok"] is False
    assert [(f["check"], f["key"], f["task"]) for f in out["findings"]] == [
        ("open_without_due", open_key(tag, lost), "doc.work")
    ]
    fixed = runner.invoke(celery_cli, ["debounce", "doctor", "--repair"])
    assert fixed.exit_code == 1 and "[repaired]" in fixed.output, fixed.output
    healthy = runner.invoke(celery_cli, ["debounce", "doctor"])
    assert healthy.exit_code == 0 and "No findings" in healthy.output, healthy.output


def test_a_healthy_store_under_load_has_no_finding(factory: Callable[..., Celery]) -> None:
    """Windows opening, held, claimed and finishing with a real worker while doctor
    runs: a window mid-transition is never a finding."""
    app = factory(debounce_poll_interval=0.02)
    _work, quick = _tasks(app)
    store = store_for(app)
    stop = threading.Event()
    calls = [0]

    def produce() -> None:
        while not stop.is_set():
            quick.delay(calls[0] % 7)
            calls[0] += 1

    findings: list[Finding] = []
    with running_worker(app):
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            wait_until(lambda: calls[0] > 50, timeout=20)
            held = claimed = rounds = 0
            end = time.monotonic() + 3
            while time.monotonic() < end or not (held and claimed):
                assert time.monotonic() < end + 20, (held, claimed)
                findings += diagnose(store, grace_ms=30_000)
                rounds += 1
                held += sum(store.client.zcard(held_key(t)) for t in store.layout.tags)
                claimed += sum(store.client.zcard(claims_key(t)) for t in store.layout.tags)
        finally:
            stop.set()
            producer.join(10)
        wait_until(lambda: not store.client.keys("*:open:*"), timeout=30)
    assert findings == [], findings
    assert rounds > 3 and calls[0] > 50


def test_a_key_held_too_long_is_reported_and_never_repaired(factory: Callable[..., Celery]) -> None:
    """A window held behind a run still queued (its message may be lost): doctor names
    it past --held-after, and --repair leaves it held (only an operator knows the run
    is gone)."""
    app = factory()
    work, _ = _tasks(app)
    store = store_for(app)
    work.delay(5)
    tag, ident = _shard_tag(store, "doc.work", "k5")
    c = store.client
    two_hours_ago = int(c.time()[0]) * 1000 - 7_200_000
    c.hset(win_key(tag, "queued-run"), mapping={"st": "queued", "i": ident})
    c.pexpire(win_key(tag, "queued-run"), 600_000)
    c.hset(run_key(tag, ident), "id", "queued-run")
    c.pexpire(run_key(tag, ident), 600_000)
    c.hset(open_key(tag, ident), "hs", two_hours_ago)
    c.zadd(held_key(tag), {ident: two_hours_ago})
    for repair in (False, True):
        found = diagnose(store, repair=repair)
        assert [(f.check, f.key, f.task, f.detail, f.repaired) for f in found] == [
            ("held_too_long", held_key(tag), "doc.work", "runner queued-run queued", False)
        ]
    assert c.zscore(held_key(tag), ident) is not None  # still held
    assert diagnose(store, held_after_ms=3 * 3_600_000) == []
