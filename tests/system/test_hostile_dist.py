"""Hostile review of the distributed parts: runs that could be lost around a
change of deployment settings."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, make_app, running_worker, wait_until
from redis.crc import key_slot
from test_cluster_faults import _key_on, _serves, cluster_env  # noqa: F401 (a fixture)
from test_tls_acl import ACL_RULES

from celery_debounce import DebounceBackendError
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.store import store_for
from celery_debounce.testing.redis_cluster import LocalCluster


def _task(app: Celery) -> Any:
    @debounced(
        app,
        debounce="300ms",
        debounce_key="k{x}",
        debounce_max_wait="5s",
        name="hd.work",
    )
    def work(x: int) -> int:
        return x

    return work


def test_windows_of_shards_dropped_by_lowering_debounce_shards_still_run(
    app_factory: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    """Rule "every id resolves" across a shard change (issue 19, item 7): an operator
    lowers ``debounce_shards`` from 4 to 2 on one node while windows are open: the
    windows of shards 2 and 3 must still be published and run (a caller's
    ``AsyncResult`` must not wait forever). The old deployment's dispatcher took
    windows, so its layout is remembered (``debounce:layouts``), and the new
    dispatchers drain its shards until they are empty."""
    old_app = app_factory(debounce_shards=4, debounce_dispatcher=False)
    old_work = _task(old_app)
    first = old_work.delay(100)
    wait_until(lambda: Dispatcher(old_app, name="old").dispatch_once()[0], 5)
    assert redis_client.hkeys("debounce:layouts") == [b"node:4"]
    old = {x: old_work.delay(x).id for x in range(12)}
    in_dropped = {k.split(b"}")[0] for k in redis_client.scan_iter(match="debounce:*:open:*")}
    assert {b"debounce:{2", b"debounce:{3"} <= in_dropped  # some windows in shards 2, 3
    app = app_factory(debounce_shards=2)
    work = _task(app)
    with running_worker(app):
        got = sorted(work.AsyncResult(i).get(timeout=8) for i in [*old.values(), first.id])
    assert got == [*range(12), 100]


#: What a least-privilege user needs on top of the single-node line on a Redis Cluster
#: (docs/guarantees.md): redis-py reads the slot table (CLUSTER SLOTS) and the
#: commands' key positions (COMMAND), the store asks every master's version (INFO),
#: a call for a migrating slot follows ASK with ASKING
#: for sharded wake-ups, which use SPUBLISH/SSUBSCRIBE on the per-shard channels
#: <prefix>:{<tag>}:wake.
CLUSTER_ACL_EXTRA = (
    "+cluster|slots +command +info +asking +spublish +ssubscribe +sunsubscribe &debounce:*"
)


def test_the_documented_cluster_acl_additions_are_the_ones_tested() -> None:
    doc = " ".join(
        (Path(__file__).resolve().parents[2] / "docs" / "guarantees.md").read_text().split()
    )
    added = doc.split("On a Redis Cluster (`debounce_redis_cluster`) add `", 1)[1]
    assert sorted(added.split("` on every node", 1)[0].split()) == sorted(CLUSTER_ACL_EXTRA.split())


@pytest.mark.cluster
def test_the_acl_user_on_a_cluster_errors_by_name_or_runs_every_window(
    redis_cluster: LocalCluster, redis_server: str
) -> None:
    """The single-node ACL line on a cluster: a call fails at once with
    DebounceBackendError (nothing silently lost); with the documented cluster
    additions a worker runs every window, woken by the sharded wake-up."""
    redis_cluster.flushall()
    redis.Redis.from_url(f"{redis_server}/0").flushall()
    nodes = [redis.Redis(port=n.port) for n in redis_cluster.running()]
    port = redis_cluster.master_ports()[0]
    url = f"redis://debouncer:s3cret@127.0.0.1:{port}/0"

    def app_with(rules: str) -> Celery:
        for node in nodes:
            node.execute_command(
                "ACL", "SETUSER", "debouncer", "reset", "on", ">s3cret", *rules.split()
            )
        return make_app(
            redis_server,
            debounce_redis_url=url,
            debounce_redis_cluster=True,
            debounce_shards=3,
            debounce_poll_interval=30,
        )

    try:
        app = app_with(ACL_RULES)
        work = _task(app)
        started = time.monotonic()
        with pytest.raises(DebounceBackendError, match="unreachable"):
            work.delay(0)
        assert time.monotonic() - started < 5
        assert redis_cluster.flushall() is None and not any(
            node.dbsize() for node in nodes
        )  # nothing written

        app = app_with(f"{ACL_RULES} {CLUSTER_ACL_EXTRA}")
        work = _task(app)
        assert store_for(app).sharded_wake
        with running_worker(app):
            # poll interval 30 s: an idle dispatcher runs these in time only if woken
            ids = [work.delay(x).id for x in range(6)]
            assert sorted(work.AsyncResult(i).get(timeout=8) for i in ids) == list(range(6))
    finally:
        for node in nodes:
            node.execute_command("ACL", "DELUSER", "debouncer")


@pytest.mark.cluster
def test_after_a_cluster_failover_an_idle_producer_and_the_dispatcher_reach_the_new_master(
    cluster_env: tuple[LocalCluster, Callable[..., Celery]],  # noqa: F811 (the fixture)
    redis_server: str,
) -> None:
    """A master SIGKILLed and its replica promoted. A producer that made no call
    during the failover (its slot table still names the dead master, no pooled
    connection to it) reaches the new master: before, every call was refused, for
    good, by the connect to the dead one (the slot table was read again only when a
    pooled connection failed). The running dispatcher's sharded wake subscription
    moves too, so that window is published at its deadline, not after the 30 s poll
    interval."""
    cluster, factory = cluster_env
    app = factory(debounce_poll_interval=30)
    layout = store_for(app).layout
    shard = 0
    slot = key_slot(layout.tags[shard].encode())
    victim = cluster.node_of_slot(slot)
    channel = layout.shard_wake_channel(shard)
    record = app.tasks["cluster.record"]
    key = _key_on({shard}, record.name)
    broker = redis.Redis.from_url(f"{redis_server}/1")
    dispatcher = Dispatcher(factory(debounce_poll_interval=30), name="woken")
    dispatcher.start()
    try:
        wait_until(
            lambda: (
                redis.Redis(port=victim).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1
            ),
            timeout=10,
        )
        cluster.kill(victim)
        new = wait_until(
            lambda: (p := _serves(cluster, slot)) not in (None, victim) and p, timeout=20
        )
        wait_until(
            lambda: redis.Redis(port=new).execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1,
            timeout=15,
        )
        before = broker.llen("celery")

        def called() -> bool:
            try:
                record.delay(key)
            except DebounceBackendError:  # refused until the slot table names the replica
                return False
            return True

        wait_until(called, timeout=10)
        wait_until(lambda: broker.llen("celery") == before + 1, timeout=5)
    finally:
        dispatcher.stop()
        cluster.restart(victim)


def _acl_on(nodes: list[redis.Redis], rules: str) -> None:
    for node in nodes:
        node.execute_command(
            "ACL", "SETUSER", "debouncer", "reset", "on", ">s3cret", *rules.split()
        )


@pytest.mark.cluster
def test_every_feature_runs_as_the_acl_user_on_a_cluster(
    redis_cluster: LocalCluster, redis_server: str
) -> None:
    """Issue 19, item 9 on a Cluster: every feature (test_tls_acl._every_feature, with
    debounce_redis_wait_replicas=1 so each call and chunk is followed by WAIT) as the
    documented user with the cluster additions: no error at all."""
    from test_tls_acl import _every_feature

    redis_cluster.flushall()
    redis.Redis.from_url(f"{redis_server}/0").flushall()
    nodes = [redis.Redis(port=n.port) for n in redis_cluster.running()]
    port = redis_cluster.master_ports()[0]
    try:
        _acl_on(nodes, f"{ACL_RULES} {CLUSTER_ACL_EXTRA}")
        app = make_app(
            redis_server,
            debounce_redis_url=f"redis://debouncer:s3cret@127.0.0.1:{port}/0",
            debounce_redis_cluster=True,
            debounce_shards=3,
            debounce_redis_wait_replicas=1,
        )
        errors: list[BaseException] = []
        _every_feature(app, errors)
        assert errors == []
    finally:
        for node in nodes:
            node.execute_command("ACL", "DELUSER", "debouncer")


@pytest.mark.cluster
@pytest.mark.parametrize("asking", [True, False])
def test_a_call_for_a_migrating_slot_follows_ask_as_the_acl_user(
    redis_cluster: LocalCluster,
    redis_server: str,
    asking: bool,
) -> None:
    """A window's keys moved to the target while its slot is MIGRATING: the source
    answers ASK, and the call is sent to the target after ASKING. With `+asking` (the
    documented additions) the call joins the window there; without it the call is
    refused with a DebounceBackendError, nothing written twice."""
    redis_cluster.flushall()
    nodes = [redis.Redis(port=n.port) for n in redis_cluster.running()]
    rules = f"{ACL_RULES} {CLUSTER_ACL_EXTRA}"
    if not asking:
        rules = rules.replace(" +asking", "")
    _acl_on(nodes, rules)
    port = redis_cluster.master_ports()[0]
    app = make_app(
        redis_server,
        debounce_redis_url=f"redis://debouncer:s3cret@127.0.0.1:{port}/0",
        debounce_redis_cluster=True,
        debounce_shards=1,
        debounce_redis_timeout=2,
    )
    work = _task(app)
    tag = store_for(app).layout.tags[0]
    slot = key_slot(tag.encode())
    source = redis_cluster.node_of_slot(slot)
    target = next(p for p in redis_cluster.master_ports() if p != source)
    cli = redis_cluster.cli
    first = work.delay(1)
    try:
        cli(target, "cluster", "setslot", str(slot), "importing", redis_cluster.node_id(source))
        cli(source, "cluster", "setslot", str(slot), "migrating", redis_cluster.node_id(target))
        keys = cli(source, "cluster", "getkeysinslot", str(slot), "100").split()
        assert keys
        cli(source, "migrate", "127.0.0.1", str(target), "", "0", "5000", "keys", *keys)
        on_target = redis.Redis(port=target).pipeline(transaction=False)
        on_target.execute_command("ASKING")  # the target serves the importing slot after it
        on_target.hget(f"{tag}:open:7:hd.work:k1", "n")
        if asking:
            assert work.delay(1).id == first.id  # followed ASK to the target
            assert on_target.execute()[1] == b"2"
        else:
            started = time.monotonic()
            with pytest.raises(DebounceBackendError):
                work.delay(1)
            assert time.monotonic() - started < 8
            assert on_target.execute()[1] == b"1"
    finally:
        for p in (
            target,
            source,
            *[p for p in redis_cluster.master_ports() if p not in (source, target)],
        ):
            cli(p, "cluster", "setslot", str(slot), "node", redis_cluster.node_id(target))
        redis_cluster.migrate_slot(slot, target, source)
        for node in nodes:
            node.execute_command("ACL", "DELUSER", "debouncer")
