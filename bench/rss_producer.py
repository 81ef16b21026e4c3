"""Child process for benchmark 8: make N ``.delay()`` calls, report RSS along the way (JSON)."""

from __future__ import annotations

import json
import sys


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        import os

        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    url, total = sys.argv[1], int(sys.argv[2])
    from bench.apps import make_app

    app = make_app(url)
    debounced = app.tasks["bench.debounced"]
    step = max(1, total // 20)
    samples = []
    for i in range(total):
        # 1,000 keys: most calls join an open window, Redis memory stays bounded
        debounced.delay(f"k{i % 1000}", n=i)
        if (i + 1) % step == 0:
            samples.append((i + 1, rss_bytes()))
    print(json.dumps(samples))


if __name__ == "__main__":
    main()
