"""The burst demo in docs/operations.md: a real worker, a burst of calls, the commands' output.

Usage: python bench/ops_demo.py [redis://127.0.0.1:6399]   (FLUSHES that server)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

URL = sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6399"
APP = f'''
from celery import Celery
from celery_debounce import DebouncedTask

app = Celery("shop", broker="{URL}/1", backend="{URL}/2")
app.conf.debounce_redis_url = "{URL}/0"

@app.task(base=DebouncedTask, debounce="3s", debounce_max_wait="8s",
          debounce_key="user:{{user_id}}")
def reindex_user(user_id, reason=""):
    return user_id

@app.task(base=DebouncedTask, debounce="10s", debounce_max_wait="1m",
          debounce_key="cart:{{cart_id}}")
def recompute_cart(cart_id):
    return cart_id
'''


def main() -> None:
    redis.Redis.from_url(URL).flushall()
    workdir = Path(tempfile.mkdtemp())
    (workdir / "shop.py").write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "shop", "worker", "-P", "solo", "-l", "warning"],
        env=env,
        cwd=workdir,
    )
    sys.path.insert(0, str(workdir))
    import shop

    def show(*args: str) -> None:
        print(f"$ celery -A shop debounce {' '.join(args)}")
        out = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "shop", "debounce", *args],
            env=env,
            capture_output=True,
            text=True,
        )
        print(out.stdout + out.stderr)

    try:
        time.sleep(3)  # worker start-up
        # A burst: user 42 edits every 100 ms, 7 and 9 a little, carts change.
        for i in range(40):
            shop.reindex_user.delay("42", reason=f"edit {i}")
            if i % 10 == 0:
                shop.reindex_user.delay("7")
                shop.recompute_cart.delay(f"c{i // 10}")
            if i == 5:
                shop.reindex_user.delay("9")
            time.sleep(0.1)
            if i == 25:
                show("inspect")
        show("inspect", "--task", "shop.reindex_user", "--limit", "2", "--json")
        time.sleep(5)
        show("inspect")
        show("flush", "--task", "shop.recompute_cart", "--all")
        time.sleep(2)
        show("stats")
    finally:
        worker.terminate()
        worker.wait(20)


if __name__ == "__main__":
    main()
