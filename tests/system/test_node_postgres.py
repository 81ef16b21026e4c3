"""The Node producer on the PostgreSQL store (clients/node/src/postgres.ts), through a
node-postgres Pool against a real PostgreSQL server: written at most once, refusals
before anything is written, an outage seen within the timeout, prefixes apart."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from celery import Celery
from helpers import wait_until
from node_producer import NODE, node_calls
from pg_proxy import PgProxy

from celery_debounce.settings import settings_for
from celery_debounce.store import build_store
from celery_debounce.testing.postgres import LocalPostgres
from celery_debounce.testing.servers import free_port

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")

OPTIONS = {"debounce": "1m", "maxWait": "5m", "key": "r:{0}", "timeout": "1s"}
CALL = ["proj.report", {"args": ["u1"]}, OPTIONS]


def _migrate(url: str, prefix: str | None = None) -> None:
    app = Celery("migrate", set_as_current=False)
    app.conf.debounce_store_url = url
    if prefix is not None:
        app.conf.debounce_key_prefix = prefix
    store = build_store(settings_for(app))
    store.migrate()
    store.close()


@pytest.fixture
def database(postgres_server: LocalPostgres) -> Iterator[str]:
    """A new database (dropped afterwards), not migrated: its name."""
    name = f"nodepg_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # a name made here, not user data
    yield name
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _rows(url: str, sql: str) -> list[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []


@contextmanager
def _dropping(server: LocalPostgres, url: str, marker: bytes) -> Iterator[str]:
    """``url`` through a proxy whose next message naming ``marker`` runs on the server
    and loses its reply."""
    proxy = PgProxy(server.port)
    try:
        proxy.drop_next(marker)
        yield url.replace(f":{server.port}/", f":{proxy.port}/")
    finally:
        proxy.close()


def test_a_lost_reply_is_outcome_unknown_and_the_call_is_written_once(
    node_package: Path, postgres_server: LocalPostgres, database: str
) -> None:
    url = postgres_server.url(database)
    _migrate(url)
    with _dropping(postgres_server, url, b"debounce_gate") as through:
        out = node_calls(node_package, "", [CALL, CALL], postgres=through)
    assert out[0]["error"] == "DebounceOutcomeUnknown", out
    assert isinstance(out[1], str), out  # the next call joined the window the first wrote
    assert _rows(url, "SELECT task_id, calls FROM debounce_open") == [(out[1], 2)]


def test_refusals_write_nothing(
    node_package: Path, postgres_server: LocalPostgres, database: str
) -> None:
    url = postgres_server.url(database)
    no_schema = node_calls(node_package, "", [CALL], postgres=url)
    assert no_schema[0]["error"] == "DebounceConfigError", no_schema
    assert "migrate" in no_schema[0]["message"]
    _migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE debounce_schema SET version = version + 1")
    newer = node_calls(node_package, "", [CALL], postgres=url)
    assert newer[0]["error"] == "DebounceContractMismatch", newer
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE debounce_schema SET version = version - 1")
    by_name = node_calls(node_package, "", [["proj.report", {"args": ["u1"]}, None]], postgres=url)
    assert by_name[0]["error"] == "DebounceConfigError", by_name
    assert "no definition" in by_name[0]["message"]
    assert _rows(url, "SELECT count(*) FROM debounce_open") == [(0,)]


def test_an_unreachable_server_is_a_backend_error_within_the_timeout(node_package: Path) -> None:
    url = f"postgresql://debounce@127.0.0.1:{free_port()}/nowhere"
    started = time.monotonic()
    out = node_calls(node_package, "", [CALL], postgres=url)
    assert out[0]["error"] == "DebounceBackendError", out
    assert "nothing was sent" in out[0]["message"]
    assert time.monotonic() - started < 10  # a Node process's start, then at most the 1 s


@pytest.mark.parametrize(
    ("user", "dbname", "says"),
    [
        ("pw:wrong", "postgres", "28P01"),
        ("nosuchrole", "postgres", "28000"),
        ("pw:right", "nosuchdb", "3D000"),
        ("shut", "postgres", "42501"),
    ],
    ids=["wrong-password", "unknown-role", "unknown-database", "no-connect-right"],
)
def test_a_misconfigured_pool_is_a_config_error_by_name_never_an_outage(
    node_package: Path, password_server: LocalPostgres, user: str, dbname: str, says: str
) -> None:
    """Bug class 16: the server refuses the pool's settings: each call is a
    DebounceConfigError naming the server's code (not "unreachable", so never taken for
    an outage and never opening the breaker: the second call says the same)."""
    url = f"postgresql://{user}@127.0.0.1:{password_server.port}/{dbname}"
    out = node_calls(node_package, "", [CALL, CALL], postgres=url)
    for answer in out:
        assert answer["error"] == "DebounceConfigError", out
        assert says in answer["message"] and "nothing was sent" in answer["message"], out


def test_a_prefix_names_the_schema_its_windows_are_in(
    node_package: Path, postgres_server: LocalPostgres, database: str
) -> None:
    url = postgres_server.url(database)
    _migrate(url)
    _migrate(url, prefix="tenant2")
    ids = node_calls(
        node_package,
        "",
        [CALL, ["proj.report", {"args": ["u1"]}, {**OPTIONS, "prefix": "tenant2"}]],
        postgres=url,
    )
    assert all(isinstance(i, str) for i in ids) and ids[0] != ids[1], ids
    assert _rows(url, "SELECT task_id FROM public.debounce_open") == [(ids[0],)]
    assert _rows(url, "SELECT task_id FROM tenant2.debounce_open") == [(ids[1],)]


def test_quotes_and_backslashes_in_a_key_reach_the_store_as_written(
    node_package: Path, postgres_server: LocalPostgres, database: str
) -> None:
    url = postgres_server.url(database)
    _migrate(url)
    key = "o'k\\x'); DROP TABLE debounce_open; --\\'"
    call = ["proj.report", {"args": [key]}, OPTIONS]
    ids = node_calls(node_package, "", [call, call], postgres=url)
    assert ids[0] == ids[1] and isinstance(ids[0], str), ids
    assert _rows(url, "SELECT ident, calls FROM debounce_open") == [(f"11:proj.report:r:{key}", 2)]


def _waiting_for_the_standby(url: str) -> int:
    rows = _rows(url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
    return int(rows[0][0])


#: A short timeout, and no breaker between the calls (each one tries the server).
EVERY_CALL_WAITS = {"timeout": "300ms", "outageProbeInterval": "50ms"}


def test_a_synchronous_standbys_outage_leaves_no_backend_waiting_past_its_call(
    node_package: Path, durable_server: LocalPostgres
) -> None:
    """The standby stops confirming: each Node call's commit waits past the timeout, and
    statement_timeout does not end that wait. Each call is then outcome-unknown, and the
    producer cancels the server's wait too: no backend is left holding a slot."""
    url = durable_server.url()
    _migrate(url)
    _rows(url, "ALTER SYSTEM SET synchronous_standby_names = 'gone'")
    _rows(url, "SELECT pg_reload_conf()")
    try:
        wait_until(lambda: _rows(url, "SHOW synchronous_standby_names") == [("gone",)], 10)
        calls: list[Any] = []
        for i in range(8):  # each after the breaker's interval: each tries the server
            calls.append(["proj.report", {"args": [f"u{i}"]}, {**OPTIONS, **EVERY_CALL_WAITS}])
            calls.append(["__sleep__", {"ms": 60}, None])
        out = node_calls(node_package, "", calls, postgres=url)
        assert [o["error"] for o in out] == ["DebounceOutcomeUnknown"] * 8, out
        wait_until(lambda: _waiting_for_the_standby(url) == 0, timeout=5)
    finally:
        _rows(url, "ALTER SYSTEM RESET synchronous_standby_names")
        _rows(url, "SELECT pg_reload_conf()")


def test_a_window_is_read_and_flushed_by_its_call(
    node_package: Path, postgres_server: LocalPostgres, database: str
) -> None:
    url = postgres_server.url(database)
    _migrate(url)
    opened, read, flushed, after, again = node_calls(
        node_package,
        "",
        [
            CALL,
            [*CALL, "pending"],
            [*CALL, "flush"],
            [*CALL, "pending"],
            [*CALL, "flush"],
        ],
        postgres=url,
    )
    assert read["taskId"] == opened and read["calls"] == 1, read
    assert read["deadlineMs"] - read["firstSeenMs"] == 60_000
    assert flushed["taskId"] == opened and flushed["deadlineMs"] <= read["deadlineMs"], flushed
    assert after is None and again is None
    assert _rows(url, "SELECT task_id, state FROM debounce_taken") == [(opened, "dispatching")]


def test_a_flush_whose_reply_is_lost_is_outcome_unknown_ran_once_and_is_not_sent_again(
    node_package: Path, postgres_server: LocalPostgres, database: str
) -> None:
    url = postgres_server.url(database)
    _migrate(url)
    with _dropping(postgres_server, url, b"debounce_close") as through:
        opened, flushed, reopened, still = node_calls(
            node_package,
            "",
            [CALL, [*CALL, "flush"], CALL, ["__sleep__", {"ms": 300}], [*CALL, "pending"]],
            postgres=through,
        )
    assert flushed["error"] == "DebounceOutcomeUnknown", flushed
    # never sent again: a second close would have closed the window opened after it
    assert reopened != opened and still["taskId"] == reopened, (opened, reopened, still)
    taken = _rows(url, "SELECT task_id, state FROM debounce_taken")
    assert taken == [(opened, "dispatching")]  # it ran: the first window closed


def test_a_call_s_own_task_id_opens_the_window_or_is_its_alias(
    node_package: Path, postgres_server: LocalPostgres, database: str
) -> None:
    url = postgres_server.url(database)
    _migrate(url)
    ids = node_calls(
        node_package,
        "",
        [["proj.report", {"args": ["u1"], "taskId": f"own-{i}"}, OPTIONS] for i in range(2)],
        postgres=url,
    )
    assert ids == ["own-0", "own-0"], ids
    ((task_id, aliases),) = _rows(url, "SELECT task_id, aliases FROM debounce_open")
    assert task_id == "own-0" and [json.loads(a) for a in aliases] == [{"id": "own-1"}]


def test_debounce_many_writes_each_chunk_in_one_transaction(
    node_package: Path, postgres_server: LocalPostgres, database: str
) -> None:
    url = postgres_server.url(database)
    _migrate(url)
    calls = [{"args": [user, n]} for n, user in enumerate(["a", "b", "a", "c", "a"])]
    (ids,) = node_calls(node_package, "", [["proj.report", calls, OPTIONS, "many"]], postgres=url)
    assert len(ids) == 5 and ids[0] == ids[2] == ids[4] and len(set(ids)) == 3, ids
    assert sorted(_rows(url, "SELECT ident, calls FROM debounce_open")) == [
        ("11:proj.report:r:a", 3),
        ("11:proj.report:r:b", 1),
        ("11:proj.report:r:c", 1),
    ]
