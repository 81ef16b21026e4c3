"""The PostgreSQL store as shops deploy the server: a synchronous standby that stops
answering, a role without a password it needs, a database that does not exist, a
migration beside live sessions, few connection slots. Each on a private server of its
own where the test changes the server's settings."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest
from helpers import wait_until
from test_postgres_store import call

from celery_debounce.store.domain import OutcomeUnknown, StoreUnavailable
from celery_debounce.store.postgres import PostgresStore
from celery_debounce.testing.postgres import LocalPostgres, find_postgres_bindir

pytestmark = pytest.mark.timeout(120)


def _sql(url: str, query: str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query)
        return cursor.fetchall() if cursor.description else []


def _waiting_for_the_standby(url: str) -> int:
    rows = _sql(url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
    return int(rows[0][0])  # type: ignore[call-overload]


def test_a_synchronous_standbys_outage_leaves_no_backend_waiting_past_its_call(
    durable_server: LocalPostgres,
) -> None:
    """Finding 4: the synchronous standby stops confirming. Each call's commit waits;
    the store ends the wait on the server too (a cancel request), so the backends
    waiting never exceed the pool's size and none is left once the calls end. A call
    the server answered after the cancel committed on the primary."""
    url = durable_server.url()
    store = PostgresStore(url, timeout=0.3, max_size=3)
    try:
        store.migrate()
        store.gate(call("t:before"))
        _sql(url, "ALTER SYSTEM SET synchronous_standby_names = 'gone'")
        _sql(url, "SELECT pg_reload_conf()")
        wait_until(lambda: _sql(url, "SHOW synchronous_standby_names") == [("gone",)], timeout=10)
        most = [0]
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                most[0] = max(most[0], _waiting_for_the_standby(url))
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        outcomes: list[object] = []

        def produce(n: int) -> None:
            for i in range(4):
                try:
                    outcomes.append(store.gate(call(f"t:{n}-{i}")))
                except (OutcomeUnknown, StoreUnavailable) as exc:
                    outcomes.append(exc)

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(6)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(outcomes) == 24
        assert time.monotonic() - started < 40
        wait_until(lambda: _waiting_for_the_standby(url) == 0, timeout=10)
        done.set()
        watcher.join(5)
        assert most[0] <= 3, most[0]
        # every call was answered, cut or refused within its bounds; no backend leaked
        clients = _sql(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
        )[0][0]
        assert clients <= 3 + 1  # type: ignore[operator]
    finally:
        _sql(url, "ALTER SYSTEM RESET synchronous_standby_names")
        _sql(url, "SELECT pg_reload_conf()")
        store.close()
    with PostgresStore(url, timeout=2.0) as after:
        assert after.gate(call("t:after")).opened  # the store works on


@pytest.mark.parametrize(
    ("user", "dbname", "says"),
    [
        ("pw:wrong", "postgres", "password authentication failed"),
        ("nosuchrole", "postgres", 'role "nosuchrole" does not exist'),
        ("debounce", "nosuchdb", 'database "nosuchdb" does not exist'),
        ("shut", "postgres", "permission denied for database"),
    ],
    ids=["wrong-password", "unknown-role", "unknown-database", "no-connect-right"],
)
def test_a_misconfigured_connection_is_raised_at_once_by_name_never_as_an_outage(
    password_server: LocalPostgres, user: str, dbname: str, says: str
) -> None:
    """Finding 8: each is StoreMisconfigured (a DebounceConfigError, not an outage) in
    well under the pool's 5 s, naming the server's reason; ping and the schema check
    too."""
    from celery_debounce import StoreMisconfigured
    from celery_debounce.errors import DebounceBackendError, DebounceConfigError

    url = f"postgresql://{user}@127.0.0.1:{password_server.port}/{dbname}"
    with PostgresStore(url, timeout=5.0) as store:
        for attempt in (
            lambda: store.gate(call("t:k")),
            store.schema_version,
            lambda: store.take(0, 10),
        ):
            started = time.monotonic()
            with pytest.raises(StoreMisconfigured, match=says) as raised:
                attempt()
            assert time.monotonic() - started < 1.0
            assert isinstance(raised.value, DebounceConfigError)
            assert not isinstance(raised.value, DebounceBackendError)
    right = f"postgresql://pw:right@127.0.0.1:{password_server.port}/postgres"
    with PostgresStore(right, timeout=5.0) as store:
        assert store.ping()  # the right password: connected


def test_a_refused_connection_is_an_outage_in_well_under_a_second() -> None:
    """Finding 8: nothing listens: StoreUnavailable at once, not after the pool's 5 s;
    ping answers False as fast."""
    from celery_debounce.testing.servers import free_port

    with PostgresStore(f"postgresql://u@127.0.0.1:{free_port()}/db", timeout=5.0) as store:
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="Connection refused"):
                store.gate(call("t:k"))
            assert time.monotonic() - started < 1.0
        started = time.monotonic()
        assert store.ping() is False
        assert time.monotonic() - started < 1.0


def test_the_pools_lines_come_through_the_packages_logger_rate_limited(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During an outage the pool warns of each failed attempt from its own threads: its
    lines about the store's pool come under ``celery_debounce.store.postgres``, one per
    kind per 30 s, never under ``psycopg.pool``; another pool's lines are left alone."""
    from celery_debounce.store.postgres import logs
    from celery_debounce.testing.servers import free_port

    monkeypatch.setattr(logs._routed, "_last", {})  # no line of an earlier test counts
    port = free_port()
    with caplog.at_level(logging.WARNING):
        with PostgresStore(f"postgresql://u@127.0.0.1:{port}/db", timeout=0.5) as store:
            for _ in range(4):
                with pytest.raises(StoreUnavailable):
                    store.gate(call("t:k"))
            wait_until(
                lambda: any(r.name == "celery_debounce.store.postgres" for r in caplog.records),
                timeout=10,
            )
        logging.getLogger("psycopg.pool").warning("error connecting in 'another-app': refused")
    ours = [r for r in caplog.records if r.name == "celery_debounce.store.postgres"]
    assert 1 <= len(ours) <= 2, [r.getMessage() for r in ours]  # two kinds at most
    assert all("celery-debounce" in r.getMessage() for r in ours)
    theirs = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"]
    assert theirs == ["error connecting in 'another-app': refused"]


def test_a_store_out_of_connection_slots_errs_by_name_and_recovers() -> None:
    """Finding 9 (pool sizing): the server's slots all taken by another application,
    a store with no connection yet raises StoreUnavailable naming the server's refusal
    within its timeout; once slots are free again, its calls go through."""
    if find_postgres_bindir() is None:
        pytest.skip("PostgreSQL server binaries not installed (scripts/ensure-postgres.sh)")
    settings = {"max_connections": "6", "superuser_reserved_connections": "0"}
    with LocalPostgres(settings=settings) as server:
        with PostgresStore(server.url(), timeout=2.0) as owner:
            owner.migrate()
        _sql(server.url(), "CREATE ROLE app LOGIN")
        _sql(server.url(), "GRANT ALL ON ALL TABLES IN SCHEMA public TO app")
        hogs = [psycopg.connect(server.url()) for _ in range(6)]
        app_url = f"postgresql://app@127.0.0.1:{server.port}/postgres"
        with PostgresStore(app_url, timeout=1.0) as store:
            try:
                started = time.monotonic()
                with pytest.raises(StoreUnavailable, match="too many clients"):
                    store.gate(call("t:k"))
                assert time.monotonic() - started < 3.0
            finally:
                for hog in hogs:
                    hog.close()
            wait_until(lambda: _gates(store), timeout=30)


def _gates(store: PostgresStore) -> bool:
    try:
        return store.gate(call("t:k")).calls >= 1
    except StoreUnavailable:
        return False


def test_a_role_without_the_grants_is_misconfigured_not_an_outage(
    postgres_server: LocalPostgres,
) -> None:
    """A role the schema's owner never granted anything: a call is refused at once as
    StoreMisconfigured (never an outage, so never published plainly), naming the grant
    command; nothing is written."""
    from celery_debounce.errors import StoreMisconfigured

    schema = f"nogrant_{int(time.time() * 1000) % 10**9}"
    owner = postgres_server.url()
    with PostgresStore(owner, timeout=2.0, schema=schema) as store:
        store.migrate()
    _sql(owner, "CREATE ROLE nogrant LOGIN")
    try:
        _sql(owner, f'GRANT USAGE ON SCHEMA "{schema}" TO nogrant')  # a name made here
        limited = owner.replace("//debounce@", "//nogrant@")
        with PostgresStore(limited, timeout=2.0, schema=schema) as store:
            started = time.monotonic()
            with pytest.raises(StoreMisconfigured, match="--grant-to"):
                store.gate(call("t:k"))
            assert time.monotonic() - started < 1.0
        assert _sql(owner, f'SELECT count(*) FROM "{schema}".debounce_open') == [(0,)]
    finally:
        _sql(owner, f'DROP SCHEMA "{schema}" CASCADE')
        _sql(owner, "DROP ROLE nogrant")


def test_a_role_granted_before_an_upgrade_keeps_every_right_after_it(
    postgres_server: LocalPostgres,
) -> None:
    """A schema of version 5 whose role was granted by ``migrate --grant-to`` then, and
    an upgrade to this version without ``--grant-to``: the role writes and reads the
    table the upgrade added (task definitions) and still gates; a role never granted
    gets nothing from the upgrade."""
    from celery_debounce.store.postgres import schema as pg_schema

    schema = f"regrant_{int(time.time() * 1000) % 10**9}"
    owner = postgres_server.url()
    _sql(owner, f'CREATE SCHEMA "{schema}"')
    _sql(owner, "CREATE ROLE granted LOGIN")
    _sql(owner, "CREATE ROLE bystander LOGIN")
    try:
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            for step in pg_schema.steps_to(None, 5):
                conn.execute(step.encode())
            conn.execute("UPDATE debounce_schema SET version = 5")
            conn.execute(pg_schema.grants_sql("granted", schema).encode())
        with PostgresStore(owner, timeout=2.0, schema=schema) as store:
            assert store.migrate() == (5, pg_schema.SCHEMA_VERSION)
        limited = owner.replace("//debounce@", "//granted@")
        with PostgresStore(limited, timeout=2.0, schema=schema) as store:
            assert store.publish_definitions({"proj.t": '{"v": 1}'}) == 1
            assert store.task_definition("proj.t") == '{"v": 1}'
            assert store.gate(call("t:k")).opened
        rights = _sql(
            owner,
            f"SELECT has_table_privilege('bystander', '\"{schema}\".debounce_tasks', "
            f"'SELECT'), has_table_privilege('granted', '\"{schema}\".debounce_schema', "
            "'UPDATE')",
        )
        assert rights == [(False, False)]
    finally:
        _sql(owner, f'DROP SCHEMA "{schema}" CASCADE')
        _sql(owner, "DROP ROLE granted")
        _sql(owner, "DROP ROLE bystander")


def test_a_function_a_migration_adds_at_the_same_version_is_the_granted_role_s_too(
    postgres_server: LocalPostgres,
) -> None:
    """A deployment that revokes EXECUTE from PUBLIC by default: a function a later
    release adds without a new schema version (applied by ``migrate``) can be executed
    by the role granted before, not by others."""
    schema = f"refn_{int(time.time() * 1000) % 10**9}"
    owner = postgres_server.url()
    signature = f'"{schema}".debounce_cancel_revoking(text, text, bigint)'
    _sql(owner, "CREATE ROLE granted_fn LOGIN")
    try:
        with PostgresStore(owner, timeout=2.0, schema=schema) as store:
            store.migrate()
            store.grant("granted_fn")
            _sql(owner, "ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC")
            _sql(owner, f"DROP FUNCTION {signature}")  # as a release before it had none
            store.migrate()
        rights = _sql(
            owner,
            f"SELECT has_function_privilege('granted_fn', '{signature}', 'EXECUTE'), "
            f"has_function_privilege('public', '{signature}', 'EXECUTE')",
        )
        assert rights == [(True, False)]
    finally:
        _sql(owner, "ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO PUBLIC")
        _sql(owner, f'DROP SCHEMA "{schema}" CASCADE')
        _sql(owner, "DROP OWNED BY granted_fn")
        _sql(owner, "DROP ROLE granted_fn")
