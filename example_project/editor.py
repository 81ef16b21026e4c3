"""A document editor's background jobs: every "save" asks for work, debouncing collapses it.

Run a worker with ``REDIS_URL=redis://localhost:6379 celery -A example_project.editor worker``
(add ``DEMO_STORE_URL=postgresql://...`` to keep the windows in PostgreSQL).
"""

from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery

from celery_debounce import DebouncedTask, WindowNotFound

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379").rstrip("/")

#: a postgresql:// URL: the windows live in PostgreSQL (``demo.sh --store postgres``)
STORE_URL = os.environ.get("DEMO_STORE_URL")

app = Celery("editor", broker=f"{REDIS_URL}/0", backend=f"{REDIS_URL}/1")
app.conf.update(debounce_poll_interval=0.5, broker_connection_retry_on_startup=True)
if STORE_URL:
    app.conf.debounce_store_url = STORE_URL  # after `celery -A ... debounce migrate`
else:
    # window state; defaults to the broker when it is Redis
    app.conf.debounce_redis_url = f"{REDIS_URL}/2"

_runs = redis.Redis.from_url(f"{REDIS_URL}/3")


def _record(task: str, **details: object) -> None:
    """Let the demo show what ran and when."""
    _runs.rpush("demo:runs", json.dumps({"task": task, "at": time.time(), **details}))


@app.task(
    base=DebouncedTask,
    debounce="2s",  # rebuild once the user pauses for 2 seconds...
    debounce_max_wait="6s",  # ...but never later than 6 s after the first save
    debounce_key="report:{user_id}",
)
def rebuild_report(user_id: str) -> str:
    _record("rebuild_report", user_id=user_id)
    return f"report for {user_id} rebuilt"


@app.task(
    base=DebouncedTask,
    debounce="1s",
    debounce_max_wait="4s",
    debounce_key="doc:{doc_id}",
    debounce_replace_payload=True,  # index the newest revision, not the first one
)
def reindex_document(doc_id: str, revision: int) -> str:
    _record("reindex_document", doc_id=doc_id, revision=revision)
    return f"{doc_id} indexed at revision {revision}"


@app.task(
    base=DebouncedTask,
    debounce="5s",  # quiet period: until the edits pause for 5 s
    debounce_max_wait="1m",  # (at most a minute: then collaborators hear again)
    debounce_key="doc:{doc_id}",
    debounce_leading=True,  # tell collaborators at the FIRST save, at once...
    debounce_trailing=False,  # ...and not again for the rest of the burst
)
def notify_collaborators(doc_id: str, user_id: str) -> str:
    _record("notify_collaborators", doc_id=doc_id, user_id=user_id)
    return f"collaborators of {doc_id} told that {user_id} is editing"


def save(user_id: str, doc_id: str, revision: int) -> None:
    """What the web app calls on every autosave."""
    notify_collaborators.delay(doc_id, user_id)
    reindex_document.delay(doc_id, revision)
    rebuild_report.delay(user_id)


def publish_now(user_id: str) -> bool:
    """The "publish" button: rebuild the report at once instead of after the pause.

    The pending window is found from the task's own arguments (the key is resolved
    as ``rebuild_report.delay(user_id)`` resolves it). False if none was pending.
    """
    try:
        rebuild_report.debounce_flush(user_id)
    except WindowNotFound:
        return False
    return True
