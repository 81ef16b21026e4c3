"""What keeping nothing on a PostgreSQL session costs a call (row 12h).

``python -m bench.pg_session [--rounds 5] [--calls 1500]`` starts a private, durable
PostgreSQL server (``fsync``, ``synchronous_commit`` and ``full_page_writes`` on) and
times the store's gate of new keys, one sequential producer, in interleaved rounds:

- as the store sends it: the call's settings (``statement_timeout``, the counters'
  settings) and the call as one simple query, one transaction, values bound by the
  client, nothing prepared on the server (what makes it safe behind PgBouncer in
  transaction mode);
- the settings and the call in a psycopg pipeline (the store's way before: a Flush
  after its Sync can hold a PgBouncer 1.18 server connection);
- the call alone, without the settings statement (what a session-level setting allowed);
- the call alone, pipelined (the pipeline's own cost).

Prints the median calls/s of each and the ratios, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from celery_debounce.producer.call import PreparedCall
from celery_debounce.producer.options import DebounceSpec
from celery_debounce.store.postgres import PostgresStore, sending
from celery_debounce.testing.postgres import LocalPostgres

DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


def gate_call(key: str, window_ms: int = 600_000, max_wait_ms: int = 3_600_000) -> PreparedCall:
    """A gate call of task ``bench.t`` keyed ``key``."""
    spec = DebounceSpec(
        window_ms=window_ms, max_wait_ms=max_wait_ms, key=None, replace_payload=False
    )
    return PreparedCall(
        task_name="bench.t",
        key=key,
        ident=f"7:bench.t:{key}",
        shard=0,
        task_id=str(uuid.uuid4()),
        spec=spec,
        content_type="application/json",
        payload=b'[["u1"], {}, {}]',
        options_json="{}",
    )


_SENT = sending.PostgresSending._run


def _settings_pipelined(self: Any, conn: Any, work: Any) -> Any:
    if not isinstance(work, sending.Step):
        return _SENT(self, conn, work)
    with conn.pipeline():
        conn.execute(self.locals_sql, self.locals)
        cursor = conn.execute(work.sql, work.params)
    return cursor.fetchone() if work.first else cursor.fetchall()


def _alone(self: Any, conn: Any, work: Any) -> Any:
    if not isinstance(work, sending.Step):
        return _SENT(self, conn, work)
    cursor = conn.execute(work.sql, work.params)
    return cursor.fetchone() if work.first else cursor.fetchall()


def _pipelined(self: Any, conn: Any, work: Any) -> Any:
    if not isinstance(work, sending.Step):
        return _SENT(self, conn, work)
    with conn.pipeline():
        cursor = conn.execute(work.sql, work.params)
    return cursor.fetchone() if work.first else cursor.fetchall()


WAYS: dict[str, Callable[..., Any]] = {
    "as sent (settings per transaction)": _SENT,
    "settings and call pipelined": _settings_pipelined,
    "the call alone": _alone,
    "the call alone, pipelined": _pipelined,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1500)
    args = parser.parse_args()
    with LocalPostgres(settings=DURABLE) as server:
        with PostgresStore(server.url(), timeout=5.0) as first:
            first.migrate()
        rates: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(args.rounds):
            for way, run in WAYS.items():
                with PostgresStore(server.url(), timeout=5.0) as store:
                    store._run = run.__get__(store)  # type: ignore[method-assign]
                    store.gate(gate_call("warm"))
                    calls = [gate_call(uuid.uuid4().hex) for _ in range(args.calls)]
                    started = time.perf_counter()
                    for call in calls:
                        store.gate(call)
                    rates[way].append(args.calls / (time.perf_counter() - started))
        base = statistics.median(rates["the call alone"])
        for way, found in rates.items():
            rate = statistics.median(found)
            print(f"{way:40} {rate:8,.0f} calls/s  {rate / base:.2f}x the call alone")


if __name__ == "__main__":
    main()
