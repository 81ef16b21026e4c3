"""The app the beat tests run under ``celery -A beat_app beat -S debounce``.

URLs come from $DEBOUNCE_BEAT_WINDOWS (the windows' Redis, or a postgresql:// URL: the
windows in PostgreSQL) and $DEBOUNCE_BEAT_BROKER.
A plain task is scheduled every second on its own queue (``heartbeat``), so a test
counts the messages beat sent there.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_debounce import DebouncedTask
from celery_debounce.settings import POSTGRES_SCHEMES


def build(windows_url: str, broker_url: str, **conf: object) -> Celery:
    app = Celery("beat_app", set_as_current=False)
    if windows_url.startswith(POSTGRES_SCHEMES):
        conf = {"debounce_store_url": windows_url, "debounce_redis_url": None, **conf}
    else:
        conf = {"debounce_redis_url": windows_url, **conf}
    app.conf.update(
        broker_url=broker_url,
        debounce_poll_interval=1.0,
        debounce_redis_timeout=3.0,
        # small batches (env) make a backlog take seconds to publish, long enough
        # to see whether beat keeps its schedule meanwhile
        debounce_dispatch_batch=int(os.environ.get("DEBOUNCE_BEAT_BATCH", "500")),
        broker_connection_retry_on_startup=True,
        beat_schedule={
            "heartbeat": {
                "task": "beat_app.heartbeat",
                "schedule": 1.0,
                "options": {"queue": "heartbeat"},
            },
        },
        **conf,
    )

    @app.task(
        base=DebouncedTask,
        shared=False,
        name="beat_app.sync",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{0}",
    )
    def sync(item: str) -> str:
        return item

    return app


app = build(
    os.environ.get("DEBOUNCE_BEAT_WINDOWS", "redis://127.0.0.1:1/0"),
    os.environ.get("DEBOUNCE_BEAT_BROKER", "redis://127.0.0.1:1/1"),
)
