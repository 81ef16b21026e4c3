"""What each per-call shortcut of ``.delay()`` is worth: interleaved A/B in one process.

``python -m bench.steps [rounds]`` starts a fresh redis-server and times hot-key
``.delay()`` calls (best of 3 x 1,000 per round) with every shortcut on, with each
one turned off in turn, and with all of them off, in interleaved rounds:

* the per-thread connection of the gate (``store._Lease``; off: the pool's
  checkout and release on every call),
* the lighter result (``result.light_result``; off: ``task.AsyncResult(id)``),
* the direct ``task_always_eager`` lookup (``confcache.always_eager``; off: ``app.conf``),
* hiredis' packer called directly (``store._pack``; off: ``conn.pack_command``).
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

import celery_debounce.producer.task as task_module
import celery_debounce.store.redis.node as store_module
from celery_debounce.store import store_for


def _plain_result(task: Any, task_id: str) -> Any:
    return task.AsyncResult(task_id)


def _conf_eager(app: Any) -> bool:
    return bool(app.conf.task_always_eager)


def _redis_py_pack(conn: Any, command: tuple[Any, ...]) -> Any:
    return conn.pack_command(*command)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    rounds = int(args[0]) if args else 9
    from bench.apps import make_app
    from celery_debounce.testing.servers import LocalRedis

    with LocalRedis() as server:
        app = make_app(server.url)
        task = app.tasks["bench.debounced"]
        task.delay("hot", n=1)
        store = store_for(app)
        lease = store.transport._lease
        light, eager, pack = task_module.light_result, task_module.always_eager, store_module._pack

        def setup(
            lz: bool = True, result: bool = True, conf: bool = True, packer: bool = True
        ) -> None:
            task_module.light_result = light if result else _plain_result  # type: ignore[assignment]
            task_module.always_eager = eager if conf else _conf_eager
            store.transport._lease = lease if lz else None
            store_module._pack = pack if packer else _redis_py_pack

        variants: dict[str, dict[str, bool]] = {
            "all on": {},
            "no per-thread connection": {"lz": False},
            "no light result": {"result": False},
            "no direct eager lookup": {"conf": False},
            "no direct pack": {"packer": False},
            "all off": {"lz": False, "result": False, "conf": False, "packer": False},
        }
        out: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(rounds):
            for name, flags in variants.items():
                setup(**flags)
                best = float("inf")
                for _ in range(3):
                    started = time.perf_counter()
                    for _ in range(1000):
                        task.delay("hot", n=1)
                    best = min(best, time.perf_counter() - started)
                out[name].append(best / 1000 * 1e6)
        setup()
    base = statistics.median(out["all on"])
    print(f"hot-key .delay(), us per call, {rounds} interleaved rounds (best of 3 x 1,000)")
    for name, samples in out.items():
        median = statistics.median(samples)
        print(
            f"  {name:26s} median {median:6.1f}  min {min(samples):6.1f}  "
            f"max {max(samples):6.1f}  ({median - base:+5.1f} us vs all on)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
