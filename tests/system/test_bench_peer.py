"""The peer and store benchmarks are registered and parse their arguments; the
PostgreSQL one runs small. None is run for its figures: benchmarks are not tests
(``python -m bench.bullmq``, ``python -m bench.postgres`` run them)."""

from __future__ import annotations

from bench import bullmq
from bench.run import BENCHES


def test_bullmq_bench_is_registered_and_parses_args() -> None:
    assert "bullmq" in BENCHES
    args = bullmq.parse_args(["--rounds", "3", "--calls", "100"])
    assert (args.rounds, args.calls, args.json) == (3, 100, False)
    assert bullmq.SCRIPT.exists()
    assert "deduplication" in bullmq.SCRIPT.read_text()
    assert "celery-debounced" in bullmq.NODE_SCRIPT.read_text()


def test_threads_bench_is_registered() -> None:
    from bench import threads

    assert "threads" in BENCHES
    assert threads.threaded_rate(2, 3, lambda: None) > 0


def test_postgres_bench_is_registered_and_measures_both_rows(
    redis_server: str, postgres_server: object
) -> None:
    """A small run (its own PostgreSQL server; ``postgres_server`` for the skip rule)."""
    from bench.postgres import churn, drain_rates, lateness, postgres_rates, storage

    assert "postgres" in BENCHES
    rows = postgres_rates(redis_server, 1, 20, bullmq=False)  # 12g: npm, not here
    assert [r.operation for r in rows] == [
        "PostgreSQL: hot key .delay()",
        "PostgreSQL: new key .delay()",
        "PostgreSQL: enqueue_many, new keys",
    ]
    assert all(r.median > 0 and r.baseline_value for r in rows)
    (drained,) = drain_rates(redis_server, 1, 40)  # it raises unless all 40 were published
    assert drained.median > 0 and drained.baseline_value
    p50, p99 = lateness(redis_server, 50, 0.4)  # it raises unless every window was taken
    assert 0 <= p50.median <= p99.median
    from celery_debounce.testing.servers import LocalRedis

    with LocalRedis() as own:  # the Redis half flushes its server: not the session's
        (stored,) = storage(own.url, 50)  # it raises unless all 50 windows are open
    assert stored.median > 0 and stored.baseline_value
    # it raises unless every window went through and the 30 stayed open
    (churned,) = churn(30, 600, "10s", batch=200)
    assert churned.median > 0 and churned.baseline_value and churned.ratio
