"""A gevent worker (``celery worker -P gevent``), which the docs name for claim renewal:
runs happen, their claims are renewed past the lease while a run waits on I/O, and
``debounce_dispatcher_process`` falls back to a thread there (no fork under gevent).

Callers under gevent or eventlet patched after the package was imported (gunicorn
``--preload``): every call gets its own key's window id, and Redis holds exactly the
calls that returned (the concurrency model is decided at each call, not at import).

Over both stores where the subject is the worker or the callers (the PostgreSQL store
refuses eventlet: docs/stores.md); Redis only where it is Redis's connections (a kept
stdlib socket, TLS, a cluster, redis-py's module state) or its outage."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from fault_app import build
from green_callers import assert_each_call_got_its_window, key_of
from helpers import StoreCase, made_apps, stop_process, wait_until
from reads import state_of
from test_faults import TESTS, env_for, runs, worker_process
from test_tls_acl import make_certs

from celery_debounce.testing.redis_cluster import LocalCluster
from celery_debounce.testing.servers import LocalRedis, free_port, server_supports_tls

pytest.importorskip("gevent", reason="the test extra installs gevent")  # declared: CI has it

pytestmark = pytest.mark.usefixtures("store")


def _store_env(store: StoreCase) -> dict[str, str]:
    """fault_app's environment for the store (FAULT_STORE: the windows in PostgreSQL)."""
    url = store.conf.get("debounce_store_url")
    return {"FAULT_STORE": url} if url else {}


def test_a_gevent_worker_runs_windows_and_renews_a_long_runs_claim(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path, store: StoreCase
) -> None:
    log = tmp_path / "worker.log"
    app = build(redis_server, **store.conf)
    made_apps.add(app)
    # Redis only: the fault app's flag; the run waits (gevent-patched sleeps) until deleted
    redis_client.set("block:g", 1)
    env = {"FAULT_DISPATCHER_PROCESS": "1", **_store_env(store)}
    with worker_process(redis_server, log, pool="gevent", extra_env=env):
        calls = [app.tasks["faults.record"].delay("g") for _ in range(3)]
        assert len({c.id for c in calls}) == 1
        wait_until(lambda: runs(redis_client, "g") == [calls[0].id], 15)
        began = time.monotonic()
        while time.monotonic() - began < 3 * 2.0:  # three claim leases (2 s in fault_app)
            assert state_of(app, calls[0].id) == "claimed", (
                "the claim went stale while its run was alive"
            )
            time.sleep(0.25)
        redis_client.delete("block:g")  # Redis only: the fault app's flag
        wait_until(lambda: state_of(app, calls[0].id) == "finished", 15)
        other = app.tasks["faults.record"].delay("h")
        wait_until(lambda: runs(redis_client, "h") == [other.id], 15)
    assert runs(redis_client, "g") == [calls[0].id]  # once
    text = log.read_text()
    assert "ignored under a gevent or eventlet pool" in text, text


@pytest.mark.parametrize(
    "model, warm",
    [
        ("gevent", "warm"),  # a call before patching kept a connection; it reconnects after
        ("gevent", "cold"),  # imported only: the first connection is made after patching
        ("eventlet", "warm"),
        ("gevent", "first"),  # patched before the import: as celery -P gevent does
        ("eventlet", "first"),
    ],
)
def test_greenlets_patched_before_or_after_import_each_get_their_own_reply(
    redis_server: str, redis_client: redis.Redis, store: StoreCase, model: str, warm: str
) -> None:
    if model == "eventlet":
        if store.name == "postgres":
            pytest.skip("the PostgreSQL store refuses eventlet (docs/stores.md)")
        pytest.importorskip("eventlet", reason="the test extra installs eventlet")
    url = store.conf.get("debounce_store_url")
    # redis-py with hiredis checks a connection with select.poll, which eventlet's
    # patching removes: eventlet patched after redis was imported needs the plain parser
    extra = ["--no-hiredis"] if model == "eventlet" and warm != "first" else []
    done = subprocess.run(
        [
            sys.executable,
            str(TESTS / "green_callers.py"),
            model,
            warm,
            f"{redis_server}",
            "30",
            "20",
            *extra,
            *([f"--store={url}"] if url else []),
        ],
        env=env_for(redis_server),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert len(results) == 30 * 20 + (warm == "warm")
    assert_each_call_got_its_window(redis_server, results, conf=store.conf)


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=20)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def _get(conn: _UnixHTTP, key: str) -> tuple[int, str]:
    conn.request("GET", f"/{key}")
    reply = conn.getresponse()
    return reply.status, reply.read().decode()


@contextmanager
def gunicorn(redis_server: str, tmp_path: Path, store: StoreCase) -> Iterator[str]:
    """``gunicorn --preload -k gevent -w 2`` serving tests/green_wsgi.py on a unix socket,
    its windows in ``store``."""
    url = store.conf.get("debounce_store_url")
    pytest.importorskip("gunicorn", reason="the test extra installs gunicorn")
    sock = str(tmp_path / "g.sock")
    log = (tmp_path / "gunicorn.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--preload",
            "-k",
            "gevent",
            "-w",
            "2",
            "--bind",
            f"unix:{sock}",
            "green_wsgi:application",
        ],
        cwd=TESTS,
        env=dict(env_for(redis_server), GREEN_REDIS=redis_server, GREEN_STORE=url or ""),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def answers() -> bool:
            assert proc.poll() is None, (tmp_path / "gunicorn.log").read_text()
            try:
                return _get(_UnixHTTP(sock), "ready")[0] == 200
            except OSError:
                return False

        wait_until(answers, 30, 0.1)
        yield sock
    finally:
        stop_process(proc)
        log.close()


def test_gunicorn_preload_with_gevent_workers_gives_each_request_its_own_replies(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path, store: StoreCase
) -> None:
    clients, requests = 30, 8
    with gunicorn(redis_server, tmp_path, store) as sock:

        def client(i: int) -> list[list[Any]]:
            conn, got = _UnixHTTP(sock), []
            for j in range(requests):
                key = key_of(i, j)
                status, body = _get(conn, key)
                got += (
                    [[key, wid, None] for wid in body.splitlines()]
                    if status == 200
                    else [[key, None, body]] * 3
                )
            return got

        with ThreadPoolExecutor(clients) as pool:
            results = [r for got in pool.map(client, range(clients)) for r in got]
    assert len(results) == clients * requests * 3
    # the master's call at import, the readiness probe's
    assert_each_call_got_its_window(
        redis_server, results, others=("warm", "ready"), conf=store.conf
    )


_BLOCKING_PROBE = """
import json, sys, time
from green_callers import build
from celery_debounce import DebounceOutcomeUnknown
from celery_debounce.store import store_for
import redis
url = sys.argv[1]
task = build(url).tasks["green.debounced"]
task.app.conf.update(json.loads(sys.argv[2]))
def call(key):
    try:
        task.delay(key)
    except DebounceOutcomeUnknown:  # WAIT: no replica acknowledged it
        pass
call("before")
store_for(task.app).client.ping()  # the pool keeps an idle connection with a stdlib socket
from gevent import monkey
monkey.patch_all()
import gevent
redis.Redis.from_url(url + "/0").client_pause(600)  # every command waits 0.6 s
ticks = 0
def ticker():
    global ticks
    while True:
        gevent.sleep(0.005)
        ticks += 1
beat = gevent.spawn(ticker)
gevent.sleep(0.01)
before = ticks
call("after")  # takes the pool's idle connection
print(ticks - before)
"""


@pytest.mark.redis_only("redis-py's connections: a kept stdlib socket, CLIENT PAUSE, WAIT")
@pytest.mark.parametrize("path", ["kept", "per-call", "then-wait"])
def test_a_connection_made_before_patching_does_not_block_the_other_greenlets(
    redis_server: str, redis_client: redis.Redis, path: str
) -> None:
    """A call after patching that takes a connection made before it (a stdlib socket:
    its reads block the whole thread) makes it anew: other greenlets run meanwhile. On
    each path: the thread's kept connection, the pool's checkout of each call (RESP3
    here, as Sentinel's pool: no kept connection), a script then WAIT."""
    conf = {
        "kept": {},
        "then-wait": {"debounce_redis_wait_replicas": 1},
        "per-call": {"debounce_redis_url": f"{redis_server}/0?protocol=3"},
    }[path]
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKING_PROBE, redis_server, json.dumps(conf)],
        env=env_for(redis_server),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # 0.6 s of 5 ms sleeps: about 100 ticks when the call yields, none when it blocks
    assert int(done.stdout.split()[-1]) >= 5, "the call blocked every greenlet"


@pytest.mark.redis_only("a Redis TLS connection (rediss://)")
def test_a_tls_connection_made_before_patching_is_made_anew(
    redis_server: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """The same over TLS (rediss://): the connection's socket is the stdlib's SSLSocket,
    a subclass of its socket (before, only a plain socket was recognised)."""
    if not server_supports_tls():
        pytest.skip("this redis-server was built without TLS")
    certs = make_certs(tmp_path)
    port = free_port()
    with LocalRedis(
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(certs["server.crt"]),
        "--tls-key-file",
        str(certs["server.key"]),
        "--tls-ca-cert-file",
        str(certs["ca.crt"]),
        "--tls-auth-clients",
        "no",
    ) as server:
        url = f"redis://127.0.0.1:{server.port}"
        conf = {
            "debounce_redis_url": f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required"
            f"&ssl_ca_certs={certs['ca.crt']}"
        }
        done = subprocess.run(
            [sys.executable, "-c", _BLOCKING_PROBE, url, json.dumps(conf)],
            env=env_for(url),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 5, "the call blocked every greenlet"


_CLUSTER_PROBE = """
import sys
from celery import Celery
from celery_debounce import DebouncedTask
import celery_debounce.store  # its module lock made before the patching, as --preload does
cluster_url, broker = sys.argv[1], sys.argv[2]
app = Celery("gc", set_as_current=False)
app.conf.update(broker_url=f"{broker}/1", debounce_redis_url=f"{cluster_url}/0",
                debounce_redis_cluster=True, debounce_shards=6, task_ignore_result=True)
@app.task(name="gc.debounced", base=DebouncedTask, shared=False, debounce="1h",
          debounce_max_wait="2h", debounce_key="{0}")
def debounced(key): return None
from gevent import monkey
monkey.patch_all()
import gevent
ids = []
gevent.joinall([gevent.spawn(lambda i=i: ids.append(debounced.delay(i).id)) for i in range(10)])
print(len(set(ids)))
"""


@pytest.mark.cluster
@pytest.mark.redis_only("a Redis Cluster's topology read")
def test_greenlets_patched_after_import_build_a_cluster_store_without_deadlock(
    redis_cluster: LocalCluster, redis_server: str
) -> None:
    """The first calls of a process, from greenlets at once, on a cluster: building the
    store reads the topology (I/O, so the greenlet yields). Before, that ran under
    store_for's lock, made before the patching (a real lock): the next greenlet blocked
    the thread on it, and every greenlet hung (a gunicorn --preload -k gevent worker)."""
    redis_cluster.flushall()
    done = subprocess.run(
        [sys.executable, "-c", _CLUSTER_PROBE, redis_cluster.url, redis_server],
        env=env_for(redis_server),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "10"


@pytest.mark.redis_only("checks the Redis store's module state (store.redis.node)")
@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_a_green_worker_binds_its_module_thread_locals_after_celery_patches(pool: str) -> None:
    """``celery worker -P gevent|eventlet`` patches before it imports the app (celery's
    entry point), so the worker main process's request watch (a ``threading.local``
    subclass bound at import) is a greenlet-local there, and the store's call-time check
    sees the patched socket and thread-local classes."""
    pytest.importorskip(pool, reason="the test extra installs gevent and eventlet")
    probe = (
        "import threading\n"
        "from celery import maybe_patch_concurrency\n"
        f"maybe_patch_concurrency(['celery', '-A', 'x', 'worker', '-P', '{pool}'])\n"
        "import celery_debounce.worker.request as signals\n"
        "import celery_debounce.store.redis.node as node\n"
        "assert signals._Watch.__mro__[1] is threading.local, signals._Watch.__mro__\n"
        "assert threading.local.__module__ != '_thread', threading.local\n"
        "assert node._STD_SOCKET is None and node._STD_LOCAL is None\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


_MARKS_PROBE = """
import faulthandler, sys, threading
faulthandler.dump_traceback_later(5, exit=True)  # a hang (the thread blocked) exits 1
from celery import Celery
# its module lock made before the patching (--preload)
from celery_debounce.worker import retry_queue as marks
from celery_debounce.settings import settings_for
from celery_debounce.store import WindowStore
app = Celery("gm", set_as_current=False)
app.conf.update(debounce_redis_url=sys.argv[1] + "/0", debounce_redis_timeout=1)
store = WindowStore(settings_for(app))
try:
    store.finish_run(0, "before", "SUCCESS")  # nothing listens there: an outage
except Exception as exc:
    error = exc
assert marks.worth_keeping(error), error
from gevent import monkey
monkey.patch_all()
import gevent
def kept(i):
    marks.keep(store, marks.FinishMark(0, f"t{i}", "SUCCESS"), error)
gevent.joinall([gevent.spawn(kept, i) for i in range(20)])
retrying = [t for t in threading.enumerate() if t.name == "debounce-marks"]
print(marks.pending(), len(retrying))
"""


@pytest.mark.redis_only("the outage is an unreachable Redis")
def test_greenlets_patched_after_import_keep_failed_marks_without_deadlock() -> None:
    """Greenlets keep marks at once while the windows' Redis is down (a gevent worker's
    runs): the first starts the retry thread, and a patched ``Thread.start`` yields to
    the hub. Before, that ran under marks' lock, made before the patching (a real lock):
    the next greenlet blocked the thread on it, and every greenlet hung. One retry
    thread is started, however many greenlets find none running."""
    unreachable = f"redis://127.0.0.1:{free_port()}"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MARKS_PROBE, unreachable],
            env=env_for(unreachable),
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except subprocess.TimeoutExpired:  # the child is killed
        pytest.fail("keeping marks from greenlets hung")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["20", "1"], done.stdout
