"""The PostgreSQL store behind PgBouncer in transaction mode, as shops deploy it: a client's
server connection is another client's between transactions, so the store keeps nothing on
a session (no prepared statement, no setting, no ``LISTEN``).

A bouncer of one server connection makes every client share it: what one client left on
the session, the next one meets."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import psycopg
import pytest
from celery import Celery
from helpers import wait_until
from pg_proxy import PgProxy
from test_postgres_store import call

from celery_debounce.settings import Settings
from celery_debounce.store.domain import OutcomeUnknown, StoreUnavailable
from celery_debounce.store.postgres import PostgresStore
from celery_debounce.store.postgres.wake import PostgresWakeListener
from celery_debounce.store.results import GateResult
from celery_debounce.testing.pgbouncer import LocalPgBouncer
from celery_debounce.testing.postgres import LocalPostgres

pytestmark = [pytest.mark.timeout(90), pytest.mark.pgbouncer]


@pytest.fixture
def bouncer(postgres_server: LocalPostgres) -> Iterator[LocalPgBouncer]:
    """A PgBouncer of its own with ONE server connection: every client shares it."""
    pytest.importorskip("psycopg")
    from celery_debounce.testing.pgbouncer import find_pgbouncer

    if find_pgbouncer() is None:
        reason = "pgbouncer not installed (scripts/ensure-postgres.sh)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: in CI the PgBouncer tests must run")
        pytest.skip(reason)
    with LocalPgBouncer(postgres_server, pool_size=1) as made:
        yield made


@pytest.fixture
def schema(postgres_server: LocalPostgres) -> Iterator[str]:
    name = f"b_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')  # a name made here


def settings_for(url: str, schema: str, **conf: object) -> Settings:
    app = Celery("bounced", set_as_current=False)
    app.conf.update(debounce_store_url=url, debounce_postgres_schema=schema, **conf)
    return Settings.from_app(app)


@pytest.fixture
def make_store(bouncer: LocalPgBouncer, schema: str) -> Iterator[Callable[..., PostgresStore]]:
    stores: list[PostgresStore] = []

    def make(**kwargs: object) -> PostgresStore:
        kwargs.setdefault("timeout", 2.0)
        store = PostgresStore(
            bouncer.url(),
            kwargs.pop("settings", None) or settings_for(bouncer.url(), schema),  # type: ignore[arg-type]
            **kwargs,  # type: ignore[arg-type]
        )
        stores.append(store)
        return store

    first = make()
    first.migrate()
    yield make
    for store in stores:
        store.close()


def direct(server: LocalPostgres, schema: str, sql: str, *args: object) -> list[tuple[object, ...]]:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')  # a name made here
        return conn.execute(sql, args or None).fetchall()


def claimed(store: PostgresStore, ident: str) -> str:
    """A window of ``ident`` opened, taken, published and claimed: its task id."""
    task_id = store.gate(call(ident)).task_id
    store.flush(0, [(ident, "")])
    (window,) = store.take(0, 10).windows
    store.ack(0, [window.task_id])
    assert store.claim(0, task_id).run
    return task_id


def test_a_claim_renewal_shares_a_server_connection_and_renews_its_claim(
    make_store: Callable[..., PostgresStore], postgres_server: LocalPostgres, schema: str
) -> None:
    """Finding 1: a worker's renewal and a dispatcher's ack, each run more than the
    driver's prepare threshold (5) on the one server connection, each run their own
    statement: the claim is renewed, every time."""
    worker, dispatcher = make_store(), make_store()
    task_id = claimed(worker, "t:k")
    other = claimed(dispatcher, "t:other")
    until = "SELECT debounce_ms(claim_until) FROM debounce_taken WHERE task_id = %s"
    for _ in range(12):
        dispatcher.ack(0, [other])
        (before,) = direct(postgres_server, schema, until, task_id)[0]
        time.sleep(0.005)
        worker.renew_claims({0: [task_id]})
        (after,) = direct(postgres_server, schema, until, task_id)[0]
        assert after > before  # type: ignore[operator]


def test_a_call_leaves_its_server_connection_free_when_it_ends(
    postgres_server: LocalPostgres, schema: str
) -> None:
    """Each call's last message ends its transaction: no Flush after it (psycopg's
    pipeline sends one, and PgBouncer 1.18 then holds the server connection for that
    client until its next call, while every other client waits), and no named
    (server-side prepared) statement. Recorded on the wire, for every kind of call."""
    proxy = PgProxy(postgres_server.port)
    url = postgres_server.url().replace(f":{postgres_server.port}/", f":{proxy.port}/")
    try:
        with PostgresStore(url, settings_for(url, schema), timeout=2.0) as store:
            store.migrate()
            del proxy.messages[:]
            task_id = claimed(store, "t:k")
            for _ in range(8):  # past the driver's prepare threshold (5)
                store.renew_claims({0: [task_id]})
                store.gate(call("t:other"))
                store.take(0, 10)
                store.ping()
            for _ in range(48):  # past the threshold on each of the pool's connections
                store.schema_version()  # a read of several statements, in a transaction
            assert next(store.open_windows(0, limit=10), None) is not None
        kinds = [kind for kind, _ in proxy.messages]
        assert b"Q" in kinds and b"H" not in kinds, kinds
        named = [body for kind, body in proxy.messages if kind == b"P" and body[:1] != b"\0"]
        assert named == []
    finally:
        proxy.close()


def test_racing_calls_through_the_bouncer_raise_no_driver_error(
    make_store: Callable[..., PostgresStore], postgres_server: LocalPostgres, schema: str
) -> None:
    """Finding 2: 4 stores x 30 calls of the gate, the take and the ack, interleaved
    on one server connection: every call answers, no raw psycopg error."""
    stores = [make_store() for _ in range(4)]
    errors: list[BaseException] = []

    def produce(store: PostgresStore, n: int) -> None:
        try:
            for i in range(30):
                assert isinstance(store.gate(call(f"t:{n}-{i % 3}")), GateResult)
                store.take(0, 5)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(s, n)) for n, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    opened = direct(postgres_server, schema, "SELECT count(*) FROM debounce_open")[0][0]
    taken = direct(postgres_server, schema, "SELECT count(*) FROM debounce_taken")[0][0]
    assert opened + taken >= 12  # type: ignore[operator]


def test_the_store_leaves_no_setting_on_a_shared_server_connection(
    make_store: Callable[..., PostgresStore], bouncer: LocalPgBouncer
) -> None:
    """Finding 3: another application on the same pool sees the server's own
    settings after the store's calls, and its 1.5 s query is not cut at the store's
    1 s timeout."""
    store = make_store(timeout=1.0)
    store.gate(call("t:k"))
    store.take(0, 10)
    with psycopg.connect(bouncer.url(), autocommit=True, prepare_threshold=None) as other:
        assert other.execute("SHOW statement_timeout").fetchone() == ("0",)
        assert other.execute("SHOW search_path").fetchone() == ('"$user", public',)
        found = other.execute("SELECT current_setting('debounce.history_ttl_ms', true)")
        assert found.fetchone() in ((None,), ("",))
        other.execute("SELECT pg_sleep(1.5)")


def test_a_blocked_call_is_cut_by_the_server_after_its_connection_was_replaced(
    make_store: Callable[..., PostgresStore],
    bouncer: LocalPgBouncer,
    postgres_server: LocalPostgres,
    schema: str,
) -> None:
    """Finding 3: PgBouncer replaced its server connection (the old one terminated):
    a call blocked on a row lock is still cancelled by the server at the store's
    timeout, undone (``StoreUnavailable``, not an unknown outcome), nothing written."""
    store = make_store(timeout=1.0)
    opened = store.gate(call("t:k")).task_id
    direct(
        postgres_server,
        schema,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    )
    held = threading.Event()

    def hold() -> None:
        with psycopg.connect(postgres_server.url()) as conn:
            conn.execute(f'SET search_path = "{schema}"')
            conn.execute("SELECT 1 FROM debounce_open WHERE ident = 't:k' FOR UPDATE")
            held.set()
            time.sleep(3)
            conn.rollback()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(5)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as raised:
        wait_until(lambda: _gate_or_raise(store), timeout=5)
    assert not isinstance(raised.value, OutcomeUnknown), raised.value
    assert "statement timeout" in str(raised.value)
    assert time.monotonic() - started < 2.5
    holder.join()
    calls = "SELECT task_id, calls FROM debounce_open"
    assert direct(postgres_server, schema, calls) == [(opened, 1)]


def _gate_or_raise(store: PostgresStore) -> bool:
    """One join; a connection the bouncer lost meanwhile (the terminated server
    connection, seen once) is tried again, any other error raised."""
    try:
        store.gate(call("t:k"))
    except OutcomeUnknown:
        return False  # the terminated server connection: nothing ran, try again
    return True


def test_a_dispatcher_behind_the_bouncer_polls_and_says_so(
    make_store: Callable[..., PostgresStore],
    bouncer: LocalPgBouncer,
    postgres_server: LocalPostgres,
    schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 3: a LISTEN through the bouncer never hears a NOTIFY; the dispatcher
    polls and its log says so. With debounce_postgres_listen_url naming the server
    directly, it is woken."""
    caplog.set_level(logging.INFO, logger="celery_debounce.dispatch")
    pooled = PostgresWakeListener(make_store())
    pooled.subscribe()
    assert not pooled.subscribed and pooled.url is None
    assert "wake-ups do not arrive" in caplog.text
    stop = threading.Event()
    started = time.monotonic()
    pooled.wait(0.3, stop)  # a plain sleep
    assert time.monotonic() - started >= 0.29

    settings = replace(
        settings_for(bouncer.url(), schema), postgres_listen_url=postgres_server.url()
    )
    store = make_store(settings=settings)
    woken = PostgresWakeListener(store)
    woken.subscribe()
    assert woken.subscribed
    assert f"LISTEN on postgresql://***@127.0.0.1:{postgres_server.port}/" in caplog.text
    waiter = threading.Thread(target=woken.wait, args=(20, stop))
    started = time.monotonic()
    waiter.start()
    time.sleep(0.2)
    store.gate(call("t:due", window_ms=1, max_wait_ms=1))  # due at once: a wake-up
    waiter.join(10)
    assert time.monotonic() - started < 5
    woken.close()
