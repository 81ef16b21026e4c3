"""Shared fixtures: a real redis-server for the session, fresh apps, real workers."""

from __future__ import annotations

import gc
import importlib
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from inspect import signature
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from celery import Celery
from fault_proxy import FaultProxy
from helpers import Broker, StoreCase, made_apps, make_app
from rabbitmq_node import SKIP_ENV, RabbitNode, rabbitmq_server_path

from celery_debounce.settings import Settings
from celery_debounce.store import WindowStore
from celery_debounce.testing.pgbouncer import LocalPgBouncer, find_pgbouncer
from celery_debounce.testing.postgres import LocalPostgres, find_postgres_bindir
from celery_debounce.testing.redis_cluster import LocalCluster
from celery_debounce.testing.servers import LocalRedis


@pytest.fixture(scope="session")
def node_package() -> Path:
    """clients/node built from this checkout (tests/node_producer.py)."""
    from node_producer import build_node_package

    return build_node_package()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a real redis-server (started here unless $DEBOUNCE_TEST_REDIS_URL is set)."""
    url = os.environ.get("DEBOUNCE_TEST_REDIS_URL")
    if url:
        yield url.rstrip("/")
        return
    with LocalRedis() as server:
        yield server.url
        # AsyncResults left for the collector unsubscribe from the result backend when
        # they go; on Celery 5.3-5.6 one that goes after the server stopped retries its
        # reconnect for about 20 s each (the lowest corner's exit took a minute)
        gc.collect()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The built wheel: $CELERY_DEBOUNCE_WHEEL, or ``python -m build --wheel`` of the checkout."""
    given = os.environ.get("CELERY_DEBOUNCE_WHEEL")
    if given:
        assert Path(given).is_file(), f"CELERY_DEBOUNCE_WHEEL={given}: no such file"
        yield Path(given)
        return
    out = tmp_path_factory.mktemp("dist")
    checkout = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(checkout)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("celery_debounced-*.whl")
    yield built


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A real Redis Cluster on loopback: 3 masters, 3 replicas, started once per session
    (for the tests marked ``cluster``). Tests that kill or move things put it back."""
    with LocalCluster(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[LocalPostgres]:
    """A private PostgreSQL server for the session (celery_debounce/testing/postgres.py),
    stopped and removed at the end. Without the server binaries the tests skip, except
    in CI ($CI set), where they fail: scripts/ensure-postgres.sh installs them."""
    if find_postgres_bindir() is None:
        reason = "PostgreSQL server binaries not installed (scripts/ensure-postgres.sh)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: in CI the PostgreSQL tests must run")
        pytest.skip(reason)
    server = LocalPostgres()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def durable_server() -> Iterator[LocalPostgres]:
    """A private PostgreSQL server, one per test, whose commits wait for a synchronous
    standby when one is named (tests/store/postgres/test_postgres_deployed.py, the Node producer's
    tests on PostgreSQL)."""
    if find_postgres_bindir() is None:
        pytest.skip("PostgreSQL server binaries not installed (scripts/ensure-postgres.sh)")
    with LocalPostgres(settings={"synchronous_commit": "on"}) as server:
        yield server


def _psql(url: str, query: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query)


@pytest.fixture
def password_server() -> Iterator[LocalPostgres]:
    """A private server where role ``pw`` (password ``right``) must give its password and
    role ``shut`` may not connect to database ``postgres``."""
    if find_postgres_bindir() is None:
        pytest.skip("PostgreSQL server binaries not installed (scripts/ensure-postgres.sh)")
    with LocalPostgres() as server:
        _psql(server.url(), "CREATE ROLE pw LOGIN PASSWORD 'right'")
        _psql(server.url(), "CREATE ROLE shut LOGIN")
        _psql(server.url(), "REVOKE CONNECT ON DATABASE postgres FROM PUBLIC")
        _psql(server.url(), "GRANT CONNECT ON DATABASE postgres TO pw")
        hba = server.dir / "data" / "pg_hba.conf"
        hba.write_text(
            "host all pw 127.0.0.1/32 scram-sha-256\n"
            "host all pw ::1/128 scram-sha-256\n" + hba.read_text()
        )
        _psql(server.url(), "SELECT pg_reload_conf()")
        yield server


@pytest.fixture(scope="session")
def pgbouncer_server(postgres_server: LocalPostgres) -> Iterator[LocalPgBouncer]:
    """PgBouncer in transaction mode in front of the session's PostgreSQL, as shops
    deploy it (celery_debounce/testing/pgbouncer.py). Skips without the binary, except
    in CI, where it fails: scripts/ensure-postgres.sh installs it."""
    if find_pgbouncer() is None:
        reason = "pgbouncer not installed (scripts/ensure-postgres.sh)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: in CI the PgBouncer tests must run")
        pytest.skip(reason)
    bouncer = LocalPgBouncer(postgres_server)
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.cleanup()


@pytest.fixture(scope="session")
def rabbitmq_server() -> Iterator[RabbitNode]:
    """A private RabbitMQ node for the session (tests/rabbitmq_node.py), stopped at the end.

    When rabbitmq-server is not installed the test fails (CI installs it with
    scripts/ensure-rabbitmq.sh), unless $DEBOUNCE_SKIP_RABBITMQ is set: then it skips.
    """
    if rabbitmq_server_path() is None:
        reason = (
            f"rabbitmq-server is not installed (scripts/ensure-rabbitmq.sh installs it; "
            f"{SKIP_ENV} is set)"
        )
        if os.environ.get(SKIP_ENV):
            pytest.skip(reason)
        pytest.fail(
            f"rabbitmq-server is not installed: run scripts/ensure-rabbitmq.sh, or set "
            f"{SKIP_ENV}=1 to skip the rabbitmq tests"
        )
    node = RabbitNode()
    try:
        node.start()
        yield node
    finally:
        node.cleanup()


@pytest.fixture(params=["redis", pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """The same scenario on each broker: the session's redis-server (DB 1, as make_app
    puts it) and the session's RabbitMQ node (``rabbitmq_server``; a default queue of
    the test's own). Windows and results stay in Redis. Build the app with
    ``app_factory(**broker.conf)``; the RabbitMQ case carries the ``rabbitmq`` mark."""
    if request.param == "redis":
        yield Broker("redis")
        return
    node: RabbitNode = request.getfixturevalue("rabbitmq_server")
    yield Broker("rabbitmq", node.app_conf())
    if not node.accepts_amqp():  # started again after a test that stopped it
        node.start()


#: The ``store`` fixture's cases (ids exactly these).
STORES = ("redis", "postgres")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "redis_only(reason): in a module over every store (usefixtures('store')), a test "
        "that needs what only Redis has runs on the redis case alone",
    )
    config.addinivalue_line(
        "markers",
        "postgres_xfail(reason): the test's postgres case of the store fixture is a known "
        "bug of the PostgreSQL store (xfail, strict)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize this conftest's ``store`` fixture (not a folder's own ``store``, such
    as tests/store/contract's): ``redis`` and ``postgres``; ``redis`` alone for a test
    marked ``redis_only``, or whose app is not built by ``app_factory``, ``ops`` or on
    the ``store`` argument."""
    if "store" not in metafunc.fixturenames:
        return
    defs = metafunc._arg2fixturedefs.get("store")  # the closest definition last
    func = defs[-1].func if defs else None
    if func is None or func.__module__ != __name__ or func.__name__ != "store":
        return
    # a test whose app is not app_factory's (nor made with **store.conf) is Redis's alone
    builds = (
        "app_factory" in metafunc.fixturenames
        or "ops" in metafunc.fixturenames
        or "store" in signature(metafunc.function).parameters
    )
    only_redis = not builds or metafunc.definition.get_closest_marker("redis_only") is not None
    metafunc.parametrize("store", STORES[:1] if only_redis else STORES, indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The postgres case of a test (or of one of its parametrized rows) marked
    ``postgres_xfail(reason)`` is expected to fail: a known bug of the PostgreSQL store."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("store") != "postgres":
            continue
        marker = item.get_closest_marker("postgres_xfail")
        if marker is not None:
            reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "")
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"PostgreSQL store: {reason}"))


class PostgresStage:
    """The stage tests' PostgreSQL database (one per session, migrated once): each test
    starts from empty windows (every table but the schema's version truncated), as
    ``redis_client`` flushes Redis. A schema an app names (``debounce_postgres_schema``,
    or a ``debounce_key_prefix`` other than the default) is migrated on first use."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.schemas: set[str | None] = set()

    def migrate(self, schema: str | None) -> None:
        import psycopg

        from celery_debounce.store.postgres import PostgresStore

        if schema in self.schemas:
            return
        if schema is not None:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')  # a test's own name
        with PostgresStore(self.url, schema=schema) as store:
            store.migrate()
        self.schemas.add(schema)

    def prepare(self, conf: dict[str, Any]) -> None:
        """Migrate the schema an app built with ``conf`` uses, if new."""
        schema = conf.get("debounce_postgres_schema")
        prefix = conf.get("debounce_key_prefix")
        if schema is None and prefix not in (None, "debounce"):
            schema = prefix
        self.migrate(schema)

    def clear(self) -> None:
        """Empty every table of every schema used (the schema's version kept)."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            names = [
                f'"{schema}"."{table}"'
                for schema, table in conn.execute(
                    "SELECT schemaname, tablename FROM pg_tables "
                    "WHERE tablename LIKE 'debounce\\_%' AND tablename <> 'debounce_schema' "
                    "AND schemaname NOT IN ('pg_catalog', 'information_schema')"
                ).fetchall()
            ]
            if names:
                conn.execute(f"TRUNCATE {', '.join(names)} RESTART IDENTITY")


@pytest.fixture(scope="session")
def postgres_stage(postgres_server: LocalPostgres) -> Iterator[PostgresStage]:
    """A migrated database of its own on the session's PostgreSQL (``store`` fixture)."""
    import psycopg

    name = f"stage_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a name made here, not user data
    stage = PostgresStage(postgres_server.url(name))
    stage.migrate(None)
    yield stage
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def store(request: pytest.FixtureRequest, redis_client: redis.Redis) -> Iterator[StoreCase]:
    """The store an app's windows are in: ``redis`` (the session's redis-server, DB 0, as
    make_app puts them) or ``postgres`` (the session's private PostgreSQL, a database of
    the stage tests' own, emptied before each test). Broker and results stay on Redis.
    ``app_factory`` and ``app`` build the app on it; ``make_app(..., **store.conf)``
    too. Opt a module in with ``pytestmark = pytest.mark.usefixtures("store")``; a test
    that needs Redis itself is marked ``redis_only``; a known PostgreSQL bug,
    ``postgres_xfail(reason)``. Without the PostgreSQL binaries the postgres case skips,
    except in CI ($CI set), where it fails (``postgres_server``)."""
    name = getattr(request, "param", "redis")
    if name == "redis":
        yield StoreCase("redis")
        return
    stage: PostgresStage = request.getfixturevalue("postgres_stage")
    stage.clear()
    made_apps.clear()
    try:
        yield StoreCase("postgres", {"debounce_store_url": stage.url, "debounce_redis_url": None})
    finally:
        # each app's pool goes with its test (the server takes 100 connections)
        for made in list(made_apps):
            cached = getattr(made, "_debounce_store", None)
            if cached is not None and cached[0] == os.getpid():
                close = getattr(cached[1], "close", None)
                if close is not None:
                    close()
        made_apps.clear()


@pytest.fixture
def fault_proxy(redis_server: str) -> Iterator[FaultProxy]:
    """A fault-injection proxy (tests/fault_proxy.py) in front of the session's redis-server."""
    proxy = FaultProxy(int(redis_server.rsplit(":", 1)[1]))
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def redis_client(redis_server: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(f"{redis_server}/0")
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def app_factory(
    redis_client: redis.Redis, redis_server: str, request: pytest.FixtureRequest
) -> Callable[..., Celery]:
    """Build a fresh Celery app on the test Redis (window DB 0, broker 1, results 2); in
    a test that uses the ``store`` fixture, the windows in that case's store."""
    case: StoreCase | None = None
    if "store" in request.fixturenames:
        case = request.getfixturevalue("store")
    stage: PostgresStage | None = None
    if case is not None and case.name == "postgres":
        stage = request.getfixturevalue("postgres_stage")

    def factory(**conf: Any) -> Celery:
        if case is None:
            return make_app(redis_server, **conf)
        if stage is not None:
            stage.prepare(conf)
        return make_app(redis_server, **{**case.conf, **conf})

    return factory


@pytest.fixture
def app(app_factory: Callable[..., Celery]) -> Celery:
    return app_factory()


@pytest.fixture(params=["fakeredis", "redis-server"])
def backend(request: pytest.FixtureRequest) -> Iterator[WindowStore]:
    """A bare WindowStore for script-level tests, on fakeredis and on the real redis-server."""
    app = Celery("scripts", set_as_current=False)
    if request.param == "fakeredis":
        import fakeredis

        app.conf.debounce_redis_url = "redis://fake"
        client: redis.Redis = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        url = request.getfixturevalue("redis_server")
        request.getfixturevalue("redis_client")  # flushes
        app.conf.debounce_redis_url = f"{url}/0"
        client = redis.Redis.from_url(f"{url}/0")
    yield WindowStore(Settings.from_app(app), client=client)
    client.close()


@pytest.fixture
def ops(
    redis_server: str, redis_client: redis.Redis, request: pytest.FixtureRequest
) -> Iterator[ModuleType]:
    """tests/ops_app.py on the test Redis (imported once; state flushed per test); in a
    test that uses the ``store`` fixture, its windows in that case's store
    ($DEBOUNCE_OPS_STORE, subprocesses too): on PostgreSQL imported again per test (the
    store fixture closes the app's pool when the test ends)."""
    os.environ["DEBOUNCE_OPS_REDIS"] = redis_server
    url = None
    if "store" in request.fixturenames:
        url = request.getfixturevalue("store").conf.get("debounce_store_url")
    if url:
        os.environ["DEBOUNCE_OPS_STORE"] = url
    else:
        os.environ.pop("DEBOUNCE_OPS_STORE", None)
    module = sys.modules.get("ops_app")
    if module is None:
        module = importlib.import_module("ops_app")
    elif url or module._store:
        module = importlib.reload(module)
    module.runs.clear()
    yield module
    os.environ.pop("DEBOUNCE_OPS_STORE", None)
