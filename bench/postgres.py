"""Benchmark 12: ``.delay()`` with the windows in PostgreSQL against plain ``.delay()``.

One sequential producer, calls interleaved round by round: a hot key (every call joins
one open window), a new key per call (every call opens a window), plain ``.delay()``
of the same arguments to the same Redis broker, and (row 12g) BullMQ's debounce-mode
``add`` on its PostgreSQL backend, in the same server and rounds
(``bench/peer/bullmq_producer.js``, installed as for ``python -m bench.bullmq``). The
PostgreSQL server is a private one (celery_debounce/testing/postgres.py) with
``fsync``, ``synchronous_commit`` and ``full_page_writes`` on, as on a production
server (the test servers turn them off): a call's commit is on disk when it returns.

    python -m bench.postgres [--rounds 7] [--calls 2000] [--open 100000] [--churn 1000000]
    python -m bench.postgres --only-churn   # row 12e alone (about 8 minutes)
    python -m bench.postgres --only-rates   # rows 12 and 12g alone
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import redis
from celery import Celery

from bench.harness import Row, compare, interleaved, table
from celery_debounce import enqueue_many

if TYPE_CHECKING:
    from bench.bullmq import NodeProducer
    from celery_debounce.store.postgres import PostgresStore

_ids = itertools.count()
#: A production server's durability (the test servers turn these off): a call's commit
#: returns once its WAL is on disk.
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


@contextmanager
def _migrated(
    redis_url: str, **server_settings: str
) -> Iterator[tuple[PostgresStore, dict[str, object]]]:
    """A private PostgreSQL server (:data:`DURABLE`, and ``server_settings``)
    with the schema: a store on it (closed after), and the settings that point a bench
    app's windows at it."""
    from celery_debounce.store.postgres import PostgresStore
    from celery_debounce.testing.postgres import LocalPostgres

    with LocalPostgres(settings={**DURABLE, **server_settings}) as server:
        store = PostgresStore(server.url())
        try:
            store.migrate()
            yield store, {"debounce_redis_url": None, "debounce_store_url": server.url()}
        finally:
            store.close()


def postgres_rates(redis_url: str, rounds: int, n: int, bullmq: bool = True) -> list[Row]:
    """The rows of benchmark 12 (and 12g with ``bullmq``: npm installs BullMQ and pg
    into the bench cache); ``redis_url`` is the broker's server."""
    from bench.apps import make_app
    from bench.bullmq import SCRIPT, NodeProducer, bullmq_version, install

    with _migrated(redis_url) as (store, conf):
        if not bullmq:
            return _rates(make_app(redis_url, **conf), rounds, n, None)
        cache = install()
        bull = NodeProducer(SCRIPT, redis_url, cache, 0, env={"BENCH_PG_URL": store.url})
        try:
            rows = _rates(make_app(redis_url, **conf), rounds, n, bull)
            with store.pool.connection() as conn:
                row = conn.execute("SELECT count(*) FROM bullmq.job").fetchone()
        finally:
            bull.close()
    # every "new" add made a job; all the "hot" ones together made one
    jobs = int(row[0]) if row else 0
    expected = 1 + (rounds + 1) * n
    if jobs != expected:
        raise RuntimeError(f"BullMQ made {jobs} jobs, expected {expected}: no debounce?")
    for r in rows:
        r.baseline = r.baseline.replace("BullMQ", f"BullMQ {bullmq_version(cache)}")
    return rows


def _rates(app: Celery, rounds: int, n: int, bull: NodeProducer | None) -> list[Row]:
    debounced = app.tasks["bench.debounced"]
    plain = app.tasks["bench.plain"]
    broker = redis.Redis.from_url(app.conf.broker_url)

    def plain_delay(n: int) -> None:
        for _ in range(n):
            plain.delay("u1", n=1)

    def hot(n: int) -> None:
        for _ in range(n):
            debounced.delay("hot", n=1)

    def new(n: int) -> None:
        for _ in range(n):
            debounced.delay(f"p{next(_ids)}", n=1)

    def bulk(n: int) -> None:
        enqueue_many(debounced, [((f"b{next(_ids)}",), {"n": 1}) for _ in range(n)])

    subjects: dict[str, Callable[[int], object]] = {
        "plain": plain_delay,
        "hot": hot,
        "new": new,
        "bulk": bulk,
    }
    if bull is not None:
        subjects.update(
            bull_hot=lambda n: bull.run("hot", n), bull_new=lambda n: bull.run("new", n)
        )
    debounced.delay("hot", n=1)  # open the hot window (BullMQ's opened at its start)
    for warm in subjects.values():  # one round unmeasured: JITs, plans, pools
        warm(n)
    r = interleaved(rounds, n, subjects, before=broker.flushdb)
    broker.flushdb()
    note = "windows in PostgreSQL (fsync and synchronous_commit on), broker on Redis"
    rows = [
        compare(
            "12",
            "PostgreSQL: hot key .delay()",
            r["hot"],
            "plain .delay()",
            r["plain"],
            2,
            note=note,
        ),
        compare(
            "12",
            "PostgreSQL: new key .delay()",
            r["new"],
            "plain .delay()",
            r["plain"],
            2,
            note=note,
        ),
        compare(
            "12f",
            "PostgreSQL: enqueue_many, new keys",
            r["bulk"],
            "PostgreSQL: new key .delay()",
            r["new"],
            None,
            note="a chunk of 1,000 calls in one debounce_gate_many call",
        ),
    ]
    if bull is None:
        return rows
    return [
        *rows,
        compare(
            "12g",
            "PostgreSQL: hot key .delay()",
            r["hot"],
            "BullMQ debounce add, its PostgreSQL backend",
            r["bull_hot"],
            1.2,
            note="same server and rounds; BullMQ: deduplication {extend, replace}, one job",
        ),
        compare(
            "12g",
            "PostgreSQL: new key .delay()",
            r["new"],
            "BullMQ debounce add, its PostgreSQL backend",
            r["bull_new"],
            1.2,
            note="same server and rounds; BullMQ: a new deduplication id per add",
        ),
    ]


def drain_rates(redis_url: str, rounds: int, backlog: int) -> list[Row]:
    """Benchmark 12b: a backlog of ``backlog`` due windows in PostgreSQL drained by 4
    dispatchers (threads of one process, each its own store and connections) against 1;
    the rate is windows published per second until the backlog is gone."""
    import threading
    import time

    from bench.apps import make_app
    from celery_debounce import Dispatcher, enqueue_many

    with _migrated(redis_url) as (_, conf):
        app = make_app(redis_url, **conf)
        broker = redis.Redis.from_url(app.conf.broker_url)
        debounced = app.tasks["bench.debounced"]

        def drain(dispatchers: int) -> float:
            broker.flushdb()
            calls = [((f"d{next(_ids)}",), {"n": 1}) for _ in range(backlog)]
            enqueue_many(debounced, calls, debounce="1ms", debounce_max_wait="1ms")
            time.sleep(0.01)
            apps = [make_app(redis_url, **conf) for _ in range(dispatchers)]
            workers = [Dispatcher(a, name=f"bench-{i}") for i, a in enumerate(apps)]
            done = [0] * dispatchers

            def run(i: int) -> None:
                while True:
                    published, _ = workers[i].dispatch_once()
                    done[i] += published
                    if not published:
                        return

            threads = [threading.Thread(target=run, args=(i,)) for i in range(dispatchers)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            took = time.perf_counter() - start
            for w in workers:
                w.close()
            if sum(done) != backlog or broker.llen("celery") != backlog:
                raise RuntimeError(f"drained {sum(done)} of {backlog}")
            return backlog / took

        one: list[float] = []
        four: list[float] = []
        for _ in range(rounds):
            one.append(drain(1))
            four.append(drain(4))
        broker.flushdb()
    return [
        compare(
            "12b",
            f"PostgreSQL: {backlog:,} due windows drained by 4 dispatchers",
            four,
            "1 dispatcher",
            one,
            1,
            unit="msgs/s",
            note="dispatchers are threads of one process (2 cores), broker on Redis",
        )
    ]


def lateness(redis_url: str, rate: int, seconds: float) -> list[Row]:
    """Benchmark 12c: ``rate`` windows a second opened in PostgreSQL, each due 500 ms
    later, with a dispatcher running (its ``LISTEN`` wake-up on): deadline -> the take
    that leases it for publishing (``taken_at``, the server's clock; the publish follows
    in the same pass)."""
    import time

    from bench.apps import make_app
    from bench.harness import percentile
    from bench.lateness import paced
    from celery_debounce import Dispatcher

    with _migrated(redis_url) as (schema, conf):
        app = make_app(redis_url, **conf)
        broker = redis.Redis.from_url(app.conf.broker_url)
        broker.flushdb()
        debounced = app.tasks["bench.debounced"]
        dispatcher = Dispatcher(app, name="bench-lateness")
        dispatcher.start()
        try:
            total = paced(
                rate,
                seconds,
                lambda i: debounced.apply_async(
                    (f"l{i}",), debounce="500ms", debounce_max_wait="60s"
                ),
            )
            deadline = time.monotonic() + 60
            late: list[float] = []
            while time.monotonic() < deadline:
                with schema.pool.connection() as conn:
                    late = [
                        float(ms)
                        for (ms,) in conn.execute(
                            "SELECT debounce_ms(taken_at) - debounce_ms(deadline) "
                            "FROM debounce_taken"
                        ).fetchall()
                    ]
                if len(late) >= total:
                    break
                time.sleep(0.2)
        finally:
            dispatcher.stop()
            broker.flushdb()
    if len(late) < total:
        raise RuntimeError(f"{total - len(late)} windows never taken")
    rows = []
    for q, limit in (("p50", 10.0), ("p99", 50.0)):
        row = Row(
            "12c",
            f"PostgreSQL: deadline -> taken for publishing {q}, {rate}/s",
            "ms",
            [percentile(late, 50 if q == "p50" else 99)],
            target=f"<= {limit:g} ms",
        )
        row.passed = row.median <= limit
        rows.append(row)
    rows[0].note = f"{len(late)} windows, worst {max(late):.0f} ms; LISTEN/NOTIFY wake-up on"
    return rows


def storage(redis_url: str, count: int) -> list[Row]:
    """Benchmark 12d: bytes per open window in PostgreSQL (``debounce_open``'s table,
    TOAST and indexes, ``pg_total_relation_size``, after ``VACUUM``) at ``count`` open
    windows, against the Redis store's bytes per open window (``used_memory``) for the
    same calls, in the same run."""
    from bench.apps import make_app
    from bench.memory import bytes_per_open_window, open_windows

    on_redis = bytes_per_open_window(make_app(redis_url), redis_url, count)["info_per_window"]
    with _migrated(redis_url) as (schema, conf):
        open_windows(make_app(redis_url, **conf), count, "user-")  # 1 h windows: all stay open
        with schema.pool.connection() as conn:  # autocommit: VACUUM runs outside a transaction
            conn.execute("VACUUM ANALYZE debounce_open")
            measured = conn.execute(
                "SELECT pg_total_relation_size('debounce_open'), count(*) FROM debounce_open"
            ).fetchone()
        assert measured is not None
        size, rows = measured
    if rows != count:
        raise RuntimeError(f"expected {count} open windows, found {rows}")
    row = Row(
        "12d",
        f"PostgreSQL: bytes per open window ({count:,} open)",
        "bytes",
        [size / count],
        "Redis store, same calls",
        on_redis,
    )
    row.ratio = row.median / on_redis
    row.note = "table, TOAST and indexes after VACUUM; Redis: used_memory growth"
    return [row]


#: One call's body (a key argument, the embed), as a producer writes it.
_BODY = json.dumps([["user-1"], {}, {"callbacks": None, "errbacks": None, "chain": None}])
#: ``debounce_gate`` for the windows ``g`` of ``generate_series(first, last)``: idents
#: ``<prefix><g>``, ids ``<prefix>-<g>``, the given window and max wait (ms).
_GATE_SERIES = (
    "SELECT count(*) FROM generate_series(%s::bigint, %s::bigint) AS g, LATERAL "
    "debounce_gate('bench.t:' || %s || g, %s || '-' || g, %s, %s, 'application/json', "
    "%s, '{}', false, false, NULL, NULL, NULL, false, 8, NULL, '') AS x"
)
_CLAIM_ALL = (
    "SELECT count(*) FROM unnest(%s::text[]) AS t, LATERAL debounce_claim(t, 60000, false, false)"
)
_FINISH_ALL = (
    "SELECT count(*) FROM unnest(%s::text[]) AS t, LATERAL debounce_finish(t, 'SUCCESS', 1)"
)
_SIZE = (
    "SELECT pg_total_relation_size('debounce_open') + pg_total_relation_size('debounce_taken') "
    "+ pg_total_relation_size('debounce_quiet')"
)


def churn(live: int, total: int, naptime: str, batch: int = 5_000) -> list[Row]:
    """Benchmark 12e: the window tables' size after ``total`` windows went through their
    whole life (opened, taken, published, claimed, finished, swept) while ``live``
    windows stayed open, against the size of those ``live`` windows alone, in the same
    run. Each step is the store's own function (``debounce_gate``, ``debounce_take``,
    ``debounce_ack``, ``debounce_claim``, ``debounce_finish``, ``debounce_sweep``),
    called for a batch of windows in one statement; autovacuum runs as configured (the
    tables' own thresholds, the server's ``autovacuum_naptime``), and a plain ``VACUUM``
    (what autovacuum runs; never ``FULL``) ends the run before the size is read.

    Dead index entries pile up between two autovacuum rounds (a window's state changes
    are not HOT updates: ``state`` is indexed), and an index keeps the pages it grew
    to: the size is set by how many windows go through between rounds, the naptime
    times the rate (here the most this machine does)."""
    import psycopg

    body = _BODY.encode()
    with (
        _migrated("", autovacuum_naptime=naptime) as (store, _),
        psycopg.connect(store.url, autocommit=True) as batches,
    ):
        batches.execute("SET statement_timeout = 0")  # a batch is many calls in one

        def run(query: str, args: tuple[object, ...]) -> int:
            row = batches.execute(query, args).fetchone()
            return int(row[0]) if row and row[0] is not None else 0

        def size() -> int:
            batches.execute("VACUUM ANALYZE debounce_open, debounce_taken, debounce_quiet")
            return run(_SIZE, ())

        run(_GATE_SERIES, (1, live, "live", "live", 3_600_000, 7_200_000, body))
        live_size = size()
        started = time.perf_counter()
        for first in range(1, total + 1, batch):
            last = min(first + batch - 1, total)
            opened = run(_GATE_SERIES, (first, last, "c", "c", 1, 1000, body))
            time.sleep(0.002)  # every window of the batch due
            ids: list[str] = []
            while len(ids) < opened:
                ids += [w.task_id for w in store.take(0, batch).windows]
            store.ack(0, ids)
            assert run(_CLAIM_ALL, (ids,)) == len(ids)
            run(_FINISH_ALL, (ids,))
            time.sleep(0.005)  # every record past its 1 ms history
            while run("SELECT debounce_sweep(%s)", (batch,)) >= batch:
                pass
        seconds = time.perf_counter() - started
        left = run("SELECT count(*) FROM debounce_taken", ())
        open_now = run("SELECT count(*) FROM debounce_open", ())
        after = size()
    if open_now != live or left != 0:
        raise RuntimeError(f"expected {live} open windows and no records, {open_now}, {left}")
    row = Row(
        "12e",
        f"PostgreSQL: window tables after {total:,} windows' whole life, {live:,} open, "
        f"autovacuum_naptime {naptime}",
        "bytes",
        [float(after)],
        f"the {live:,} open windows alone, same run",
        float(live_size),
    )
    row.ratio = after / live_size
    row.target = "<= 2x"
    row.passed = row.ratio <= 2.0
    row.note = (
        f"{total / seconds:,.0f} windows/s through their life; table, TOAST and indexes "
        "after a plain VACUUM"
    )
    return [row]


def churns(live: int, total: int) -> list[Row]:
    """Row 12e with PostgreSQL's default naptime (1 min) and with the 10 s
    docs/stores.md recommends for this store."""
    rows = churn(live, total, "10s") + churn(live, total, "60s")
    rows[1].bench, rows[1].target, rows[1].passed = "12e'", "", None
    return rows


def main(argv: list[str] | None = None) -> int:
    from celery_debounce.testing.servers import LocalRedis

    parser = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--open", type=int, default=100_000)
    parser.add_argument("--churn", type=int, default=1_000_000)
    parser.add_argument("--only-churn", action="store_true", help="only row 12e")
    parser.add_argument("--only-rates", action="store_true", help="only rows 12 and 12g")
    args = parser.parse_args(argv)
    if args.only_churn:
        print(table(churns(args.open, args.churn)))
        return 0
    if args.only_rates:
        with LocalRedis() as server:
            print(table(postgres_rates(server.url, args.rounds, args.calls)))
        return 0
    with LocalRedis() as server:
        rows = postgres_rates(server.url, args.rounds, args.calls)
        rows += drain_rates(server.url, min(args.rounds, 3), args.backlog)
        rows += lateness(server.url, 500, 4.0)
        rows += storage(server.url, args.open)
    rows += churns(args.open, args.churn)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
