"""The implementations the contract suite runs against, one ``Harness`` each.

A harness builds fresh stores on an emptied server (``build``, with settings
overrides such as a short claim lease) and, where it can, makes the next reply of
an operation be lost after the operation ran (``lose_next_reply``). Everything that
knows it is Redis or PostgreSQL (scripts, keys, schemas, proxies, clients) is here,
never in the cases.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

import pytest
import redis
from celery import Celery
from fault_proxy import FaultProxy, evalsha_of
from pg_proxy import PgProxy

from celery_debounce.settings import Settings
from celery_debounce.store import WindowStore
from celery_debounce.store.api import Store

#: The store contract's operations whose reply a harness can lose, and the script each
#: one is on Redis.
_SCRIPT_OF = {"gate": "gate", "claim": "claim", "take": "take", "cancel": "cancel"}


@dataclass
class Harness:
    """One implementation under the contract."""

    name: str
    _build: Callable[[dict[str, Any]], Store]
    #: arm a lost reply: ``(store, operation, then_refuse)``; None where it cannot
    _lose: Callable[[Store, str, bool], None] | None = None
    #: ``(down)``: refuse every connection (True) or serve again (False); None: cannot
    _outage: Callable[[bool], None] | None = None
    #: why the implementation does not promise at-most-once (None: it does)
    resends_after_a_lost_reply: str | None = None
    #: what ends a built store's connections (each store's ``close``: its Redis client,
    #: the PostgreSQL store's pool)
    _close: Callable[[Any], None] = lambda store: store.close()
    #: a direct connection to the server holding the stores' state, with its schema
    #: (PostgreSQL: a test reading the tables never goes through a pooler)
    direct_url: str | None = None
    built: list[Store] = field(default_factory=list)

    def build(self, **overrides: Any) -> Store:
        """A fresh store (``Settings`` fields overridden), on the emptied server."""
        store = self._build(overrides)
        self.built.append(store)
        return store

    def lose_next_reply(self, store: Store, operation: str, then_refuse: bool = False) -> None:
        """The next ``operation`` on ``store`` runs, and its reply is lost; with
        ``then_refuse``, the server is unreachable from then on (until ``outage(False)``)."""
        if self._lose is None:
            pytest.skip(f"{self.name}: no way to lose a reply in this harness")
        self._lose(store, operation, then_refuse)

    def outage(self, down: bool) -> None:
        """Make the server unreachable (``down``) or reachable again."""
        if self._outage is None:
            pytest.skip(f"{self.name}: no way to make the server unreachable in this harness")
        self._outage(down)

    def close(self) -> None:
        for store in self.built:
            self._close(store)


def _settings(conf: dict[str, Any], overrides: dict[str, Any]) -> Settings:
    app = Celery("contract", set_as_current=False)
    app.conf.update(conf)
    return replace(Settings.from_app(app), **overrides)


def _fakeredis() -> Harness:
    import fakeredis

    server = fakeredis.FakeServer()

    def build(overrides: dict[str, Any]) -> WindowStore:
        client = fakeredis.FakeRedis(server=server)
        return WindowStore(
            _settings({"debounce_redis_url": "redis://fake"}, overrides), client=client
        )

    def outage(down: bool) -> None:
        server.connected = not down

    return Harness(
        "fakeredis",
        build,
        _outage=outage,
        resends_after_a_lost_reply=(
            "a client of another kind (fakeredis) goes through the generic Transport, whose "
            "client may resend a script after a lost reply (store/redis/transport.py)"
        ),
    )


def _single(request: pytest.FixtureRequest) -> Harness:
    url: str = request.getfixturevalue("redis_server")
    redis.Redis.from_url(f"{url}/0").flushall()
    proxy = FaultProxy(int(url.rsplit(":", 1)[1]))
    request.addfinalizer(proxy.close)

    def build(overrides: dict[str, Any]) -> WindowStore:
        return WindowStore(
            _settings(
                {"debounce_redis_url": f"{proxy.url}/0", "debounce_redis_timeout": 1.0}, overrides
            )
        )

    def lose(store: Store, operation: str, then_refuse: bool) -> None:
        assert isinstance(store, WindowStore)
        sha = store.scripts[_SCRIPT_OF[operation]].sha
        proxy.arm("drop", evalsha_of(sha), then_refuse=then_refuse)

    def outage(down: bool) -> None:
        if down:
            proxy.refuse()
        else:
            proxy.disarm()

    return Harness("redis", build, lose, outage)


def _cluster(request: pytest.FixtureRequest) -> Harness:
    cluster = request.getfixturevalue("redis_cluster")
    cluster.flushall()

    def build(overrides: dict[str, Any]) -> WindowStore:
        return WindowStore(
            _settings(
                {
                    "debounce_redis_url": f"{cluster.url}/0",
                    "debounce_redis_cluster": True,
                    "debounce_shards": 3,
                },
                overrides,
            )
        )

    # lost replies on a cluster: tests/system/test_cluster_faults.py (a proxy per node is not
    # built here)
    return Harness("cluster", build)


#: The PostgreSQL functions whose reply a harness can lose, by operation.
_FUNCTION_OF = {
    "gate": b"debounce_gate",
    "claim": b"debounce_claim",
    "take": b"debounce_take",
    "cancel": b"debounce_cancel",
}


def _postgres(request: pytest.FixtureRequest, pooled: bool = False) -> Harness:
    """The PostgreSQL store on the session's private server, through a proxy that can
    lose a reply or refuse connections; each test in a fresh schema (``search_path``),
    dropped afterwards. ``pooled``: through PgBouncer in transaction mode as well (the
    schema named by the store's setting: a pooler takes no ``options``)."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    from celery_debounce.store.postgres import PostgresStore
    from celery_debounce.store.postgres.app import AppPostgresStore

    server = request.getfixturevalue("postgres_server")
    schema = f"contract_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')  # a name made here, not user data

    def drop_schema() -> None:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

    request.addfinalizer(drop_schema)
    direct = make_conninfo(server.url(), options=f"-c search_path={schema}")
    if pooled:
        bouncer = request.getfixturevalue("pgbouncer_server")
        proxy = PgProxy(bouncer.port)
        url = make_conninfo(bouncer.url(), port=proxy.port)
    else:
        proxy = PgProxy(server.port)
        url = make_conninfo(direct, port=proxy.port)
    request.addfinalizer(proxy.close)
    with PostgresStore(url if pooled else direct, schema=schema) as migrating:
        migrating.migrate()

    # behind PgBouncer a dispatcher LISTENs on a direct connection, as documented
    listen = {}
    if pooled:
        options = quote(f"-c search_path={schema}")
        listen["postgres_listen_url"] = f"{server.url()}?options={options}"

    def build(overrides: dict[str, Any]) -> Store:
        settings = _settings({"debounce_redis_url": "redis://unused"}, {**listen, **overrides})
        # what store_for builds for an app
        store: Store = AppPostgresStore(url, settings, timeout=1.0, schema=schema)
        return store

    def lose(store: Store, operation: str, then_refuse: bool) -> None:
        proxy.drop_next(_FUNCTION_OF[operation], then_refuse)

    def outage(down: bool) -> None:
        if down:
            proxy.refuse()
        else:
            proxy.disarm()

    name = "pgbouncer" if pooled else "postgres"
    return Harness(name, build, lose, outage, direct_url=direct)


def harness_named(name: str, request: pytest.FixtureRequest) -> Harness:
    """The harness of implementation ``name`` (also tests/store/test_gate_model.py's)."""
    return {
        "fakeredis": lambda: _fakeredis(),
        "redis": lambda: _single(request),
        "cluster": lambda: _cluster(request),
        "postgres": lambda: _postgres(request),
        "pgbouncer": lambda: _postgres(request, pooled=True),
    }[name]()


@pytest.fixture(
    params=[
        "fakeredis",
        "redis",
        pytest.param("cluster", marks=pytest.mark.cluster),
        "postgres",
        pytest.param("pgbouncer", marks=pytest.mark.pgbouncer),
    ]
)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """Each implementation of the store contract in turn."""
    made = harness_named(request.param, request)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def store(harness: Harness) -> Store:
    """A fresh store of the implementation under test, with the default settings."""
    return harness.build()
