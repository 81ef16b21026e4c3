"""A held snapshot against the PostgreSQL store (row 12i).

``python -m bench.pg_snapshot [--windows 1000000] [--steps 4] [--max-seconds 1200]``
starts a private PostgreSQL server, holds a ``REPEATABLE READ`` snapshot open in another
session (as ``pg_dump`` does for its whole run), and churns windows through the store:
each opened (``gate_many``, chunks of 1,000), taken and acknowledged, as a dispatcher
does. No row a deletion or an update left behind can be vacuumed while the snapshot is
held. At each step it times an empty take and a call of a new key (medians of 200),
then once more after the snapshot is released and ``VACUUM`` ran. Prints milliseconds
beside the figures before any churn, measured in the same run. ``--max-seconds`` ends
the churn early (the figures then say how far it got).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

import psycopg

from bench.pg_session import gate_call
from celery_debounce.store.postgres import PostgresStore
from celery_debounce.testing.postgres import LocalPostgres

CHUNK = 1000
SAMPLES = 200


def _median_ms(run: Any) -> float:
    times = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _measure(store: PostgresStore) -> tuple[float, float]:
    """An empty take's and a new key's call's median ms (the calls' windows cancelled
    after, so the next take is empty again)."""
    empty = _median_ms(lambda: store.take(0, 500))
    keys: list[str] = []

    def gate() -> None:
        key = uuid.uuid4().hex
        keys.append(key)
        store.gate(gate_call(key, 3_600_000, 7_200_000))

    call = _median_ms(gate)
    with psycopg.connect(store.url, autocommit=True) as conn:
        conn.execute("DELETE FROM debounce_open WHERE ident LIKE '7:bench.t:%'")
    return empty, call


def _churn(store: PostgresStore, windows: int) -> None:
    for _ in range(windows // CHUNK):
        store.gate_many([gate_call(uuid.uuid4().hex, 1, 2) for _ in range(CHUNK)])
        time.sleep(0.002)  # every window due
        while taken := store.take(0, 500).windows:
            store.ack(0, [w.task_id for w in taken])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-seconds", type=float, default=1200.0)
    args = parser.parse_args()
    with LocalPostgres() as server, PostgresStore(server.url(), timeout=30.0) as store:
        store.migrate()
        base_take, base_call = _measure(store)
        print(f"{'windows churned':>16} {'empty take ms':>14} {'new-key call ms':>16}")
        print(f"{0:>16,} {base_take:>14.2f} {base_call:>16.2f}   (no snapshot held)")
        holder = psycopg.connect(server.url())
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pg_class").fetchone()  # the snapshot is taken
        started = time.monotonic()
        churned = 0
        step = max(CHUNK, args.windows // max(1, args.steps))
        while churned < args.windows and time.monotonic() - started < args.max_seconds:
            _churn(store, step)
            churned += step
            empty, call = _measure(store)
            print(
                f"{churned:>16,} {empty:>14.2f} {call:>16.2f}   "
                f"({empty / base_take:.1f}x, {call / base_call:.1f}x; snapshot held, "
                f"{time.monotonic() - started:.0f} s)",
                flush=True,
            )
        holder.rollback()
        holder.close()
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("VACUUM debounce_open, debounce_taken")
        empty, call = _measure(store)
        print(f"{churned:>16,} {empty:>14.2f} {call:>16.2f}   (released, VACUUM ran)")


if __name__ == "__main__":
    main()
