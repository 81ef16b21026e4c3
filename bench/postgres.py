"""Benchmark 12: ``.delay()`` with the windows in PostgreSQL against plain ``.delay()``.

One sequential producer, calls interleaved round by round: a hot key (every call joins
one open window), a new key per call (every call opens a window), and plain ``.delay()``
of the same arguments to the same Redis broker. The PostgreSQL server is a private one
(celery_debounce/testing/postgres.py, ``synchronous_commit`` on: a call's commit is
flushed to the WAL before it returns, as a production server's is).

    python -m bench.postgres [--rounds 7] [--calls 2000]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import redis
from celery import Celery

from bench.harness import Row, compare, interleaved, table

if TYPE_CHECKING:
    from celery_debounce.store.postgres import PostgresStore

_ids = itertools.count()


@contextmanager
def _migrated(redis_url: str) -> Iterator[tuple[PostgresStore, dict[str, object]]]:
    """A private PostgreSQL server (``synchronous_commit`` on) with the schema: a store
    on it (closed after), and the settings that point a bench app's windows at it."""
    from celery_debounce.store.postgres import PostgresStore
    from celery_debounce.testing.postgres import LocalPostgres

    with LocalPostgres(settings={"synchronous_commit": "on"}) as server:
        store = PostgresStore(server.url())
        try:
            store.migrate()
            yield store, {"debounce_redis_url": None, "debounce_store_url": server.url()}
        finally:
            store.close()


def postgres_rates(redis_url: str, rounds: int, n: int) -> list[Row]:
    """The rows of benchmark 12; ``redis_url`` is the broker's server."""
    from bench.apps import make_app

    with _migrated(redis_url) as (_, conf):
        return _rates(make_app(redis_url, **conf), rounds, n)


def _rates(app: Celery, rounds: int, n: int) -> list[Row]:
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

    debounced.delay("hot", n=1)  # open the hot window
    r = interleaved(
        rounds, n, {"plain": plain_delay, "hot": hot, "new": new}, before=broker.flushdb
    )
    broker.flushdb()
    note = "windows in PostgreSQL (synchronous_commit on), broker on Redis"
    return [
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


def main(argv: list[str] | None = None) -> int:
    from celery_debounce.testing.servers import LocalRedis

    parser = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--backlog", type=int, default=5000)
    parser.add_argument("--open", type=int, default=100_000)
    args = parser.parse_args(argv)
    with LocalRedis() as server:
        rows = postgres_rates(server.url, args.rounds, args.calls)
        rows += drain_rates(server.url, min(args.rounds, 3), args.backlog)
        rows += lateness(server.url, 500, 4.0)
        rows += storage(server.url, args.open)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
