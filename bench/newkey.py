"""Where a new-key ``.delay()``'s time goes: each stage of the call timed on its own.

``python -m bench.newkey`` starts a fresh redis-server, warms the producer, then
times, in interleaved rounds of ``--calls`` calls each (median of the rounds, us per
call, every call a new key as in row 9 of ``python -m bench.bullmq``):

- the whole ``.delay()`` of ``bench.debounced`` (and a hot-key one, to compare),
  and the same with the round trip stubbed out (the store answers a canned reply):
  all of the call's Python;
- ``prepare_call`` (what ``DebouncedTask._gate`` calls: binding, key template,
  payload encoding, window ident, task id), and each of those pieces alone;
- the gate (``gate.enter``: ARGV and KEYS, the packed command, send, read, reply),
  its Python alone (the same steps on a canned reply) and the bare round trip of
  the same packed ``EVALSHA`` commands on a redis-py connection, with a ``PING``
  round trip for the loopback floor;
- the result object (``light_result``);
- the server's time per ``EVALSHA`` (``INFO commandstats``, new key and hot key).

What is left of the whole call is ``apply_async``'s own work before the gate
(options, eager check, signature check). ``--profile`` adds a cProfile of
``--calls`` new-key calls (by own time).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis


def per_call(n: int, fn: Callable[[int], None]) -> float:
    """us per call of ``fn(n)``, which makes n calls."""
    start = time.perf_counter()
    fn(n)
    return (time.perf_counter() - start) / n * 1e6


def server_us(client: redis.Redis, fn: Callable[[], None]) -> float:
    """Redis's own us per ``EVALSHA`` while ``fn()`` runs (INFO commandstats)."""
    client.config_resetstat()
    fn()
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec_per_call", float("nan")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.newkey", description=__doc__)
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=2000, help="calls per stage and round")
    parser.add_argument("--warm", type=int, default=2000, help="warm-up calls of each kind")
    parser.add_argument("--profile", action="store_true", help="add a cProfile")
    args = parser.parse_args(argv)

    from bench.apps import make_app
    from bench.calls import count_calls
    from celery_debounce.producer.call import bind_arguments, encode, prepare_call, static_routing
    from celery_debounce.producer.gate import enter
    from celery_debounce.producer.key_templates import resolve
    from celery_debounce.producer.result import light_result
    from celery_debounce.settings import settings_for
    from celery_debounce.store import store_for
    from celery_debounce.store.idents import window_ident
    from celery_debounce.store.redis.codec import gate_args, gate_keys, parse_reply
    from celery_debounce.store.redis.node import _pack
    from celery_debounce.stored_call import new_task_id
    from celery_debounce.testing.servers import LocalRedis

    n = args.calls
    with LocalRedis() as server:
        app = make_app(server.url)
        task = app.tasks["bench.debounced"]
        fresh: Iterator[int] = iter(range(10**12))
        name = task.name
        spec = task._debounce_defaults.for_call({})
        settings = settings_for(app)
        signature = task.debounce_signature()
        static = static_routing(app)
        windows = redis.Redis.from_url(f"{server.url}/0")
        raw = redis.Redis.from_url(f"{server.url}/0").connection_pool.get_connection()
        raw.connect()

        def prepared(uid: str) -> Any:
            return prepare_call(
                settings,
                name,
                spec,
                (uid,),
                {"n": 1},
                {},
                signature,
                task.serializer,
                None,
                app=app,
                task_type=task,
                static=static,
            )

        for _ in range(args.warm):  # warm: connection, script, caches
            task.delay(f"n{next(fresh)}", n=1)
            task.delay("hot", n=1)
        store = store_for(app, call=True)
        sha = store.scripts["gate"].sha
        sample = prepared("sample")
        positional, named = bind_arguments(signature, ("sample",), {"n": 1})
        assert spec.key is not None
        key = resolve(spec.key, positional, named)
        canned = [sample.task_id.encode(), 1, 1, 1, 1]
        conn = store.transport._lease.checkout()  # type: ignore[attr-defined]

        def delay_new(k: int) -> None:
            for _ in range(k):
                task.delay(f"n{next(fresh)}", n=1)

        def delay_hot(k: int) -> None:
            for _ in range(k):
                task.delay("hot", n=1)

        def delay_stubbed(k: int) -> None:
            sent = store.run_once
            store.run_once = lambda name, keys, argv: canned
            try:
                for _ in range(k):
                    task.delay(f"n{next(fresh)}", n=1)
            finally:
                store.run_once = sent

        def prepare(k: int) -> None:
            for _ in range(k):
                prepared(f"n{next(fresh)}")

        def bind(k: int) -> None:
            for _ in range(k):
                bind_arguments(signature, ("n1",), {"n": 1})

        def template(k: int) -> None:
            for _ in range(k):
                resolve(spec.key, positional, named)

        def payload(k: int) -> None:
            for _ in range(k):
                encode([("n1",), {"n": 1}, {}], "json")

        def ident(k: int) -> None:
            for _ in range(k):
                window_ident(name, key)

        def task_id(k: int) -> None:
            for _ in range(k):
                new_task_id()

        calls: list[Any] = []

        def gate(k: int) -> None:
            for call in calls[:k]:
                enter(store, call)

        def gate_python(k: int) -> None:
            for call in calls[:k]:
                _pack(conn, ("EVALSHA", sha, 2, *gate_keys(store, call), *gate_args(store, call)))
                parse_reply(canned)

        packed: list[Any] = []

        def round_trip(k: int) -> None:
            for command in packed[:k]:
                raw.send_packed_command(command)
                raw.read_response()

        ping = raw.pack_command("PING")

        def ping_trip(k: int) -> None:
            for _ in range(k):
                raw.send_packed_command(ping)
                raw.read_response()

        def result(k: int) -> None:
            for _ in range(k):
                light_result(task, sample.task_id)

        stages: dict[str, Callable[[int], None]] = {
            "delay() new key": delay_new,
            "delay() hot key": delay_hot,
            "delay() new key, no round trip": delay_stubbed,
            "prepare_call": prepare,
            "  bind arguments": bind,
            "  key template": template,
            "  payload (JSON)": payload,
            "  window ident": ident,
            "  task id": task_id,
            "gate (enter)": gate,
            "  its Python (canned reply)": gate_python,
            "  bare EVALSHA round trip": round_trip,
            "  bare PING round trip": ping_trip,
            "light_result": result,
        }
        out: dict[str, list[float]] = {stage: [] for stage in stages}
        for _ in range(args.rounds):
            calls[:] = [prepared(f"n{next(fresh)}") for _ in range(n)]
            news = [prepared(f"n{next(fresh)}") for _ in range(n)]
            packed[:] = [
                _pack(raw, ("EVALSHA", sha, 2, *gate_keys(store, c), *gate_args(store, c)))
                for c in news
            ]
            for stage, fn in stages.items():
                out[stage].append(per_call(n, fn))
        new_server = server_us(windows, lambda: delay_new(n))
        hot_server = server_us(windows, lambda: delay_hot(n))
        counted = [count_calls(lambda: task.delay(f"n{next(fresh)}", n=1)) for _ in range(21)]
        profile = None
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(delay_new, n)
        raw.disconnect()
        windows.flushdb()

    med = {stage: statistics.median(v) for stage, v in out.items()}
    print(
        f"new-key .delay(), us per call, median of {args.rounds} interleaved rounds of {n:,} calls"
    )
    for stage, value in med.items():
        print(
            f"  {stage:30} {value:6.2f}  (min {min(out[stage]):6.2f}, max {max(out[stage]):6.2f})"
        )
    rest = med["delay() new key"] - med["prepare_call"] - med["gate (enter)"] - med["light_result"]
    print(f"  {'apply_async before the gate':30} {rest:6.2f}  (the rest of the whole call)")
    print(f"server us per EVALSHA: new key {new_server:.2f}, hot key {hot_server:.2f}")
    print(
        f"calls per new-key .delay(): {statistics.median(c[0] for c in counted)} "
        f"Python and C ({statistics.median(c[1] for c in counted)} Python)"
    )
    if profile is not None:
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
