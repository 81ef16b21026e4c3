"""Redis Cluster: shard tags, one slot per script, sharded wake-ups, WAIT for replicas.

Against the session's real 3-master, 3-replica cluster (``redis_cluster`` in
conftest.py); the broker and results stay on the single test redis-server.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, make_app, package_keys, running_worker, wait_until
from redis.crc import key_slot
from redis.exceptions import MovedError

from celery_debounce import DebounceAdmin, DebounceBackendError, enqueue_many
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.errors import DebounceConfigError
from celery_debounce.ops.admin import read_snapshot
from celery_debounce.settings import Settings, settings_for
from celery_debounce.store import WindowStore, store_for
from celery_debounce.store.redis import cluster, transport
from celery_debounce.store.redis.tags import CLUSTER_SLOTS, cluster_shard_tag, layout_of
from celery_debounce.testing import clear_windows
from celery_debounce.testing.redis_cluster import LocalCluster
from celery_debounce.testing.servers import LocalRedis


def test_cluster_shard_tags_fall_in_their_own_slot_range() -> None:
    for shards in range(1, 17):
        for shard in range(shards):
            slot = key_slot(cluster_shard_tag(shard, shards).encode())
            assert shard * CLUSTER_SLOTS // shards <= slot < (shard + 1) * CLUSTER_SLOTS // shards
    # one shard keeps the single-node tag: a cluster that ran one shard keeps its windows
    assert cluster_shard_tag(0, 1) == "0"


def test_only_the_cluster_transport_follows_redirections() -> None:
    """MOVED, ASK, TRYAGAIN and CLUSTERDOWN are followed in store/redis/cluster.py alone
    (``Redirections``): the base transport's ``send_on_node`` writes where its route
    says and asks it whether to write again; its own route follows nothing."""
    base = Path(transport.__file__).read_text("utf-8")
    for name in ("MovedError", "AskError", "TryAgainError", "ClusterDownError", "nodes_manager"):
        assert name not in base, name
        assert name in Path(cluster.__file__).read_text("utf-8"), name
    route = transport.Route(transport.Transport.__new__(transport.Transport), "k")
    assert route.follow(MovedError("3999 127.0.0.1:6381")) is False
    assert (route.ahead, route.elsewhere) == ([], False)
    assert issubclass(cluster.Redirections, transport.Route)
    assert cluster.ClusterTransport.route is not transport.Transport.route


def test_single_node_keys_are_unchanged_by_the_cluster_support() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.update(debounce_redis_url="redis://x/0", debounce_shards=4)
    settings = Settings.from_app(app)
    assert layout_of(settings).tags == (
        "debounce:{0}",
        "debounce:{1}",
        "debounce:{2}",
        "debounce:{3}",
    )
    app.conf.debounce_redis_cluster = True
    on_cluster = Settings.from_app(app)
    assert [t.split("{")[1].split(".")[0].rstrip("}") for t in layout_of(on_cluster).tags] == [
        "0",
        "1",
        "2",
        "3",
    ]
    assert layout_of(on_cluster).tags != layout_of(settings).tags
    app.conf.debounce_shards = 1
    assert layout_of(Settings.from_app(app)).tags == ("debounce:{0}",)


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"debounce_redis_cluster": "maybe"}, "debounce_redis_cluster='maybe'"),
        ({"debounce_redis_wait_replicas": -1}, "debounce_redis_wait_replicas=-1"),
        ({"debounce_redis_wait_replicas": "one"}, "debounce_redis_wait_replicas='one'"),
        (
            {"debounce_redis_cluster": True, "debounce_redis_url": "unix:///tmp/r.sock"},
            "debounce_redis_cluster=True needs a redis:// or rediss:// URL",
        ),
        (
            {
                "debounce_redis_cluster": True,
                "debounce_redis_url": "sentinel://127.0.0.1:26379",
                "debounce_redis_sentinel_master": "m",
            },
            "debounce_redis_cluster=True needs a redis:// or rediss:// URL",
        ),
    ],
)
def test_bad_cluster_settings_are_refused_by_name(conf: dict[str, Any], message: str) -> None:
    app = Celery("t", set_as_current=False)
    app.conf.update(**{"debounce_redis_url": "redis://x/0", **conf})
    with pytest.raises(DebounceConfigError) as caught:
        Settings.from_app(app)
    assert message in str(caught.value)


# -- against the real cluster -------------------------------------------------------------


@pytest.fixture
def cluster_app(redis_cluster: LocalCluster, redis_server: str) -> Iterator[Callable[..., Celery]]:
    redis_cluster.flushall()
    redis.Redis.from_url(f"{redis_server}/0").flushall()

    def factory(**conf: Any) -> Celery:
        return make_app(
            redis_server,
            **{
                "debounce_redis_url": f"{redis_cluster.url}/0",
                "debounce_redis_cluster": True,
                "debounce_shards": 6,
                **conf,
            },
        )

    yield factory


def _task(app: Celery, window: str = "30s") -> Any:
    @debounced(
        app,
        debounce=window,
        debounce_key="k{x}",
        debounce_max_wait="60s",
        name="cl.work",
    )
    def work(x: int) -> int:
        return x

    return work


@pytest.mark.cluster
def test_six_shards_spread_evenly_over_the_three_masters(
    cluster_app: Callable[..., Celery], redis_cluster: LocalCluster
) -> None:
    app = cluster_app(debounce_dispatcher=False)
    work = _task(app)
    for x in range(600):
        work.delay(x)
    per_master = {}
    for port in redis_cluster.master_ports():
        node = redis.Redis(port=port)
        per_master[port] = sum(1 for _ in node.scan_iter(match="debounce:*:open:*"))
        node.close()
    assert sum(per_master.values()) == 600
    # crc32 of 600 idents over 6 shards, 2 shards per master: each master near 200
    assert all(120 <= n <= 280 for n in per_master.values()), per_master
    tags = store_for(app).layout.tags
    owners = [redis_cluster.node_of_slot(key_slot(t.encode())) for t in tags]
    assert sorted(owners.count(p) for p in set(owners)) == [2, 2, 2]


@pytest.mark.cluster
def test_operator_commands_and_helpers_work_on_the_cluster(
    cluster_app: Callable[..., Celery], redis_cluster: LocalCluster
) -> None:
    """Every admin, stats, top, bulk and testing command on a 6-shard cluster: none may
    send a cross-slot command (the cluster would refuse it with CROSSSLOT)."""
    app = cluster_app(debounce_dispatcher=False)
    work = _task(app)
    results = enqueue_many(work, [((x,), {}) for x in range(40)], chunk_size=7)
    assert len({r.id for r in results}) == 40
    fixed = work.apply_async((1000,), task_id="fixed-id")  # gate.lua's fixed-id path
    assert fixed.id == "fixed-id"
    admin = DebounceAdmin(app)
    stats = admin.stats()
    assert stats.open == 41 and stats.tasks["cl.work"].open == 41
    assert len(admin.windows(limit=100)) == 41
    assert admin.cancel("cl.work", "k3").task_id == results[3].id
    assert admin.cancel_id("fixed-id").task_id == "fixed-id"
    assert admin.flush("cl.work", "k4").task_id == results[4].id
    assert admin.flush_all() == 38
    snapshot = read_snapshot(store_for(app))
    assert snapshot.open == 0 and snapshot.leased == 39
    dispatcher = Dispatcher(app)
    published, _ = dispatcher.dispatch_once()
    assert published == 39
    assert admin.stats().tasks["cl.work"].runs == 39
    removed = admin.reset_stats()
    assert removed["cl.work"].runs == 39 and removed["cl.work"].cancelled == 2
    assert store_for(app).maxmemory_policy() == "noeviction"
    assert clear_windows(app) > 0
    assert package_keys(store_for(app).client) == []


@pytest.mark.cluster
def test_maxmemory_policy_is_read_from_every_master(
    cluster_app: Callable[..., Celery], redis_cluster: LocalCluster
) -> None:
    app = cluster_app()
    last = redis_cluster.master_ports()[-1]
    redis_cluster.cli(last, "config", "set", "maxmemory-policy", "allkeys-lru")
    try:
        assert store_for(app).maxmemory_policy() == "allkeys-lru"
    finally:
        redis_cluster.cli(last, "config", "set", "maxmemory-policy", "noeviction")


@pytest.mark.cluster
def test_wake_ups_use_sharded_pub_sub_on_each_shards_master(
    cluster_app: Callable[..., Celery], redis_cluster: LocalCluster
) -> None:
    """A dispatcher that sleeps up to 30 s between passes is woken by a call on any
    shard (SPUBLISH to that shard's channel, in its slot), and nothing is PUBLISHed to
    every node."""
    app = cluster_app(debounce_poll_interval="30s")
    backend = store_for(app)
    assert backend.sharded_wake
    work = _task(app, window="200ms")
    dispatcher = Dispatcher(app, name="sleepy")
    dispatcher.start()
    try:
        channels = [backend.layout.shard_wake_channel(s) for s in range(6)]
        node_of = {c: redis_cluster.node_of_slot(key_slot(c.encode())) for c in channels}

        def subscribed() -> bool:
            return all(
                redis.Redis(port=node_of[c]).pubsub_shardnumsub(c)[0][1] == 1 for c in channels
            )

        wait_until(subscribed, timeout=10)
        time.sleep(0.5)  # the dispatcher is now in its 30 s sleep
        broker = redis.Redis.from_url(app.conf.broker_url)
        for x in range(12):  # every shard gets calls
            work.delay(x)
        wait_until(lambda: broker.llen("celery") == 12, timeout=8)
        for port in redis_cluster.master_ports():
            stats = redis.Redis(port=port).info("commandstats")
            assert "cmdstat_publish" not in stats
    finally:
        dispatcher.stop()


@pytest.mark.cluster
def test_without_sharded_pub_sub_wake_ups_fall_back_to_publish(
    cluster_app: Callable[..., Celery], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Masters older than Redis 7.0 have no SPUBLISH: the scripts PUBLISH to
    ``<prefix>:wake`` (the cluster forwards it) and dispatchers SUBSCRIBE to it."""
    import celery_debounce.store.redis.cluster as cluster_module

    monkeypatch.setattr(cluster_module, "_every_master_has_sharded_pubsub", lambda c: False)
    app = cluster_app(debounce_poll_interval="30s")
    backend = store_for(app)
    assert not backend.sharded_wake
    assert "local SHARDED_WAKE = false" in backend.scripts["gate"].script
    work = _task(app, window="200ms")
    dispatcher = Dispatcher(app, name="plain-wake")
    dispatcher.start()
    try:
        wait_until(lambda: dispatcher._wake is not None and dispatcher._wake.subscribed, timeout=10)
        time.sleep(0.5)  # in its 30 s sleep
        broker = redis.Redis.from_url(app.conf.broker_url)
        for x in range(6):
            work.delay(x)
        wait_until(lambda: broker.llen("celery") == 6, timeout=8)
    finally:
        dispatcher.stop()


@pytest.mark.cluster
def test_a_worker_runs_windows_of_every_shard_on_the_cluster(
    cluster_app: Callable[..., Celery],
) -> None:
    app = cluster_app()
    work = _task(app, window="300ms")
    with running_worker(app):
        results = [work.delay(x) for x in range(30) for _ in range(2)]
        assert len({r.id for r in results}) == 30
        assert sorted(r.get(timeout=15) for r in results[::2]) == list(range(30))


@pytest.mark.cluster
def test_exclusive_holds_and_claim_renewals_work_on_the_cluster(
    cluster_app: Callable[..., Celery],
) -> None:
    """debounce_exclusive and claim leases on a cluster of 3 masters, 6 shards: keys a
    script builds by name share their shard's slot; one renewal round trip covers the
    claims of every shard (a pipeline per node); each key's follow-up waits for its run."""
    app = cluster_app(debounce_claim_lease=1.0, debounce_poll_interval=0.1)

    @debounced(
        app,
        debounce="100ms",
        debounce_key="k{x}",
        debounce_max_wait="1s",
        name="cl.exclusive",
        debounce_exclusive=True,
    )
    def exclusive(x: int, seconds: float) -> tuple[float, float]:
        start = time.time()
        time.sleep(seconds)
        return start, time.time()

    store = store_for(app)
    with running_worker(app, pool="threads", concurrency=12):
        firsts = [exclusive.delay(x, 2.0) for x in range(6)]
        time.sleep(0.8)  # all six claimed, on several shards and masters
        follows = [exclusive.delay(x, 0.0) for x in range(6)]
        wait_until(lambda: sum(len(store.held(s)) for s in range(6)) == 6, 5)
        ends = [f.get(timeout=15)[1] for f in firsts]  # renewed past their 1 s lease
        starts = [f.get(timeout=15)[0] for f in follows]
    assert all(start >= end for start, end in zip(starts, ends, strict=True))
    assert DebounceAdmin(app).stats().tasks["cl.exclusive"].holds == 6


# -- debounce_redis_wait_replicas -----------------------------------------------------------


def test_wait_replicas_without_replicas_is_an_error_within_the_timeout(
    app_factory: Callable[..., Celery],
) -> None:
    app = app_factory(debounce_redis_wait_replicas=1, debounce_redis_timeout="1s")
    work = _task(app)
    started = time.monotonic()
    with pytest.raises(DebounceBackendError, match="may not survive a failover"):
        work.delay(1)
    assert time.monotonic() - started < 5
    with pytest.raises(DebounceBackendError, match="may not survive a failover") as caught:
        enqueue_many(work, [((x,), {}) for x in range(3)])
    assert sorted(caught.value.unknown) == [0, 1, 2]


def test_wait_replicas_is_one_round_trip_and_succeeds_with_a_replica(
    app_factory: Callable[..., Celery], redis_server: str
) -> None:
    port = int(redis_server.rsplit(":", 1)[1])
    with LocalRedis("--replicaof", "127.0.0.1", str(port)) as replica:
        replica_client = redis.Redis(port=replica.port)
        wait_until(
            lambda: replica_client.info("replication")["master_link_status"] == "up", timeout=15
        )
        app = app_factory(debounce_redis_wait_replicas=1)
        work = _task(app)
        primary = redis.Redis.from_url(f"{redis_server}/0")
        work.delay(0)  # loads the script (a NOSCRIPT reply is sent again, WAIT with it)
        primary.config_resetstat()
        first = work.delay(1)
        assert work.delay(1).id == first.id
        assert len(enqueue_many(work, [((x,), {}) for x in range(5)])) == 5
        stats = primary.info("commandstats")
        assert stats["cmdstat_wait"]["calls"] == 3  # two calls, one bulk chunk
        assert stats["cmdstat_evalsha"]["calls"] == 7
        # on the replica: the two calls and the bulk's one
        assert replica_client.hget("debounce:{0}:open:7:cl.work:k1", "n") == b"3"


def test_wait_replicas_off_sends_no_wait(
    app_factory: Callable[..., Celery], redis_server: str
) -> None:
    app = app_factory()
    work = _task(app)
    primary = redis.Redis.from_url(f"{redis_server}/0")
    primary.config_resetstat()
    work.delay(1)
    enqueue_many(work, [((x,), {}) for x in range(5)])
    assert "cmdstat_wait" not in primary.info("commandstats")


@pytest.mark.cluster
def test_wait_replicas_on_the_cluster_waits_on_the_shards_master(
    cluster_app: Callable[..., Celery], redis_cluster: LocalCluster
) -> None:
    app = cluster_app(debounce_redis_wait_replicas=1)
    work = _task(app)
    ids = {work.delay(x).id for x in range(12)}
    assert len(ids) == 12
    assert len(enqueue_many(work, [((x,), {}) for x in range(12, 30)])) == 18
    assert DebounceAdmin(app).stats().open == 30
    waits = sum(
        redis.Redis(port=p).info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
        for p in redis_cluster.master_ports()
    )
    assert waits >= 12 + 3  # one per call, one per shard's chunk (at least 3 shards)


@pytest.mark.cluster
def test_windows_written_before_cluster_support_run_after_the_upgrade(
    cluster_app: Callable[..., Celery], redis_cluster: LocalCluster
) -> None:
    """A release before cluster support wrote shard i under ``{i}``; with
    ``debounce_redis_cluster=True`` new windows go under the cluster tags, and the
    dispatchers drain the old shards: those windows run, and their records finish."""
    old_app = cluster_app(debounce_shards=4, debounce_dispatcher=False)
    old_settings = dataclasses.replace(settings_for(old_app), redis_cluster=False)
    old_client = redis.RedisCluster.from_url(f"{redis_cluster.url}/0")
    old_app._debounce_store = (  # type: ignore[attr-defined]
        os.getpid(),
        WindowStore(old_settings, client=old_client),
    )
    old_work = _task(old_app, window="500ms")
    old = {x: old_work.delay(x).id for x in range(12)}
    assert {k.split(b"}")[0] for k in old_client.scan_iter(match="debounce:*:open:*")} == {
        b"debounce:{0",
        b"debounce:{1",
        b"debounce:{2",
        b"debounce:{3",
    }
    app = cluster_app(debounce_shards=4)
    assert store_for(app).layout.legacy_shards == (4, 5, 6, 7)  # none of {0}..{3} fits
    work = _task(app, window="500ms")
    with running_worker(app):
        new = work.delay(100)
        assert sorted(work.AsyncResult(i).get(timeout=15) for i in old.values()) == list(range(12))
        assert new.get(timeout=15) == 100

        def finished() -> bool:
            states = [
                old_client.hget(f"debounce:{{{s}}}:win:{i}", "st")
                for i in old.values()
                for s in range(4)
            ]
            return states.count(b"finished") == 12

        wait_until(finished, timeout=10)
    assert not list(old_client.scan_iter(match="debounce:{[0-3]}:open:*"))


@pytest.mark.cluster
def test_a_worker_on_another_debounce_shards_finds_the_record_by_the_messages_tag(
    cluster_app: Callable[..., Celery], redis_cluster: LocalCluster
) -> None:
    """Rule "every id resolves" across a shard change (issue 19, item 7): windows
    published by a dispatcher with 6 shards on a cluster run on a worker with 3 (a
    rolling change of ``debounce_shards``). The message names the record's tag, not
    a shard number the worker would map to its own tags: claim and finish find the
    record, it ends ``finished``, and a fixed-id alias gets the run's result (before,
    the record stayed ``queued`` and the alias hung). Windows still open under the
    6-shard tags when the change comes are drained by the 3-shard dispatcher (the
    old layout is remembered in ``debounce:layouts``)."""
    from celery_debounce.dispatch.dispatcher import Dispatcher

    old_app = cluster_app(debounce_shards=6, debounce_dispatcher=False)
    old_work = _task(old_app, window="100ms")
    ids = {x: old_work.delay(x).id for x in range(8)}
    aliases = {x: old_work.apply_async((x,), task_id=f"al-{x}").id for x in range(8)}
    client = redis.RedisCluster.from_url(f"{redis_cluster.url}/0")
    time.sleep(0.3)
    assert sum(Dispatcher(old_app, name="six").dispatch_once()[0] for _ in range(3)) == 8
    left = {x: old_work.delay(x).id for x in range(20, 28)}  # open when the change comes
    app = cluster_app(debounce_shards=3)
    work = _task(app, window="100ms")
    with running_worker(app):  # its dispatcher drains the 6-shard layout's tags
        assert sorted(work.AsyncResult(a).get(timeout=15) for a in aliases.values()) == list(
            range(8)
        )
        assert sorted(work.AsyncResult(i).get(timeout=15) for i in left.values()) == list(
            range(20, 28)
        )
    tags = store_for(old_app).layout.tags
    states = {
        client.hget(f"{tag}:win:{i}", "st") for i in (*ids.values(), *left.values()) for tag in tags
    }
    assert states - {None} == {b"finished"}


def test_use_fakeredis_works_for_an_app_configured_for_a_cluster() -> None:
    """A suite of a cluster-configured app tests with fakeredis: nothing connects to
    the cluster URL (before, the backend built a cluster client first)."""
    from celery_debounce.testing import run_windows, use_fakeredis

    app = Celery("fake", set_as_current=False)
    app.conf.update(
        debounce_redis_url="redis://cluster.invalid:7000/0",
        debounce_redis_cluster=True,
        debounce_shards=6,
        debounce_redis_wait_replicas=1,  # fakeredis has no replicas: off there
        broker_url="memory://",
        debounce_dispatcher=False,
    )
    use_fakeredis(app)
    ran: list[int] = []

    @debounced(app, debounce="1s", debounce_key="k", debounce_max_wait="5s")
    def work(x: int) -> None:
        ran.append(x)

    first = work.delay(1)
    assert work.delay(2).id == first.id
    run_windows(app)
    assert ran == [1]


def test_an_unreachable_cluster_is_a_debounce_error_within_seconds(
    app_factory: Callable[..., Celery],
) -> None:
    from celery_debounce.testing.servers import free_port

    app = app_factory(
        debounce_redis_url=f"redis://user:secret@127.0.0.1:{free_port()}/0",
        debounce_redis_cluster=True,
        debounce_redis_timeout="1s",
    )
    work = _task(app)
    started = time.monotonic()
    with pytest.raises(DebounceBackendError, match="Redis Cluster unreachable") as caught:
        work.delay(1)
    assert time.monotonic() - started < 5
    assert "secret" not in str(caught.value)


@pytest.mark.cluster
def test_the_server_version_is_read_from_every_master(
    cluster_app: Callable[..., Celery],
    redis_cluster: LocalCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tests/store/redis/test_server_version.py on a cluster: each master's version is checked; one
    old master refuses the store, naming that master."""
    import celery_debounce.store.redis.server as store_module

    app = cluster_app()
    store = store_for(app)
    found = store.server_versions()
    assert sorted(int(where.rsplit(":", 1)[1]) for where, _, _ in found) == sorted(
        redis_cluster.master_ports()
    )
    assert store.server_checked
    last = redis_cluster.master_ports()[-1]
    real = store_module.read_server_version

    def one_old(client: Any) -> Any:
        port = client.connection_pool.connection_kwargs["port"]
        return ("redis", "6.0.16") if port == last else real(client)

    monkeypatch.setattr(store_module, "read_server_version", one_old)
    with pytest.raises(DebounceBackendError, match=rf":{last} is Redis 6\.0\.16"):
        store_for(cluster_app())
