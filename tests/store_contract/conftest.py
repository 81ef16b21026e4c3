"""The implementations the contract suite runs against, one ``Harness`` each.

A harness builds fresh stores on an emptied server (``build``, with settings
overrides such as a short claim lease) and, where it can, makes the next reply of
an operation be lost after the operation ran (``lose_next_reply``). Everything that
knows it is Redis (scripts, keys, proxies, clients) is here, never in the cases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import redis
from celery import Celery
from fault_proxy import FaultProxy, evalsha_of

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
    _build: Callable[[dict[str, Any]], WindowStore]
    #: arm a lost reply: ``(store, operation)``; None where the harness cannot
    _lose: Callable[[WindowStore, str], None] | None = None
    #: ``(down)``: refuse every connection (True) or serve again (False); None: cannot
    _outage: Callable[[bool], None] | None = None
    #: why the implementation does not promise at-most-once (None: it does)
    resends_after_a_lost_reply: str | None = None
    built: list[WindowStore] = field(default_factory=list)

    def build(self, **overrides: Any) -> Store:
        """A fresh store (``Settings`` fields overridden), on the emptied server."""
        store = self._build(overrides)
        self.built.append(store)
        return store

    def lose_next_reply(self, store: Store, operation: str) -> None:
        """The next ``operation`` on ``store`` runs, and its reply is lost."""
        if self._lose is None:
            pytest.skip(f"{self.name}: no way to lose a reply in this harness")
        assert isinstance(store, WindowStore)
        self._lose(store, operation)

    def outage(self, down: bool) -> None:
        """Make the server unreachable (``down``) or reachable again."""
        if self._outage is None:
            pytest.skip(f"{self.name}: no way to make the server unreachable in this harness")
        self._outage(down)

    def close(self) -> None:
        for store in self.built:
            store.client.close()


def _settings(conf: dict[str, Any], overrides: dict[str, Any]) -> Settings:
    app = Celery("contract", set_as_current=False)
    app.conf.update(conf)
    return replace(Settings.from_app(app), **overrides)


def _fakeredis() -> Harness:
    import fakeredis

    server = fakeredis.FakeServer()

    def build(overrides: dict[str, Any]) -> WindowStore:
        client = fakeredis.FakeRedis(server=server)
        return WindowStore(_settings({"debounce_redis_url": "redis://fake"}, overrides),
                           client=client)

    def outage(down: bool) -> None:
        server.connected = not down

    return Harness("fakeredis", build, _outage=outage, resends_after_a_lost_reply=(
        "a client of another kind (fakeredis) goes through the generic Transport, whose "
        "client may resend a script after a lost reply (store/transport.py)"))


def _single(request: pytest.FixtureRequest) -> Harness:
    url: str = request.getfixturevalue("redis_server")
    redis.Redis.from_url(f"{url}/0").flushall()
    proxy = FaultProxy(int(url.rsplit(":", 1)[1]))
    request.addfinalizer(proxy.close)

    def build(overrides: dict[str, Any]) -> WindowStore:
        return WindowStore(_settings({"debounce_redis_url": f"{proxy.url}/0",
                                      "debounce_redis_timeout": 1.0}, overrides))

    def lose(store: WindowStore, operation: str) -> None:
        proxy.arm("drop", evalsha_of(store.scripts[_SCRIPT_OF[operation]].sha))

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
        return WindowStore(_settings({"debounce_redis_url": f"{cluster.url}/0",
                                      "debounce_redis_cluster": True,
                                      "debounce_shards": 3}, overrides))

    # lost replies on a cluster: tests/test_cluster_faults.py (a proxy per node is not
    # built here)
    return Harness("cluster", build)


@pytest.fixture(params=[
    "fakeredis",
    "redis",
    pytest.param("cluster", marks=pytest.mark.cluster),
])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """Each implementation of the store contract in turn."""
    made = {"fakeredis": lambda: _fakeredis(), "redis": lambda: _single(request),
            "cluster": lambda: _cluster(request)}[request.param]()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def store(harness: Harness) -> Store:
    """A fresh store of the implementation under test, with the default settings."""
    return harness.build()
