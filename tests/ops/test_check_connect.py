"""``celery debounce check --connect``: at deploy time it reaches the store and names
each problem by kind, exit 1; exit 0 says what it reached. On Redis and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_debounce.testing.servers import LocalRedis, free_port

TESTS = Path(__file__).parents[1]


def check(url: str, prefix: str = "debounce", *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CONNECT_STORE_URL": url,
        "CONNECT_PREFIX": prefix,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "connect_app", "debounce", "check", "--connect",
         *extra],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def problems(url: str, prefix: str = "debounce") -> dict[str, str]:
    done = check(url, prefix, "-j")
    found = json.loads(done.stdout)
    assert (done.returncode == 0) is found["ok"], done.stdout + done.stderr
    return {p["where"]: p["message"] for p in found["problems"]}


@pytest.fixture(scope="module")
def private_redis() -> Iterator[LocalRedis]:
    """A redis-server of its own: what other tests leave on the shared one is another
    deployment's prefix."""
    import redis

    with LocalRedis() as server:
        redis.Redis.from_url(server.url).config_set("requirepass", "sesame")
        yield server


def test_a_reachable_redis_is_named_and_a_new_prefix_is_fine(private_redis: LocalRedis) -> None:
    import redis

    url = f"redis://:sesame@127.0.0.1:{private_redis.port}"
    redis.Redis.from_url(url).flushall()
    done = check(url)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"127.0.0.1:{private_redis.port}" in done.stdout
    assert "nothing uses key prefix 'debounce' yet" in done.stdout
    assert "sesame" not in done.stdout


def test_redis_problems_are_named_by_kind(private_redis: LocalRedis) -> None:
    import redis

    url = f"redis://:sesame@127.0.0.1:{private_redis.port}"
    client = redis.Redis.from_url(url)
    client.flushall()
    # a deployment of prefix 'prod' took windows just now
    client.hset("prod:layouts", "node:1", int(time.time() * 1000))
    assert problems(url, "prod") == {}
    found = problems(url, "prdo")
    assert list(found) == ["store/key prefix"]
    assert "'prdo' is used by nothing" in found["store/key prefix"]
    assert "'prod'" in found["store/key prefix"]
    wrong = f"redis://:open@127.0.0.1:{private_redis.port}"
    assert list(problems(wrong)) == ["store/authentication"]
    assert list(problems(f"redis://127.0.0.1:{free_port()}")) == ["store/unreachable"]


@pytest.fixture
def pg(postgres_server: object) -> Iterator[str]:
    """The session's PostgreSQL server, its URL; schemas made here are dropped after."""
    import psycopg

    url = postgres_server.url()  # type: ignore[attr-defined]
    yield url
    with psycopg.connect(url, autocommit=True) as conn:
        for (name,) in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'cc\\_%'"
        ).fetchall():
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')  # names made here
        conn.execute("DROP ROLE IF EXISTS cc_limited")


def _migrated(url: str, prefix: str, windows: int = 0) -> None:
    from celery import Celery

    from celery_debounce.settings import Settings
    from celery_debounce.store import build_store

    app = Celery("m", set_as_current=False)
    app.conf.update(debounce_store_url=url, debounce_key_prefix=prefix)
    store = build_store(Settings.from_app(app))
    try:
        store.migrate()  # type: ignore[attr-defined]
        for n in range(windows):
            from test_postgres_store import call

            store.gate(call(f"t:{n}"))
    finally:
        store.close()  # type: ignore[attr-defined]


def test_postgres_problems_are_named_by_kind(pg: str) -> None:
    """A migrated schema in use passes and says what it reached; an unmigrated one, a
    misspelt prefix beside a deployment, an unknown role, a role without the grants and
    no server at all are each named."""
    import psycopg

    from celery_debounce.store.postgres.schema import SCHEMA_VERSION

    live, empty = f"cc_{uuid.uuid4().hex[:8]}", f"cc_{uuid.uuid4().hex[:8]}"
    _migrated(pg, live, windows=1)
    done = check(pg, live)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"schema '{live}' version {SCHEMA_VERSION}" in done.stdout
        and "1 open window" in done.stdout
    )

    missing = problems(pg, "cc_typo")
    assert list(missing) == ["store/schema", "store/key prefix"], missing
    assert "debounce migrate" in missing["store/schema"]
    assert f"'{live}'" in missing["store/key prefix"]

    _migrated(pg, empty)
    unused = problems(pg, empty)
    assert list(unused) == ["store/key prefix"]
    assert "is used by nothing" in unused["store/key prefix"]

    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute("CREATE ROLE cc_limited LOGIN")
        conn.execute(f'GRANT USAGE ON SCHEMA "{live}" TO cc_limited')  # no table, no function
    limited = pg.replace("//debounce@", "//cc_limited@")
    rights = problems(limited, live)
    assert list(rights) == ["store/privileges"], rights
    assert "permission denied" in rights["store/privileges"]
    assert "--grant-to" in rights["store/privileges"]
    with psycopg.connect(pg, autocommit=True) as conn:  # the version readable, no more
        conn.execute(f'GRANT SELECT ON "{live}".debounce_schema TO cc_limited')
    rights = problems(limited, live)
    assert list(rights) == ["store/privileges"], rights
    assert "table debounce_open" in rights["store/privileges"]
    assert "--grant-to cc_limited" in rights["store/privileges"]

    assert list(problems(pg.replace("//debounce@", "//nobody@"), live)) == ["store/authentication"]
    port = pg.rsplit(":", 1)[1].split("/")[0]
    assert list(problems(pg.replace(f":{port}/", f":{free_port()}/"), live)) == [
        "store/unreachable"
    ]
