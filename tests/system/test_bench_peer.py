"""The BullMQ side-by-side benchmark imports and parses its arguments (it is not run:
benchmarks are not tests; ``python -m bench.bullmq`` runs it)."""

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
