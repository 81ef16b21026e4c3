"""Send paths against real servers, where a link fails before anything was sent.

A connect that times out (a host that answers no SYN: a failed-over master whose
address is gone) sent nothing, as a refused one did: on a cluster the slot table is
read again and the call goes to the master that serves its slot now.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
import redis
from helpers import debounced, make_app
from redis.backoff import NoBackoff
from redis.cluster import PRIMARY, ClusterNode
from redis.retry import Retry

from celery_debounce.store import store_for
from celery_debounce.store.idents import shard_of, window_ident
from celery_debounce.store.redis.tags import key_slot
from celery_debounce.testing.redis_cluster import LocalCluster


@pytest.fixture
def silent_host() -> Iterator[int]:
    """A port whose connects time out: its listener's backlog is full, never accepted
    (the kernel drops every further SYN)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    port = listener.getsockname()[1]
    held = [socket.create_connection(("127.0.0.1", port), timeout=1)]
    probe = socket.socket()
    probe.settimeout(0.2)
    try:
        with pytest.raises(TimeoutError):  # the trick holds on this kernel
            probe.connect(("127.0.0.1", port))
        yield port
    finally:
        for sock in (probe, *held, listener):
            sock.close()


@pytest.mark.cluster
def test_a_cluster_call_whose_master_times_out_on_connect_finds_the_current_master(
    redis_cluster: LocalCluster, redis_server: str, silent_host: int
) -> None:
    """The slot table names a master that never answers a connect. Nothing was sent:
    the table is read again and the call goes to the slot's current master, after one
    connect timeout (before: 'Timeout connecting' on this call and on every later one,
    the table never read again: only a refused connect re-read it)."""
    redis_cluster.flushall()
    app = make_app(
        redis_server,
        debounce_redis_url=f"{redis_cluster.url}/0",
        debounce_redis_cluster=True,
        debounce_shards=6,
        debounce_redis_timeout=0.5,
    )

    @debounced(
        app,
        debounce="30s",
        debounce_key="k{x}",
        debounce_max_wait="60s",
        name="cl.silent",
    )
    def work(x: int) -> int:
        return x

    first = work.delay(1)  # the topology read, the script loaded
    store = store_for(app)
    tag = store.tag(0)
    slot = key_slot(tag)
    manager = store.client.nodes_manager
    gone = ClusterNode(
        "127.0.0.1",
        silent_host,
        PRIMARY,
        redis.Redis(
            port=silent_host,
            socket_connect_timeout=0.5,
            socket_timeout=0.5,
            retry=Retry(NoBackoff(), 0),
        ),
    )
    for shard_slot in [
        s
        for s, nodes in manager.slots_cache.items()
        if nodes[0].name == manager.slots_cache[slot][0].name
    ]:
        manager.slots_cache[shard_slot] = [gone]  # as after a failover not yet read
    work_on_shard_0 = next(
        x for x in range(2, 1000) if shard_of(window_ident(work.name, f"k{x}"), 6) == 0
    )
    started = time.monotonic()
    call = work.delay(work_on_shard_0)
    assert time.monotonic() - started < 3
    assert manager.slots_cache[slot][0].port != silent_host  # read again
    assert work.delay(1).id == first.id
    assert work.delay(work_on_shard_0).id == call.id
