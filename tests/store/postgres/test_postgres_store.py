"""The PostgreSQL store's gate, take and ack against a real private PostgreSQL server
(the ``postgres_server`` session fixture): atomic for racing producers, the ceiling on
the server's clock, a taken window never joined, concurrent dispatchers taking disjoint
windows, a lapsed lease taken again, and a schema of another version refused by name.

Each test works in a schema of its own (``search_path``), so they share one server."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from helpers import wait_until
from pg_proxy import PgProxy
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from celery_debounce.aliases import FixedId
from celery_debounce.errors import DebounceConfigError
from celery_debounce.producer.call import PreparedCall
from celery_debounce.producer.options import DebounceSpec
from celery_debounce.store.domain import (
    OutcomeUnknown,
    PayloadTooLarge,
    ReplaceRefused,
    ServerRefused,
    StoreUnavailable,
)
from celery_debounce.store.idents import window_ident
from celery_debounce.store.postgres import (
    SCHEMA_VERSION,
    PostgresStore,
    SchemaMissing,
    SchemaTooNew,
    SchemaTooOld,
)
from celery_debounce.store.postgres import schema as pg_schema
from celery_debounce.store.results import GateResult, TakenWindow
from celery_debounce.testing.postgres import LocalPostgres
from celery_debounce.worker.retry_queue import worth_keeping

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def database(postgres_server: LocalPostgres) -> Iterator[str]:
    """A conninfo whose ``search_path`` is a fresh, empty schema (dropped afterwards)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')  # a name made here, not user data
    yield make_conninfo(postgres_server.url(), options=f"-c search_path={name}")
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


@pytest.fixture
def make_store(database: str) -> Iterator[Callable[..., PostgresStore]]:
    stores: list[PostgresStore] = []

    def make(url: str = database, **kwargs: object) -> PostgresStore:
        kwargs.setdefault("timeout", 5.0)
        store = PostgresStore(url, **kwargs)  # type: ignore[arg-type]
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., PostgresStore]) -> PostgresStore:
    made = make_store(max_size=8)
    made.migrate()
    return made


def call(
    ident: str = "tasks.t:k",
    window_ms: int = 10_000,
    max_wait_ms: int = 60_000,
    payload: bytes = b"[[], {}, {}]",
    replace: bool = False,
    **spec: object,
) -> PreparedCall:
    """A prepared call as the producer builds it (a fresh task id per call)."""
    return PreparedCall(
        task_name=ident.split(":")[0],
        key=ident.split(":", 1)[1],
        ident=ident,
        shard=0,
        task_id=str(uuid.uuid4()),
        spec=DebounceSpec(
            window_ms=window_ms, max_wait_ms=max_wait_ms, key=None, replace_payload=replace, **spec
        ),  # type: ignore[arg-type]
        content_type="application/json",
        payload=payload,
        options_json="{}",
    )


def rows(database: str, table: str) -> list[tuple[object, ...]]:
    with psycopg.connect(database, autocommit=True) as conn:
        query = {
            "open": "SELECT ident, task_id, calls FROM debounce_open ORDER BY ident",
            "taken": "SELECT ident, task_id, calls, state FROM debounce_taken ORDER BY ident",
        }[table]
        return conn.execute(query).fetchall()


def test_racing_producers_on_one_key_make_one_window_counting_every_call(
    store: PostgresStore, database: str
) -> None:
    def produce(_: int) -> list[tuple[str, bool, int]]:
        return [(r.task_id, r.opened, r.calls) for r in (store.gate(call()) for _ in range(50))]

    with ThreadPoolExecutor(8) as pool:
        results = [r for batch in pool.map(produce, range(8)) for r in batch]
    assert len(results) == 400
    assert len({task_id for task_id, _, _ in results}) == 1
    assert sum(opened for _, opened, _ in results) == 1
    # each call saw its own count: the 400 joins were serialized on the row
    assert sorted(calls for _, _, calls in results) == list(range(1, 401))
    ((ident, task_id, calls),) = rows(database, "open")
    assert (ident, task_id, calls) == ("tasks.t:k", results[0][0], 400)


def test_the_deadline_is_the_servers_and_never_passes_the_ceiling(
    store: PostgresStore, database: str
) -> None:
    first = store.gate(call(window_ms=200, max_wait_ms=500))
    assert first.opened and first.deadline_ms == first.now_ms + 200
    with psycopg.connect(database, autocommit=True) as conn:
        server_ms = conn.execute("SELECT debounce_ms(clock_timestamp())").fetchone()[0]
    assert abs(server_ms - first.now_ms) < 1000
    ceiling = first.now_ms + 500
    last = first
    while last.now_ms < ceiling + 100:  # joins past the ceiling's time
        last = store.gate(call(window_ms=200, max_wait_ms=500))
        assert not last.opened and last.task_id == first.task_id
        assert last.deadline_ms == min(last.now_ms + 200, ceiling)
        time.sleep(0.03)
    assert last.deadline_ms == ceiling
    (taken,) = store.take(0, 10).windows
    assert taken.task_id == first.task_id and taken.forced_by_max_wait
    assert taken.deadline_ms == taken.ceiling_ms == ceiling


def test_a_window_shorter_than_the_ceiling_opens_at_the_ceiling(store: PostgresStore) -> None:
    opened = store.gate(call(window_ms=5000, max_wait_ms=100))
    assert opened.deadline_ms == opened.now_ms + 100


def test_a_join_replaces_the_arguments_only_with_replace_the_openers_embed_stays(
    store: PostgresStore, database: str
) -> None:
    opener = b'[["first"], {"n": 1}, {"callbacks": [{"task": "cb"}], "chain": null}]'
    joiner = b'[["second"], {"n": 2}, {"callbacks": [{"task": "other"}]}]'
    store.gate(call("a:k", window_ms=0, payload=opener))
    store.gate(call("a:k", window_ms=0, payload=joiner))
    store.gate(call("b:k", window_ms=0, payload=opener, replace=True))
    store.gate(call("b:k", window_ms=0, payload=joiner, replace=True))
    with pytest.raises(ReplaceRefused, match="not a JSON"):  # nothing written
        store.gate(call("b:k", window_ms=0, payload=b"not json", replace=True))
    taken = {w.ident: w for w in store.take(0, 10).windows}
    assert taken["a:k"].payload == opener and taken["a:k"].calls == 2
    assert json.loads(taken["b:k"].payload) == [
        ["second"],
        {"n": 2},
        {"callbacks": [{"task": "cb"}], "chain": None},
    ]
    assert taken["b:k"].calls == 2


def test_a_replacing_join_of_a_body_that_is_not_json_needs_the_openers_embed(
    store: PostgresStore,
) -> None:
    def pickled(payload: bytes, embed: str) -> PreparedCall:
        made = call("p:k", window_ms=0, payload=payload, replace=True)
        return made._replace(content_type="application/x-python-serialize", embed_json=embed)

    store.gate(pickled(b"opener", '{"callbacks": [1]}'))
    store.gate(pickled(b"same embed", '{"callbacks": [1]}'))
    with pytest.raises(ReplaceRefused, match="link/link_error"):
        store.gate(pickled(b"other embed", "{}"))
    with pytest.raises(ReplaceRefused, match="content type"):
        store.gate(call("p:k", window_ms=0, replace=True))
    (taken,) = store.take(0, 10).windows
    assert (taken.payload, taken.calls) == (b"same embed", 2)


def test_a_fixed_id_in_use_is_never_reused_even_by_racing_calls(store: PostgresStore) -> None:
    def fixed(ident: str) -> GateResult:
        return store.gate(call(ident)._replace(task_id="A"), FixedId("A", '{"id": "A"}', False))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(fixed, [f"t:{i}" for i in range(16)]))
    assert [r.task_id for r in results].count("A") == 1
    assert len({r.task_id for r in results}) == 16 and all(r.opened for r in results)
    assert fixed("t:0").task_id == results[0].task_id  # a join of its own window


def test_a_taken_window_is_never_joined_a_later_call_opens_a_new_one(
    store: PostgresStore, database: str
) -> None:
    first = store.gate(call(window_ms=0))
    (taken,) = store.take(0, 10).windows
    assert taken.task_id == first.task_id
    after = store.gate(call(window_ms=0))
    assert after.opened and after.task_id != first.task_id and after.calls == 1
    assert rows(database, "taken") == [("tasks.t:k", first.task_id, 1, "dispatching")]


def test_gates_racing_takes_lose_no_call_and_count_none_twice(
    store: PostgresStore, database: str
) -> None:
    """Producers on one key while a dispatcher takes: every call is in exactly one
    window (taken or still open), and no window was joined after its take."""
    stop = threading.Event()
    taken: dict[str, int] = {}

    def dispatch() -> None:
        while not stop.is_set():
            for window in store.take(0, 50).windows:
                assert window.task_id not in taken
                taken[window.task_id] = window.calls

    dispatcher = threading.Thread(target=dispatch)
    dispatcher.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda _: store.gate(call(window_ms=0)), range(600)))
    finally:
        stop.set()
        dispatcher.join(10)
    for window in store.take(0, 1000).windows:
        taken[window.task_id] = window.calls
    assert rows(database, "open") == []
    assert sum(taken.values()) == 600
    # the ids handed out are exactly the windows taken, each with its callers' count
    handed: dict[str, int] = {}
    for result in results:
        handed[result.task_id] = handed.get(result.task_id, 0) + 1
    assert handed == taken
    # the taken records are those the dispatcher saw, counts frozen at the take
    assert {r[1]: r[2] for r in rows(database, "taken")} == taken


def test_two_dispatchers_taking_at_once_never_take_the_same_window(
    store: PostgresStore, make_store: Callable[..., PostgresStore]
) -> None:
    with ThreadPoolExecutor(4) as pool:
        opened = set(
            pool.map(lambda i: store.gate(call(f"t:{i}", window_ms=0)).task_id, range(500))
        )
    assert len(opened) == 500
    other = make_store(max_size=2)
    seen: list[list[str]] = [[], []]
    barrier = threading.Barrier(2)

    def dispatch(index: int, on: PostgresStore) -> None:
        barrier.wait()
        while True:
            result = on.take(0, 7)
            if not result.windows and result.next_in_ms != 0:
                return
            seen[index] += [w.task_id for w in result.windows]

    threads = [
        threading.Thread(target=dispatch, args=(0, store)),
        threading.Thread(target=dispatch, args=(1, other)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not set(seen[0]) & set(seen[1])
    assert len(seen[0]) + len(seen[1]) == 500 and set(seen[0]) | set(seen[1]) == opened
    assert seen[0] and seen[1], "both dispatchers took windows"


def test_a_lapsed_lease_is_taken_again_an_acked_window_never(
    make_store: Callable[..., PostgresStore],
) -> None:
    store = make_store(lease_ms=150)
    store.migrate()
    lapsing = store.gate(call("t:lapsing", window_ms=0)).task_id
    acked = store.gate(call("t:acked", window_ms=0)).task_id
    first = store.take(0, 10)
    assert {w.task_id for w in first.windows} == {lapsing, acked}
    assert first.next_in_ms == 150  # the leases' end
    assert store.ack(0, [acked]) == 1
    assert store.ack(0, [acked]) == 0  # idempotent
    assert store.take(0, 10).windows == []
    time.sleep(0.2)
    (again,) = store.take(0, 10).windows
    assert again.task_id == lapsing and again.tries == 2
    assert store.ack(0, [lapsing]) == 1
    time.sleep(0.2)
    result = store.take(0, 10)
    assert result.windows == [] and result.next_in_ms == -1


def test_a_database_without_the_schema_is_refused_by_name_and_nothing_written(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    store = make_store()
    with pytest.raises(SchemaMissing, match=r"no celery_debounce schema.*debounce migrate"):
        store.gate(call())
    with pytest.raises(SchemaMissing):
        store.take(0, 10)
    assert store.schema_version() is None
    with psycopg.connect(database, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('debounce_open')").fetchone() == (None,)
    assert store.migrate() == (None, SCHEMA_VERSION)
    assert store.gate(call()).opened


@pytest.mark.parametrize(
    ("version", "error", "words"),
    [
        (SCHEMA_VERSION - 1, SchemaTooOld, "older than this package's"),
        (SCHEMA_VERSION + 1, SchemaTooNew, "newer than this package's"),
    ],
)
def test_an_older_or_newer_schema_is_refused_by_name(
    store: PostgresStore,
    make_store: Callable[..., PostgresStore],
    database: str,
    version: int,
    error: type[Exception],
    words: str,
) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE debounce_schema SET version = %s", (version,))
    fresh = make_store()
    with pytest.raises(error, match=words) as raised:
        fresh.gate(call())
    assert raised.value.found == version  # type: ignore[attr-defined]
    assert rows(database, "open") == []


def test_migrate_upgrades_an_older_schema_and_refuses_a_newer_one(
    store: PostgresStore,
    make_store: Callable[..., PostgresStore],
    database: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE debounce_schema SET version = %s", (SCHEMA_VERSION - 1,))
    monkeypatch.setitem(
        pg_schema.UPGRADES, SCHEMA_VERSION - 1, "CREATE TABLE upgraded_here (x int)"
    )
    assert store.migrate() == (SCHEMA_VERSION - 1, SCHEMA_VERSION)
    assert make_store().gate(call()).opened
    with psycopg.connect(database, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('upgraded_here')").fetchone() != (None,)
        conn.execute("UPDATE debounce_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(SchemaTooNew):
        store.migrate()


def test_migrate_upgrades_a_version_1_database_keeping_its_windows(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    """A database created by a package of schema version 1 (schema.sql alone), with a
    window open: each upgrade step runs, the window stays, and what the steps add
    works (cancel, version 2)."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(pg_schema.schema_sql().encode())
        assert conn.execute("SELECT version FROM debounce_schema").fetchone() == (1,)
        conn.execute(
            "INSERT INTO debounce_open (ident, task_id, first_seen, deadline, max_wait_ms, "
            "content_type, payload, options_json) VALUES ('tasks.t:k', 'kept', now(), "
            "now() + interval '1 minute', 60000, 'application/json', '\\x00', '{}')"
        )
    old = make_store()
    with pytest.raises(SchemaTooOld, match="version 1"):
        old.gate(call())
    assert old.migrate() == (1, SCHEMA_VERSION)
    store = make_store()
    joined = store.gate(call())
    assert (joined.task_id, joined.calls) == ("kept", 2)
    cancelled = store.cancel(0, "tasks.t:k")
    assert cancelled is not None and cancelled.record.task_id == "kept"
    assert rows(database, "open") == []
    assert make_store().migrate() == (SCHEMA_VERSION, SCHEMA_VERSION)  # again: nothing


def test_concurrent_migrations_create_the_schema_once(
    make_store: Callable[..., PostgresStore],
) -> None:
    stores = [make_store() for _ in range(3)]
    with ThreadPoolExecutor(3) as pool:
        befores = sorted(
            pool.map(lambda s: s.migrate()[0], stores), key=lambda v: -1 if v is None else v
        )
    assert befores == [None, SCHEMA_VERSION, SCHEMA_VERSION]


def collect_call(
    ident: str = "tasks.t:k", args: object = (), pad: str = "", **spec: object
) -> PreparedCall:
    """A ``debounce_collect`` call as the producer builds it: its JSON ``[args, kwargs]``
    and, for the window it may open, the protocol-2 embed."""
    body = json.dumps([list(args) if isinstance(args, tuple) else args, {"pad": pad}])
    return call(ident, payload=body.encode(), collect=True, **spec)._replace(
        collect_embed='{"callbacks": null}'
    )


def calls_of(payload: bytes) -> list[list[object]]:
    """The run's calls in a spliced collect body ``[[[e1, ...]], {}, embed]``, each
    ``[ms, args, kwargs]``."""
    (calls,), kwargs, embed = json.loads(payload)
    assert kwargs == {} and embed == {"callbacks": None}
    return calls


def drain(store: PostgresStore) -> list[TakenWindow]:
    """Every window, closed and taken (the open ones flushed first)."""
    with psycopg.connect(store.url, autocommit=True) as conn:
        for (ident,) in conn.execute("SELECT ident FROM debounce_open").fetchall():
            store.flush(0, [(ident, "")])
    taken = store.take(0, 10_000).windows
    store.ack(0, [w.task_id for w in taken])
    return taken


def test_collect_calls_racing_a_dispatcher_each_reach_one_body_once_in_call_order(
    store: PostgresStore, database: str
) -> None:
    """Producers on one key while a dispatcher takes the key's windows as they come due
    and as they fill: every call is in exactly one run's body, in call order, and no
    body is over its budget. A call that joined a window committed just before the take
    locked it is spliced in (a later statement than the one that moved the window)."""
    store.max_payload_bytes = 900
    stop = threading.Event()
    taken: list[TakenWindow] = []

    def dispatch() -> None:
        while not stop.is_set():
            batch = store.take(0, 100).windows
            store.ack(0, [w.task_id for w in batch])
            taken.extend(batch)

    def produce(thread: int) -> None:
        for i in range(60):
            store.gate(collect_call(args=(thread, i), pad="x" * (i % 7) * 10, window_ms=2))

    taker = threading.Thread(target=dispatch)
    taker.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(produce, range(6)))
    finally:
        stop.set()
        taker.join(30)
    taken += drain(store)
    seen: list[tuple[int, int]] = []
    for window in taken:
        assert len(window.payload) <= 900
        mine = [tuple(args) for _, args, _ in calls_of(window.payload)]
        for thread in range(6):  # each producer's calls in its order
            order = [i for t, i in mine if t == thread]
            assert order == sorted(order)
        seen += mine
    assert sorted(seen) == [(t, i) for t in range(6) for i in range(60)]
    assert len(taken) > 6  # windows were taken while calls came, and filled
    with psycopg.connect(database, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM debounce_calls").fetchone() == (0,)


def test_a_collect_call_committed_while_the_take_ran_is_in_the_body_it_took(
    store: PostgresStore, database: str
) -> None:
    """The take's statement reads with a snapshot from its start, but locks a window's
    newest row: a call that joined after the snapshot and before the lock is in the
    row the take moves, so it must be in the body too. A test hook holds the take
    between the two (an advisory lock in the due-window check of an exclusive window)."""
    # max wait 1 ms: the join keeps the deadline, so the take still finds the window due
    first = store.gate(collect_call(args=(1,), window_ms=1, max_wait_ms=1, exclusive=True))
    hook = 0x636F6C6C  # an advisory lock key of this test's own
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("UPDATE debounce_open SET held_since = clock_timestamp()")
        conn.execute(
            "CREATE OR REPLACE FUNCTION debounce_running(p_ident text) RETURNS boolean "
            f"LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_advisory_lock({hook}); "
            f"PERFORM pg_advisory_unlock({hook}); RETURN false; END $$"
        )
        conn.execute("SELECT pg_advisory_lock(%s)", (hook,))
        took: list[TakenWindow] = []
        taker = threading.Thread(target=lambda: took.extend(store.take(0, 10).windows))
        taker.start()
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        wait_until(lambda: conn.execute(waiting).fetchone() == (1,), 10)
        joined = store.gate(collect_call(args=(2,), window_ms=1, max_wait_ms=1, exclusive=True))
        assert joined.task_id == first.task_id and joined.calls == 2
        conn.execute("SELECT pg_advisory_unlock(%s)", (hook,))
        taker.join(10)
    (window,) = took
    assert window.calls == 2
    assert [a for _, a, _ in calls_of(window.payload)] == [[1], [2]]


def test_a_collect_window_counts_the_bytes_its_run_gets_and_lists_its_calls(
    store: PostgresStore,
) -> None:
    first = store.gate(collect_call(args=(1,), window_ms=600_000))
    store.gate(collect_call(args=(2,), pad="é", window_ms=600_000))
    pending = store.pending(0, "tasks.t:k")
    assert pending is not None and pending.collect_list == first.task_id
    (record,) = store.pending_payloads(0)
    assert record.collected is not None
    assert [json.loads(e)[1] for e in record.collected] == [[1], [2]]
    assert record.collected_bytes == pending.collected_bytes
    (window,) = drain(store)
    assert len(window.payload) == pending.collected_bytes  # bytes, not characters
    assert [args for _, args, _ in calls_of(window.payload)] == [[1], [2]]
    assert window.calls == 2


def test_a_collect_window_closes_at_its_cap_and_a_call_of_the_other_mode_opens_its_own(
    store: PostgresStore, database: str
) -> None:
    ids = [store.gate(collect_call(args=(i,), max_calls=3)).task_id for i in range(4)]
    assert ids[0] == ids[1] == ids[2] != ids[3]  # the third call closed it
    plain = store.gate(call("tasks.t:k"))  # a deploy turned collect off: its own window
    assert plain.opened and plain.task_id != ids[3]
    again = store.gate(collect_call(args=(9,)))  # and on again
    assert again.opened and again.task_id != plain.task_id
    by_id = {w.task_id: w for w in drain(store)}
    assert [a for _, a, _ in calls_of(by_id[ids[0]].payload)] == [[0], [1], [2]]
    assert by_id[ids[0]].capped
    assert [a for _, a, _ in calls_of(by_id[ids[3]].payload)] == [[3]]
    assert not by_id[ids[3]].capped  # closed by the other mode, as a flush: not capped
    assert by_id[plain.task_id].payload == b"[[], {}, {}]"
    assert [a for _, a, _ in calls_of(by_id[again.task_id].payload)] == [[9]]


def test_a_producer_of_the_previous_version_keeps_gating_after_the_upgrade(
    store: PostgresStore, database: str
) -> None:
    """A producer of version 2 still running while a deploy goes on (it checked the
    schema when it started) calls the gate of 16 arguments: it opens and joins windows,
    and a collect window it finds open is closed, not joined (its run would miss the
    call)."""
    collecting = store.gate(collect_call(args=(1,)))
    old = (
        "SELECT task_id, opened, calls FROM debounce_gate(%s, %s, 10000, 60000, "
        "'application/json', %s, '{}', false, false, NULL, NULL, NULL, false, 16, '', '')"
    )
    with psycopg.connect(database, autocommit=True) as conn:
        first = conn.execute(old, ("tasks.t:k", "old-1", b"[[], {}, {}]")).fetchone()
        second = conn.execute(old, ("tasks.t:k", "old-2", b"[[], {}, {}]")).fetchone()
    assert first == ("old-1", True, 1) and second == ("old-1", False, 2)
    by_id = {w.task_id: w for w in drain(store)}
    assert [a for _, a, _ in calls_of(by_id[collecting.task_id].payload)] == [[1]]
    assert by_id["old-1"].calls == 2 and by_id["old-1"].payload == b"[[], {}, {}]"


def test_a_cancelled_collect_window_leaves_no_calls_behind(
    store: PostgresStore, database: str
) -> None:
    opened = store.gate(collect_call(args=(1,)))
    store.gate(collect_call(args=(2,)))
    cancelled = store.cancel(0, "tasks.t:k")
    assert cancelled is not None and cancelled.record.task_id == opened.task_id
    with psycopg.connect(database, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM debounce_calls").fetchone() == (0,)
    reopened = store.gate(collect_call(args=(3,)))
    (window,) = drain(store)
    assert window.task_id == reopened.task_id
    assert [a for _, a, _ in calls_of(window.payload)] == [[3]]


def test_a_dispatcher_of_the_previous_version_keeps_taking_after_the_upgrade(
    store: PostgresStore, database: str
) -> None:
    """A dispatcher of version 3 still running while a deploy goes on calls the take of
    3 arguments: it takes the due windows, with no byte bound, and leases them as the
    new take does."""
    for n in range(3):
        store.gate(_big(f"t:{n}", 200_000))
        store.flush(0, [(f"t:{n}", "")])
    store.batch_bytes = store.take_bytes = 1
    with psycopg.connect(database, autocommit=True) as conn:
        rows = conn.execute("SELECT task_id FROM debounce_take(10, 60000, NULL)").fetchall()
    assert len(rows) == 3 + 1  # the windows and the header row
    assert store.take(0, 10).windows == []  # leased: not taken again within the lease


def _big(ident: str, size: int) -> PreparedCall:
    return call(ident, payload=b'[["' + b"x" * (size - 12) + b'"], {}, {}]')


def test_a_take_stops_at_its_byte_budget_the_first_window_whatever_its_size(
    store: PostgresStore,
) -> None:
    """Finding 5: a take leases windows until their bodies reach its bytes, as well as
    up to its count: at most its bytes plus one window, the first whatever its size;
    every window is taken once."""
    store.batch_bytes = store.take_bytes = 300_000
    idents = [f"t:{n:02}" for n in range(10)]
    for ident in idents:
        store.gate(_big(ident, 100_000))
        store.flush(0, [(ident, "")])
    for ident in ("t:huge", "t:huge2"):
        store.gate(_big(ident, 700_000))
        store.flush(0, [(ident, "")])
    sizes: list[list[int]] = []
    taken: list[str] = []
    while batch := store.take(0, 500).windows:
        sizes.append([len(w.record.payload) for w in batch])
        taken += [w.record.ident for w in batch]
    assert sorted(taken) == sorted([*idents, "t:huge", "t:huge2"])
    assert [len(s) for s in sizes] == [3, 3, 3, 2, 1], sizes
    assert all(sum(s[:-1]) < 300_000 for s in sizes)


def test_a_backlog_of_large_windows_drains_over_a_slow_link(
    make_store: Callable[..., PostgresStore], postgres_server: LocalPostgres, database: str
) -> None:
    """Finding 5: 24 windows of 1 MB due at once, a link carrying 8 MB/s, a 1 s timeout:
    a take of them all (24 MB) never fits its timeout, so the take is bounded by bytes
    (16 MB by default) and halves them when one fails; the backlog drains, each window
    taken once. (The review's case was 500 windows of 1 MB at 125 MB/s: the same ratio
    of backlog to what the link carries within a timeout, at 1/20 of the bytes.)"""
    direct = make_store(max_size=2)
    direct.migrate()
    idents = [f"t:{n:02}" for n in range(24)]
    for ident in idents:
        direct.gate(_big(ident, 1_000_000))
        direct.flush(0, [(ident, "")])
    proxy = PgProxy(postgres_server.port)
    try:
        slow = make_store(
            database.replace(f"port={postgres_server.port}", f"port={proxy.port}"),
            timeout=1.0,
            lease_ms=2_000,
        )
        assert slow.ping()  # connected and checked before the link slows down
        proxy.pace(8_000_000)
        taken: list[str] = []
        failed = 0
        deadline = time.monotonic() + 40
        while len(taken) < len(idents) and time.monotonic() < deadline:
            try:
                batch = slow.take(0, 500).windows
            except StoreUnavailable:
                failed += 1
                continue
            slow.ack(0, [w.record.task_id for w in batch])  # published, as a dispatcher does
            taken += [w.record.ident for w in batch]
        assert time.monotonic() < deadline, f"{len(taken)} taken, {failed} takes failed"
        assert sorted(taken) == idents
        assert failed >= 1 and slow.take_bytes < slow.batch_bytes
    finally:
        proxy.close()


def test_a_gate_whose_reply_is_lost_is_not_sent_again(
    store: PostgresStore,
    make_store: Callable[..., PostgresStore],
    postgres_server: LocalPostgres,
    database: str,
) -> None:
    proxy = PgProxy(postgres_server.port)
    try:
        through = make_store(
            database.replace(f"port={postgres_server.port}", f"port={proxy.port}"), max_size=1
        )
        assert through.gate(call()).opened
        proxy.drop_next(b"debounce_gate")
        with pytest.raises(OutcomeUnknown, match="gate was lost"):
            through.gate(call())
        # it ran once (the join counted), and only once
        assert [r[2] for r in rows(database, "open")] == [2]
        assert through.gate(call()).calls == 3
    finally:
        proxy.close()


def test_racing_first_calls_of_a_leading_burst_make_one_leading_run(store: PostgresStore) -> None:
    barrier = threading.Barrier(6)

    def first_calls(ident: str) -> list[str]:
        barrier.wait()
        return [store.gate(call(ident, leading=True, trailing=False)).edge for _ in range(3)]

    for round_ in range(10):
        with ThreadPoolExecutor(6) as pool:
            edges = [e for batch in pool.map(first_calls, [f"t:{round_}"] * 6) for e in batch]
        assert edges.count("lead") == 1 and edges.count("suppressed") == 17, edges
    leads = store.take(0, 100).windows
    assert len(leads) == 10 and all(w.leading for w in leads)


# -- the dispatcher's role: wake-ups, the expiry sweep, heartbeats, layouts ------------


def _wait_timed(listener: object, seconds: float) -> float:
    """How long ``listener.wait(seconds)`` took."""
    started = time.monotonic()
    listener.wait(seconds, threading.Event())  # type: ignore[attr-defined]
    return time.monotonic() - started


def _later(delay: float, fn: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        fn()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_new_earliest_window_wakes_a_waiting_listener_well_before_its_timeout(
    store: PostgresStore,
) -> None:
    listener = store.wake_listener()
    try:
        listener.subscribe()
        thread = _later(0.3, lambda: store.gate(call("t:first", window_ms=600_000)))
        assert _wait_timed(listener, 30) < 15
        thread.join()
    finally:
        listener.close()


def test_a_flush_wakes_a_listener_a_later_deadline_does_not(store: PostgresStore) -> None:
    store.gate(call("t:early", window_ms=600_000))
    listener = store.wake_listener()
    try:
        listener.subscribe()
        store.gate(call("t:later", window_ms=900_000))  # not the earliest: no wake-up
        store.gate(call("t:early", window_ms=600_000))  # a join: no wake-up
        assert _wait_timed(listener, 1.0) >= 0.9
        thread = _later(0.3, lambda: store.flush(0, [("t:later", "")]))
        assert _wait_timed(listener, 30) < 15
        thread.join()
    finally:
        listener.close()


def test_a_listener_whose_connection_is_killed_subscribes_again_and_still_wakes(
    store: PostgresStore, database: str
) -> None:
    listener = store.wake_listener()
    try:
        listener.subscribe()
        assert listener._conn is not None
        pid = listener._conn.info.backend_pid
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # the wait that sees the connection fail returns early (a wake-up may be lost)
        assert _wait_timed(listener, 30) < 15
        assert not listener.subscribed
        thread = _later(0.5, lambda: store.gate(call("t:k", window_ms=600_000)))
        assert _wait_timed(listener, 30) < 15  # subscribed again, on a new connection
        thread.join()
        assert listener._conn is not None and listener._conn.info.backend_pid != pid
    finally:
        listener.close()


def test_a_listener_that_cannot_subscribe_sleeps_and_the_store_is_unavailable(
    make_store: Callable[..., PostgresStore], postgres_server: LocalPostgres, database: str
) -> None:
    proxy = PgProxy(postgres_server.port)
    through = make_store(
        database.replace(f"port={postgres_server.port}", f"port={proxy.port}"), max_size=1
    )
    proxy.close()  # nothing listens there now
    listener = through.wake_listener()
    assert _wait_timed(listener, 0.5) >= 0.4  # a plain sleep, no error
    assert not listener.subscribed


def _queued(store: PostgresStore, ident: str, left_ms: int) -> str:
    """A window published and acked whose message expires in ``left_ms``."""
    opened = store.gate(call(ident, window_ms=0))
    taken = [w for w in store.take(0, 10).windows if w.task_id == opened.task_id]
    assert taken
    assert store.ack(0, [opened.task_id]) == 1
    assert store.expiring(0, [(opened.task_id, left_ms)]) == 1
    return opened.task_id


def test_the_expiry_sweep_finishes_an_expired_queued_window_once_and_only_once(
    store: PostgresStore, database: str
) -> None:
    expired = _queued(store, "t:expired", 0)
    running = _queued(store, "t:running", 0)
    later = _queued(store, "t:later", 600_000)
    with psycopg.connect(database, autocommit=True) as conn:  # a worker runs it
        conn.execute(
            "UPDATE debounce_taken SET state = 'claimed', claim_until = "
            "clock_timestamp() + interval '1 hour' WHERE task_id = %s",
            (running,),
        )
    deadline = time.monotonic() + 30
    swept = store.expire(0)
    while not swept and time.monotonic() < deadline:  # past the grace
        time.sleep(0.2)
        swept = store.expire(0)
    assert swept == [(expired, [])]

    def state(task_id: str) -> tuple[object, ...]:
        with psycopg.connect(database, autocommit=True) as conn:
            row = conn.execute(
                "SELECT state, result_state, until FROM debounce_taken WHERE task_id = %s",
                (task_id,),
            ).fetchone()
        assert row is not None
        return tuple(row)

    finished = state(expired)
    assert finished[:2] == ("finished", "REVOKED")
    # returned again until its outcome is confirmed, never finished again
    assert store.expire(0) == [(expired, [])]
    assert state(expired) == finished
    store.expired(0, [expired])
    assert store.expire(0) == []
    assert state(expired) == finished
    assert state(running)[0] == "claimed"  # running: never touched
    assert state(later)[0] == "queued"  # not expired yet


def test_an_expired_window_records_its_callers_fixed_ids(store: PostgresStore) -> None:
    opened = store.gate(call("t:k", window_ms=0))
    store.gate(call("t:k", window_ms=0)._replace(task_id="B"), FixedId("B", '{"id": "B"}', False))
    store.take(0, 10)
    store.ack(0, [opened.task_id])
    store.expiring(0, [(opened.task_id, 0)])
    deadline = time.monotonic() + 30
    swept = store.expire(0)
    while not swept and time.monotonic() < deadline:
        time.sleep(0.2)
        swept = store.expire(0)
    assert swept == [(opened.task_id, [{"id": "B"}])]


def test_heartbeats_and_layouts_are_on_the_servers_clock_and_age_out(
    store: PostgresStore, database: str
) -> None:
    now = store.time_ms()
    assert store.liveness()[1:] == ([], [])
    assert abs(store.heartbeat("d1") - now) < 5000
    assert store.liveness()[1:] == ([("d1", store.liveness()[1][0][1])], [])
    store.heartbeat("d2", alive=False)
    at, alive, stopped = store.liveness()
    assert abs(at - now) < 5000 and [n for n, _ in alive] == ["d1"]
    assert [n for n, _ in stopped] == ["d2"] and all(ms <= at for _, ms in alive + stopped)
    store.heartbeat("d2")  # running again: no longer stopped
    assert [n for n, _ in store.liveness()[1]] == ["d1", "d2"] and not store.liveness()[2]
    store.heartbeat("d2", alive=False)
    with psycopg.connect(database, autocommit=True) as conn:
        beats = conn.execute(
            "SELECT name, alive FROM debounce_dispatchers ORDER BY name"
        ).fetchall()
    assert beats == [("d1", True), ("d2", False)]
    at, layouts = store.layouts(["a", "b"])
    assert abs(at - now) < 5000 and set(layouts) == {"a", "b"}
    assert all(abs(ms - at) < 1000 for ms in layouts.values())
    assert store.layouts()[1] == layouts  # a read writes nothing
    store.history_ttl_ms = 100
    time.sleep(0.3)
    assert set(store.layouts(["c"])[1]) == {"c"}
    store.heartbeat("d3")
    with psycopg.connect(database, autocommit=True) as conn:
        names = conn.execute("SELECT name FROM debounce_dispatchers").fetchall()
    assert names == [("d3",)]


def test_an_expiry_sweep_whose_reply_is_lost_is_not_sent_again(
    store: PostgresStore, make_store: Callable[..., PostgresStore], postgres_server: LocalPostgres
) -> None:
    del store  # migrated
    proxy = PgProxy(postgres_server.port)
    try:
        database = make_store().url
        through = make_store(
            database.replace(f"port={postgres_server.port}", f"port={proxy.port}"), max_size=1
        )
        assert through.expire(0) == []
        proxy.drop_next(b"debounce_expire")
        with pytest.raises(OutcomeUnknown, match="expire was lost"):
            through.expire(0)
    finally:
        proxy.close()


# -- the record sweep ----------------------------------------------------------------------


def _sql(database: str, query: str, *params: object) -> list[tuple[object, ...]]:
    with psycopg.connect(database, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def _taken_in(store: PostgresStore, database: str, state: str, past: bool, ident: str) -> str:
    """A taken window of ``ident`` set to ``state``, its ``until`` in the past (or an
    hour ahead)."""
    task_id = store.gate(call(ident, window_ms=0)).task_id
    assert task_id in {w.task_id for w in store.take(0, 50).windows}
    _sql(
        database,
        "UPDATE debounce_taken SET state = %s, until = clock_timestamp() + "
        "CASE WHEN %s THEN interval '-1 second' ELSE interval '1 hour' END "
        "WHERE task_id = %s",
        state,
        past,
        task_id,
    )
    return task_id


def test_the_record_sweep_deletes_records_past_their_ttl_in_batches_and_nothing_live(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    store = make_store(lease_ms=100)
    store.migrate()
    gone = [_taken_in(store, database, "finished", True, f"t:done{i}") for i in range(5)]
    kept = [_taken_in(store, database, "finished", False, "t:recent")]
    # a window in progress stays whatever its until says (a lapsed lease, a TTL passed)
    kept += [
        _taken_in(store, database, state, True, f"t:{state}")
        for state in ("dispatching", "queued", "claimed", "stale")
    ]
    quarantined = store.gate(call("t:bad", window_ms=0)).task_id
    store.take(0, 10)
    assert store.quarantine(0, quarantined, "cannot be published") == []
    kept.append(quarantined)  # kept for an operator (Redis: no TTL), past its lease too
    time.sleep(0.2)
    open_id = store.gate(call("t:done0", window_ms=600_000)).task_id  # an open window
    _sql(
        database,
        "INSERT INTO debounce_quiet (ident, task_id, first_seen, max_wait_ms, quiet_end) "
        "VALUES ('t:over', 'q1', clock_timestamp(), 1000, clock_timestamp() - interval '1s'),"
        " ('t:quiet', 'q2', clock_timestamp(), 60000, clock_timestamp() + interval '1 hour')",
    )

    def taken() -> set[object]:
        return {row[0] for row in _sql(database, "SELECT task_id FROM debounce_taken")}

    assert store.sweep(limit=2) == 3  # a batch: 2 records, 1 quiet period over
    assert len(taken() & set(gone)) == 3
    batches = 1
    while store.sweep(limit=2):
        batches += 1
    assert batches == 3  # 2 + 2 + 1 records
    assert taken() == set(kept)
    assert _sql(database, "SELECT ident FROM debounce_quiet") == [("t:quiet",)]
    assert _sql(database, "SELECT task_id FROM debounce_open") == [(open_id,)]
    states = dict(_sql(database, "SELECT task_id, state FROM debounce_taken"))
    assert store.sweep() == 0  # idempotent: nothing else goes
    assert dict(_sql(database, "SELECT task_id, state FROM debounce_taken")) == states
    assert states[quarantined] == "quarantined"


def test_the_dispatchers_expiry_sweep_runs_the_record_sweep(
    store: PostgresStore, database: str
) -> None:
    """The dispatcher calls ``expire`` periodically: finished records past their TTL
    leave the table there, as they leave Redis by their TTL."""
    old = _taken_in(store, database, "finished", True, "t:old")
    recent = _taken_in(store, database, "finished", False, "t:recent")
    assert store.expire(0) == []
    assert _sql(database, "SELECT task_id FROM debounce_taken") == [(recent,)]
    assert old != recent


# -- faults: typed errors within the timeout ----------------------------------------------


def _with_options(database: str, *settings: str) -> str:
    options = conninfo_to_dict(database).get("options", "")
    return make_conninfo(database, options=" ".join([str(options), *settings]))


def _every_write_refused(read_only: PostgresStore, opened: str) -> None:
    """Each write on ``read_only`` (the window ``opened`` of ``t:k`` exists) is
    :class:`ServerRefused`, all of them within 5 s."""
    started = time.monotonic()
    for attempt in (
        lambda: read_only.gate(call("t:k")),
        lambda: read_only.gate(call("t:new")),
        lambda: read_only.take(0, 10),
        lambda: read_only.ack(0, [opened]),
        lambda: read_only.flush(0, [("t:k", "")]),
        lambda: read_only.expire(0),
        lambda: read_only.sweep(),
        lambda: read_only.heartbeat("d1"),
    ):
        with pytest.raises(ServerRefused, match="read-only"):
            attempt()
    assert time.monotonic() - started < 5


def test_a_read_only_server_refuses_every_write_typed_and_writes_nothing(
    store: PostgresStore, make_store: Callable[..., PostgresStore], database: str
) -> None:
    """A standby, or ``default_transaction_read_only``: each write is
    :class:`ServerRefused` (a :class:`StoreUnavailable`: an outage for the dispatcher),
    at once, never a psycopg error; reads still answer."""
    opened = store.gate(call("t:k")).task_id
    read_only = make_store(_with_options(database, "-c default_transaction_read_only=on"))
    _every_write_refused(read_only, opened)
    assert read_only.ping() and read_only.pending(0, "t:k") is not None
    assert rows(database, "open") == [("t:k", opened, 1)] and rows(database, "taken") == []


def test_a_real_hot_standby_refuses_every_write_typed_and_its_dispatcher_polls(
    store: PostgresStore,
    make_store: Callable[..., PostgresStore],
    database: str,
    postgres_server: LocalPostgres,
) -> None:
    """A streaming hot standby of the session's server (``pg_basebackup -R``), not a
    setting: each write is :class:`ServerRefused` at once, the schema check and the
    reads answer, and a dispatcher's ``LISTEN`` (refused during recovery) is an outage:
    its wait is the poll's sleep."""
    opened = store.gate(call("t:k")).task_id
    standby = postgres_server.standby()
    try:
        on_standby = make_store(make_conninfo(database, port=standby.port))
        wait_until(lambda: on_standby.pending(0, "t:k") is not None, 30)  # replayed
        on_standby.check_server(outage_raises=True)  # the schema is the primary's
        _every_write_refused(on_standby, opened)
        listener = on_standby.wake_listener()
        with pytest.raises(StoreUnavailable):
            listener.subscribe()
        began = time.monotonic()
        listener.wait(0.3, threading.Event())  # no error: the poll's sleep
        assert 0.25 <= time.monotonic() - began < 3 and not listener.subscribed
        listener.close()
    finally:
        standby.cleanup()
    assert rows(database, "open") == [("t:k", opened, 1)] and rows(database, "taken") == []


@contextmanager
def _small_disk(megabytes: int) -> Iterator[Path]:
    """A tmpfs of ``megabytes`` owned by the server's user (root only: ``mount``)."""
    import os
    import pwd
    import subprocess
    import tempfile

    from celery_debounce.testing.postgres import SERVER_USER

    if os.geteuid() != 0:
        pytest.skip("filling a disk needs root (a tmpfs mount)")
    where = Path(tempfile.mkdtemp(prefix="celery-debounce-full-"))
    mounted = subprocess.run(
        # huge=never: a tmpfs with huge pages charges 2 MB for a file's first write
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,huge=never", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"no tmpfs mount here: {mounted.stderr.decode(errors='replace')}")
    try:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(where, user.pw_uid, user.pw_gid)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def test_a_full_disk_refuses_the_call_typed_and_writes_nothing_then_calls_go_on(
    store: PostgresStore, database: str
) -> None:
    """The open windows' table and indexes on a tmpfs (a tablespace) that a ballast file
    fills once the first window is open: then a new window's call is :class:`ServerRefused`
    (SQLSTATE 53100, disk full) within the timeout, nothing written; a call joining an open
    window still answers (an update in place); with room again (the ballast gone), the
    refused call goes through."""
    import os

    space = f"full_{uuid.uuid4().hex[:8]}"
    tables = ("debounce_open", "debounce_calls")
    indexes = ("debounce_open_pkey", "debounce_open_due", "debounce_open_task_id")
    # the ballast, not the mount's size, decides the room left: what a relation's first
    # write takes differs by server version and kernel (two CI runs found a 1 MB, then a
    # 2 MB tmpfs full at the first window's insert)
    with _small_disk(16) as where, psycopg.connect(database, autocommit=True) as admin:
        admin.execute(f"CREATE TABLESPACE {space} LOCATION '{where}'")  # names made here
        ballast = where / "ballast"
        try:
            for table in tables:
                admin.execute(f"ALTER TABLE {table} SET TABLESPACE {space}")
            for index in indexes:
                admin.execute(f"ALTER INDEX {index} SET TABLESPACE {space}")
            first = store.gate(call("t:first")).task_id
            room = os.statvfs(where)
            with ballast.open("wb") as out:
                out.write(b"\0" * max(0, room.f_bavail * room.f_frsize - 128 * 1024))
            body = b"[[], {}, {}]" + b" " * 1500  # under TOAST's threshold: in the heap
            refused = None
            for n in range(5000):
                started = time.monotonic()
                try:
                    store.gate(call(f"t:n{n}", payload=body))
                except ServerRefused as exc:
                    refused, took = (n, exc), time.monotonic() - started
                    break
            assert refused is not None, "the tablespace never filled"
            n, exc = refused
            assert "No space left on device" in str(exc) and took < 5, (exc, took)
            (found,) = admin.execute(
                "SELECT count(*) FROM debounce_open WHERE ident = %s", (f"t:n{n}",)
            ).fetchone()
            assert found == 0  # nothing written
            joined = store.gate(call("t:first"))  # a join: no new row needed
            assert joined.task_id == first and joined.calls == 2
            ballast.unlink()
            assert store.gate(call(f"t:n{n}", payload=body)).calls == 1
        finally:
            ballast.unlink(missing_ok=True)
            for index in indexes:
                admin.execute(f"ALTER INDEX {index} SET TABLESPACE pg_default")
            for table in tables:
                admin.execute(f"ALTER TABLE {table} SET TABLESPACE pg_default")
            admin.execute(f"DROP TABLESPACE {space}")


def _locked(
    database: str, ident: str, seconds: float, tables: tuple[str, ...] = ("debounce_open",)
) -> threading.Thread:
    """Another transaction holds the rows of ``ident`` in ``tables`` (by default its open
    window) for ``seconds``; at least one row must be there."""
    held = threading.Event()

    def hold() -> None:
        with psycopg.connect(database) as conn:
            found = []
            for table in tables:  # names of this module's, not user data
                query = f"SELECT 1 FROM {table} WHERE ident = %s FOR UPDATE"
                found += conn.execute(query, (ident,)).fetchall()
            assert found, "no row of the window to hold"
            held.set()
            time.sleep(seconds)
            conn.rollback()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(5)
    return thread


@pytest.mark.parametrize(
    ("options", "within"),
    [((), 1.0), (("-c statement_timeout=200",), 0.2)],
    ids=["the-stores-timeout", "a-shorter-server-timeout"],
)
def test_a_call_blocked_past_the_statement_timeout_is_unavailable_and_writes_nothing(
    store: PostgresStore,
    make_store: Callable[..., PostgresStore],
    database: str,
    options: tuple[str, ...],
    within: float,
) -> None:
    """A call the server cancels (``statement_timeout``: the store's ``timeout`` unless
    the server's is shorter) was undone: :class:`StoreUnavailable` within that timeout,
    not a lost reply, and nothing written."""
    opened = store.gate(call("t:k")).task_id
    bounded = make_store(_with_options(database, *options), timeout=1.0)
    bounded.ping()
    holder = _locked(database, "t:k", 4.0)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="statement timeout") as raised:
        bounded.gate(call("t:k"))
    assert within <= time.monotonic() - started < within + 1.5
    assert not isinstance(raised.value, OutcomeUnknown)
    holder.join()
    assert rows(database, "open") == [("t:k", opened, 1)]  # the join was undone
    assert bounded.gate(call("t:k")).calls == 2  # the store works on


def test_a_pool_that_cannot_give_a_connection_in_time_is_unavailable(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    """Every pooled connection busy past ``timeout``: :class:`StoreUnavailable` after
    about ``timeout``, nothing sent."""
    store = make_store(max_size=1, timeout=0.5)
    store.migrate()
    opened = store.gate(call("t:k")).task_id
    busy = store.pool.getconn()
    try:
        for attempt in (lambda: store.gate(call("t:k")), lambda: store.take(0, 10)):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="unreachable"):
                attempt()
            assert 0.4 <= time.monotonic() - started < 2.0
    finally:
        store.pool.putconn(busy)
    assert rows(database, "open") == [("t:k", opened, 1)] and rows(database, "taken") == []
    assert store.gate(call("t:k")).calls == 2


def test_a_pooled_connection_the_server_ended_while_idle_is_not_written_on(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    """The server ends the pool's idle connections (a restart's fast shutdown, an
    operator's ``pg_terminate_backend``: a FATAL error, then the close): the next write
    goes on a new connection and runs, never on an ended one, whose only reply would be
    that error (an outcome unknown)."""
    tagged = make_conninfo(database, application_name="ended-while-idle")
    store = make_store(tagged, max_size=4)
    store.migrate()
    first = store.gate(call("t:k", window_ms=600_000))
    with psycopg.connect(database, autocommit=True) as admin:
        mine = "SELECT pid FROM pg_stat_activity WHERE application_name = 'ended-while-idle'"
        ended = [pid for (pid,) in admin.execute(mine).fetchall()]
        assert ended  # the pool's connections
        for pid in ended:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_until(lambda: not admin.execute(mine).fetchall(), 10)
    joined = store.gate(call("t:k", window_ms=600_000))
    assert joined.task_id == first.task_id and joined.calls == 2


def test_gate_many_gates_each_call_in_order_and_a_refused_one_keeps_out_only_itself(
    store: PostgresStore, database: str
) -> None:
    """``enqueue_many``'s path: one outcome per call, in order; a call the store refuses
    (a collect call too large for an empty window) is that call's error, the calls after
    it are gated; ``on_chunk`` hears each chunk once it was answered."""
    chunks: list[range] = []
    store.max_payload_bytes = 200
    calls = [call("t:a"), collect_call("t:b", pad="x" * 200), call("t:a"), call("t:c")]
    out = store.gate_many(calls, chunk_size=2, on_chunk=chunks.append)
    assert chunks == [range(0, 2), range(2, 4)]
    first, refused, joined, other = out
    assert isinstance(first, GateResult) and first.opened
    assert isinstance(refused, PayloadTooLarge) and "=200" in str(refused)
    assert isinstance(joined, GateResult) and joined.task_id == first.task_id
    assert joined.calls == 2
    assert isinstance(other, GateResult) and other.opened
    assert rows(database, "open") == [("t:a", first.task_id, 2), ("t:c", other.task_id, 1)]


def test_gate_many_sends_a_chunk_in_one_statement_and_counts_every_call(
    store: PostgresStore, database: str
) -> None:
    """A chunk is one ``debounce_gate_many`` call: its calls are gated in ident order
    (the order among one ident's calls kept) and counted once, at its end."""
    a, b = window_ident("t", "a"), window_ident("t", "b")
    calls = [call(b, payload=b"[[1], {}, {}]", replace=True), call(a)]
    calls += [call(b, payload=b"[[2], {}, {}]", replace=True), call(a)]
    out = store.gate_many(calls, chunk_size=1000)
    assert [r.calls for r in out] == [1, 1, 2, 2]  # type: ignore[union-attr]
    (window,) = [w for w in drain(store) if w.ident == b]
    assert window.payload == b"[[2], {}, {}]"  # the later call replaced the earlier one
    assert store.snapshot(0, store.time_ms()).counters["i|t"] == 4


def test_concurrent_chunks_of_the_same_keys_in_opposite_orders_never_deadlock(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    """Two producers' chunks share their keys, each in the other's reverse order: both
    are answered (each chunk locks its windows in ident order), every call counted."""
    stores = [make_store(max_size=2) for _ in range(2)]
    stores[0].migrate()
    keys = [f"t:k{i:03d}" for i in range(200)]

    def produce(n: int) -> list[object]:
        order = keys if n % 2 == 0 else keys[::-1]
        return stores[n % 2].gate_many([call(k) for k in order], chunk_size=200)

    with ThreadPoolExecutor(2) as pool:
        results = [r for batch in pool.map(produce, range(8)) for r in batch]
    assert all(isinstance(r, GateResult) for r in results), [
        r for r in results if not isinstance(r, GateResult)
    ][:2]
    assert sorted(c for *_, c in rows(database, "open")) == [8] * 200


def test_gate_many_after_a_lost_reply_sends_nothing_more_and_says_so(
    make_store: Callable[..., PostgresStore], postgres_server: LocalPostgres, database: str
) -> None:
    """A chunk's reply lost: each of its calls is ``ReplyLost`` (the chunk ran whole or
    not at all), the calls after it are ``StoreUnavailable``, not sent; an outage at the
    first chunk, nothing written, is raised for the whole batch."""
    proxy = PgProxy(postgres_server.port)
    try:
        through = make_store(
            database.replace(f"port={postgres_server.port}", f"port={proxy.port}"), max_size=1
        )
        through.migrate()
        assert through.gate(call("t:warm")).opened
        proxy.drop_next(b"debounce_gate")
        *lost, unsent = through.gate_many([call("t:x"), call("t:y"), call("t:z")], chunk_size=2)
        assert all(isinstance(c, OutcomeUnknown) and worth_keeping(c) for c in lost)
        assert isinstance(unsent, StoreUnavailable) and "not sent" in str(unsent)
        # x and y ran together or not at all (never sent again); z was never sent
        opened = [r[0] for r in rows(database, "open")]
        assert opened in (["t:warm", "t:x", "t:y"], ["t:warm"])
        proxy.refuse()
        # the pool's connection made after the drop is closed now: probe it, so that
        # the call below cannot be sent on it before its close is seen (a lost reply)
        through.pool.check()
        with pytest.raises(StoreUnavailable):
            through.gate_many([call("t:refused")])
    finally:
        proxy.close()


@pytest.mark.timeout(30)  # a hang (the mutations without the watchdog) ends sooner
def test_a_server_that_stops_answering_fails_each_call_within_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that stops (SIGSTOP: its kernel still acknowledges bytes and keepalives,
    nothing answers): a write fails as ``OutcomeUnknown`` and a read as
    ``StoreUnavailable``, each within the store's timeout and a second, never a hang;
    once it runs again, calls are answered on new connections. A dispatcher's
    ``LISTEN`` on a server that stops is ``StoreUnavailable`` as soon."""
    server = LocalPostgres().start()
    store = PostgresStore(server.url(), timeout=1.0)
    try:
        store.migrate()
        first = store.gate(call("t:a"))
        server.freeze()
        try:
            for attempt, error in (
                (lambda: store.gate(call("t:a")), OutcomeUnknown),
                (lambda: store.pending(0, "t:a"), StoreUnavailable),
            ):
                started = time.monotonic()
                with pytest.raises(error):
                    attempt()
                assert time.monotonic() - started < 1.0 + 1.0 + 2.0  # timeout, grace, slack
        finally:
            server.thaw()

        def answered() -> bool:
            try:
                return store.pending(0, "t:a") is not None
            except StoreUnavailable:
                return False

        assert wait_until(answered, 20)
        joined = store.gate(call("t:a"))
        assert joined.task_id == first.task_id and joined.calls in (2, 3)  # the lost one ran?

        # a dispatcher's LISTEN: the server stops right after its connection was made
        connect = psycopg.connect

        def connect_then_freeze(*args: object, **kwargs: object) -> object:
            made = connect(*args, **kwargs)  # type: ignore[arg-type]
            server.freeze()
            return made

        listener = store.wake_listener()
        monkeypatch.setattr(psycopg, "connect", connect_then_freeze)
        started = time.monotonic()
        try:
            with pytest.raises(StoreUnavailable):
                listener.subscribe()
        finally:
            server.thaw()
            monkeypatch.undo()
        assert time.monotonic() - started < 1.0 + 1.0 + 2.0
        assert not listener.subscribed
    finally:
        store.close()
        server.cleanup()


def test_the_task_name_is_read_out_of_any_ident_and_a_malformed_one_fails_nothing(
    store: PostgresStore, database: str
) -> None:
    """``debounce_task_of`` agrees with ``keys.split_ident`` (UTF-8 lengths), and a
    malformed ident is NULL, never an error: the take that counts it takes the others."""
    names = ["t", "tâche.été", "任务", "a:b", ""]
    with psycopg.connect(database, autocommit=True) as conn:
        for name in names:
            (found,) = conn.execute(
                "SELECT debounce_task_of(%s)", (window_ident(name, "k:1"),)
            ).fetchone()
            assert found == (name or None) or (name == "" and found == "")
        for bad in ["", "x:y", "1:é:k", "99:short", "3:\u00e9t:k"]:
            (found,) = conn.execute("SELECT debounce_task_of(%s)", (bad,)).fetchone()
            assert found is None or isinstance(found, str)
        # a malformed window is taken and counted with the others, not in their way
        conn.execute(
            "INSERT INTO debounce_open (ident, task_id, first_seen, deadline, max_wait_ms, "
            "content_type, payload, options_json) VALUES ('1:é:k', 'bad', now(), now(), 0, "
            "'application/json', '[[], {}, {}]', '{}')"
        )
    good = store.gate(call(window_ident("t", "k"), window_ms=1, max_wait_ms=1))
    wait_until(lambda: store.time_ms() > good.deadline_ms, 5)
    assert sorted(w.task_id for w in store.take(0, 10).windows) == sorted(["bad", good.task_id])
    assert store.snapshot(0, store.time_ms()).counters["r|t"] == 1


def test_migrate_beside_a_session_idle_in_transaction_holds_calls_up_briefly_and_names_it(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    """Finding 7: a version-2 database, a report job idle in transaction after reading
    the windows. ``migrate(wait_s=2)`` retries its short lock waits, so a call beside
    it is held up well under 1.5 s; it gives up naming the session (pid, application,
    state), nothing changed; once the session ends, it migrates."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(pg_schema.schema_sql().encode())
        conn.execute(pg_schema.UPGRADES[1].encode())
        conn.execute("UPDATE debounce_schema SET version = 2")
    blocker = psycopg.connect(make_conninfo(database, application_name="report-job"))
    blocker.execute("SELECT count(*) FROM debounce_open")  # idle in transaction from now
    pid = blocker.info.backend_pid
    slowest = [0.0]
    done = threading.Event()

    def call_beside() -> None:
        with psycopg.connect(database, autocommit=True) as conn:
            while not done.is_set():
                started = time.monotonic()
                conn.execute("SELECT count(*) FROM debounce_open").fetchone()
                slowest[0] = max(slowest[0], time.monotonic() - started)
                time.sleep(0.02)

    caller = threading.Thread(target=call_beside, daemon=True)
    caller.start()
    store = make_store()
    started = time.monotonic()
    try:
        with pytest.raises(pg_schema.MigrationBlocked) as raised:
            store.migrate(wait_s=2.0)
        assert 2.0 <= time.monotonic() - started < 6.0
    except BaseException:
        blocker.close()  # the test failed: let the schema be dropped
        raise
    finally:
        done.set()
        caller.join(5)
    message = str(raised.value)
    assert f"pid {pid} (application 'report-job', idle in transaction, since" in message
    assert [b[0] for b in raised.value.blockers] == [pid]
    assert slowest[0] < 1.5, slowest[0]
    with psycopg.connect(database, autocommit=True) as conn:
        assert conn.execute("SELECT version FROM debounce_schema").fetchone() == (2,)
    blocker.rollback()
    blocker.close()
    assert store.migrate(wait_s=2.0) == (2, SCHEMA_VERSION)


def test_a_migration_that_changes_no_held_table_goes_through_beside_live_sessions(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    """Steps that change no table a session holds (version 4 to 5: none; 5 to 6: a new
    table; then the functions applied again) take no lock on the windows' tables: they
    go through at once beside a session idle in transaction that read the windows (a
    change of its tables would wait for it), and calls go on after them."""
    store = make_store()
    store.migrate()
    assert store.gate(call("tasks.t:before")).opened
    with psycopg.connect(database, autocommit=True) as conn:  # back to version 4
        conn.execute("DROP TABLE debounce_tasks")
        conn.execute("UPDATE debounce_schema SET version = 4")
    reader = psycopg.connect(make_conninfo(database, application_name="report-job"))
    reader.execute("SELECT count(*) FROM debounce_open").fetchone()  # idle in transaction
    try:
        started = time.monotonic()
        assert make_store().migrate(wait_s=2.0) == (4, SCHEMA_VERSION)
        assert time.monotonic() - started < 1.5
        assert make_store().gate(call("tasks.t:after")).opened
    finally:
        reader.close()


def test_the_session_server_is_the_postgresql_this_pass_declares(
    postgres_server: LocalPostgres,
) -> None:
    """scripts/test.sh's PostgreSQL 18 pass sets CELERY_DEBOUNCE_PG_EXPECT_MAJOR: the
    server its tests ran on is that version (not the main run's 15 again). Without it
    (the main run, a corner's PostgreSQL selection, where a skip fails the corner), the
    server is one the schema supports."""
    import os

    expected = os.environ.get("CELERY_DEBOUNCE_PG_EXPECT_MAJOR")
    with psycopg.connect(postgres_server.url()) as conn:
        major = conn.info.server_version // 10000
    if expected:
        assert major == int(expected)
    else:
        assert major >= pg_schema.MIN_SERVER_VERSION


@pytest.mark.parametrize("how", ["due", "flushed"])
def test_a_take_skips_a_due_window_another_transaction_holds_and_returns_the_others_at_once(
    store: PostgresStore, database: str, how: str
) -> None:
    """The take locks with ``SKIP LOCKED``: one due window's row held by another
    transaction (an operator's cancel, a slow gate) keeps only that one back; the
    others are taken at once, not after the holder lets go. Windows due by their
    deadline (still open) and flushed ones (closed, waiting in the taken table)."""
    for key in ("a", "b", "c"):
        store.gate(call(f"t:{key}", window_ms=50, max_wait_ms=1_000))
        if how == "flushed":
            store.flush(0, [(f"t:{key}", "")])
    time.sleep(0.1)  # every deadline passed
    holder = _locked(database, "t:b", 3.0, ("debounce_open", "debounce_taken"))
    started = time.monotonic()
    taken = store.take(0, 10).windows
    assert time.monotonic() - started < 1.0
    assert sorted(w.record.ident for w in taken) == ["t:a", "t:c"]
    holder.join()
    assert [w.record.ident for w in store.take(0, 10).windows] == ["t:b"]


def test_a_bulk_chunk_waiting_on_one_calls_lock_gives_the_later_calls_their_whole_window(
    store: PostgresStore, database: str
) -> None:
    """``gate_many``: the chunk's first call waits 1.5 s on a row another transaction
    holds; the chunk's later call, a new window of 3 s, gets its 3 s from when it
    was gated (the server's clock as each call runs, not the transaction's start)."""
    store.gate(call("t:held"))
    holder = _locked(database, "t:held", 1.5)
    outcomes = store.gate_many([call("t:held"), call("t:later", window_ms=3_000)])
    holder.join()
    later = outcomes[1]
    assert isinstance(later, GateResult), later
    left_ms = later.deadline_ms - store.time_ms()  # the server's clock, after the wait
    assert 2_700 <= left_ms <= 3_000, left_ms


def _backend_alive(database: str, pid: int) -> bool:
    with psycopg.connect(database, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        return bool(row.fetchone()[0])  # type: ignore[index]


def _open_blocks(database: str) -> int:
    """Blocks of ``debounce_open`` and its indexes read or found in the cache so far
    (flushed statistics only)."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT heap_blks_read + heap_blks_hit + coalesce(idx_blks_read, 0) + "
            "coalesce(idx_blks_hit, 0) FROM pg_statio_user_tables WHERE relname = "
            "'debounce_open' AND schemaname = current_schema()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_call_under_a_held_snapshot_reads_no_window_churned_long_ago(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    """Under a snapshot held open (a ``pg_dump``, a report idle in transaction), the
    windows taken since stay in the due index until the snapshot ends. A call that opens
    a window asks whether an earlier deadline is open: that scan reads only recent
    deadlines, not every window churned since the snapshot (20,000 here, 483 blocks: the
    unbounded scan read them all, and bulk calls ran past their timeout after
    200,000)."""
    make_store().migrate()
    held = psycopg.connect(database)
    try:
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held.execute("SELECT count(*) FROM debounce_schema").fetchone()  # the snapshot
        with psycopg.connect(database, autocommit=True) as conn:
            churner = conn.info.backend_pid
            conn.execute(  # 20,000 windows due a minute ago, then taken (deleted)
                "INSERT INTO debounce_open (ident, task_id, first_seen, deadline, "
                "max_wait_ms, content_type, payload, options_json) SELECT 'tasks.t:' || i, "
                "'gone-' || i, now() - interval '2 minutes', now() - interval '1 minute' "
                "+ i * interval '1 millisecond', 60000, 'application/json', '\\x00', '{}' "
                "FROM generate_series(1, 20000) AS i"
            )
            conn.execute("DELETE FROM debounce_open")
        # a backend flushes its statistics as it exits (not when its client has gone):
        # count from after that
        wait_until(lambda: not _backend_alive(database, churner), 10)
        before = _open_blocks(database)
        store = make_store()
        assert store.gate(call("tasks.t:new")).opened
        store.close()  # its backend ends: its statistics are flushed
        assert wait_until(lambda: _open_blocks(database) > before, 10)
        touched = _open_blocks(database) - before
        assert touched < 50, touched
    finally:
        held.close()


def test_migrate_refused_by_the_server_is_a_typed_error_naming_it(
    make_store: Callable[..., PostgresStore], database: str
) -> None:
    """A migration the server refuses for another reason than an outage or a missing
    right (here another application's table of the same name in the schema) is a
    ``DebounceConfigError`` naming the server's reason, never a raw psycopg error, and
    nothing is created."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("CREATE TABLE debounce_open (theirs int)")
    with pytest.raises(DebounceConfigError, match=r'could not be migrated: .*"debounce_open"'):
        make_store().migrate()
    assert make_store().schema_version() is None


def test_a_caller_one_call_at_a_time_stays_on_one_backend_of_several_idle(
    make_store: Callable[..., PostgresStore],
) -> None:
    """The pool hands out the connection returned last (reuse.py): with three idle
    connections a sequential caller keeps one warm backend instead of going round them."""
    store = make_store(min_size=3, max_size=3)
    store.pool.wait()
    assert store.pool.get_stats()["pool_available"] == 3

    def backend(conn: psycopg.Connection[object]) -> int:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return int(row[0])

    pids = [store._read(backend) for _ in range(6)]
    assert len(set(pids)) == 1, pids
