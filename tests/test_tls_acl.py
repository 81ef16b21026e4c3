"""TLS (rediss://, a self-signed CA made here with openssl) and a least-privilege ACL user.

The ACL line is the one documented in docs/guarantees.md: the package's Redis user
needs only these commands, keys under ``debounce:*`` and the ``debounce:wake`` channel.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import make_app, running_worker, wait_until

from celery_debounce import DebounceBackendError, DebouncedTask
from celery_debounce.local_redis import LocalRedis, free_port
from celery_debounce.windows import list_windows

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")

#: Everything the package runs on its Redis: EVALSHA (+ SCRIPT LOAD after a restart or
#: a SCRIPT FLUSH), the commands inside its Lua scripts, inspect's reads, and the
#: dispatcher's wake subscription and health-check PING.
ACL_RULES = (
    "resetkeys ~debounce:* resetchannels &debounce:wake -@all "
    "+evalsha +script|load "
    "+time +exists +del +rename +pexpire +persist "
    "+hget +hmget +hset +hdel +hincrby "
    "+zadd +zrem +zrange +zrangebyscore "
    "+publish +subscribe +unsubscribe +ping"
)


def make_certs(where: Path) -> dict[str, Path]:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    (where / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "1", "-subj", "/CN=celery-debounce test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "1", "-extfile", "san.ext")
    return {name: where / f"{name}" for name in ("ca.crt", "server.crt", "server.key")}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    tls_port = free_port()
    server = LocalRedis(
        "--tls-port", str(tls_port), "--tls-cert-file", str(certs["server.crt"]),
        "--tls-key-file", str(certs["server.key"]), "--tls-ca-cert-file", str(certs["ca.crt"]),
        "--tls-auth-clients", "no",
    )
    with server:
        admin = redis.Redis(port=server.port)
        admin.execute_command("ACL", "SETUSER", "debouncer", "reset", "on", ">s3cret",
                              *ACL_RULES.split())
        yield {"server": server, "tls_port": tls_port, "ca": certs["ca.crt"], "admin": admin}


def tls_url(tls: dict[str, Any], user: str = "debouncer:s3cret") -> str:
    return (f"rediss://{user}@127.0.0.1:{tls['tls_port']}/0"
            f"?ssl_cert_reqs=required&ssl_ca_certs={tls['ca']}")


def test_debounced_tasks_work_over_tls_with_the_minimal_acl_user(
    tls_server: dict[str, Any]
) -> None:
    tls_server["admin"].flushall()
    server = tls_server["server"]
    app = make_app(server.url, debounce_redis_url=tls_url(tls_server),
                   debounce_history_ttl="500ms")
    runs: list[int] = []

    @app.task(base=DebouncedTask, shared=False, debounce="200ms", debounce_key="k:{0}",
              debounce_max_wait="2s")
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
    # the history expires: nothing is left behind
    admin = tls_server["admin"]
    wait_until(lambda: not list(admin.scan_iter(match="debounce:*")), 10)
    # a restarted server forgets scripts: SCRIPT LOAD is allowed, so calls still work
    admin.script_flush()
    assert work.delay(7).id


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
    tls_server: dict[str, Any]
) -> None:
    for url in (tls_url(tls_server, "debouncer:wrong"),
                f"redis://127.0.0.1:{tls_server['tls_port']}/0"):
        app = make_app(tls_server["server"].url, debounce_redis_url=url,
                       debounce_redis_timeout=1)

        @app.task(base=DebouncedTask, shared=False, debounce="1s", debounce_max_wait="1m")
        def task() -> None:
            pass

        with pytest.raises(DebounceBackendError):
            task.delay()
