"""An app for ``celery -A connect_app debounce check --connect``: the windows' store
and key prefix from the environment (``CONNECT_STORE_URL``, ``CONNECT_PREFIX``)."""

from __future__ import annotations

import os

from celery import Celery

from celery_debounce import DebouncedTask

app = Celery("connect_app", broker="memory://", set_as_current=False)
url = os.environ["CONNECT_STORE_URL"]
app.conf.debounce_key_prefix = os.environ.get("CONNECT_PREFIX", "debounce")
if url.startswith("redis"):
    app.conf.update(debounce_redis_url=url, debounce_redis_timeout=1.0)
else:
    app.conf.update(debounce_store_url=url, debounce_postgres_timeout=2.0)


@app.task(base=DebouncedTask, name="connect.t", debounce="1h", debounce_max_wait="2h")
def t(x: int) -> int:
    return x
