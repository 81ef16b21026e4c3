"""The hot call through a Sentinel URL: direct EVALSHA path against redis-py's evalsha.

python -m bench.sentinel_hot   (starts a primary, a replica and three sentinels)
Interleaved rounds; prints the median calls/s of each way and of a plain redis:// URL.
"""

from __future__ import annotations

import statistics
import time

from celery import Celery

from celery_debounce.settings import Settings
from celery_debounce.store import WindowStore
from celery_debounce.testing.servers import LocalSentinels

ROUNDS, CALLS = 7, 3000


def _backend(url: str, **conf: object) -> WindowStore:
    app = Celery("bench", set_as_current=False)
    app.conf.update(debounce_redis_url=url, **conf)
    return WindowStore(Settings.from_app(app))


def _rate(backend: WindowStore, direct: bool) -> float:
    run = backend.run_once if direct else backend.run  # the transport's direct path, or not
    keys = ["debounce:{0}:open:hot", "debounce:{0}:due"]
    args = ["id1", 3_600_000, 3_600_000, "0", "", "[[], {}]", ""]
    run("gate", keys, args)
    started = time.perf_counter()
    for _ in range(CALLS):
        run("gate", keys, args)
    return CALLS / (time.perf_counter() - started)


def main() -> None:
    with LocalSentinels() as group:
        sentinel = _backend(group.url, debounce_redis_sentinel_master=group.master_name)
        port = group.master_port()
        plain = _backend(f"redis://127.0.0.1:{port}/0")
        rates: dict[str, list[float]] = {
            "sentinel direct": [],
            "sentinel client.evalsha": [],
            "redis:// direct": [],
        }
        for _ in range(ROUNDS):
            rates["sentinel direct"].append(_rate(sentinel, True))
            rates["sentinel client.evalsha"].append(_rate(sentinel, False))
            rates["redis:// direct"].append(_rate(plain, True))
        for name, values in rates.items():
            print(
                f"{name:26} {statistics.median(values):8,.0f} gate calls/s "
                f"(min {min(values):,.0f}, max {max(values):,.0f})"
            )


if __name__ == "__main__":
    main()
