"""A sample user project: a document editor whose "save" events are debounced.

The user-suite tests treat this module as "your code" and test it with
``celery_debounce.testing`` the way a user's own test suite would.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_debounce import DebouncedTask


def create_app(**conf: Any) -> Celery:
    """The editor's Celery app; ``conf`` overrides settings (broker, Redis URL...)."""
    app = Celery("editor", set_as_current=False)
    app.conf.update(worker_hijack_root_logger=False, broker_connection_retry_on_startup=True)
    app.conf.update(conf)
    app.indexed = []  # type: ignore[attr-defined]
    app.reports = []  # type: ignore[attr-defined]

    @app.task(
        base=DebouncedTask,
        shared=False,
        debounce="2s",
        debounce_max_wait="30s",
        debounce_key="doc:{doc_id}",
    )
    def reindex_document(doc_id: str, revision: int = 0) -> str:
        app.indexed.append((doc_id, revision))  # type: ignore[attr-defined]
        return f"indexed {doc_id}@{revision}"

    @app.task(
        base=DebouncedTask,
        shared=False,
        debounce="1h",
        debounce_max_wait="1d",
        debounce_key="report:{user_id}",
        debounce_replace_payload=True,
    )
    def rebuild_report(user_id: int, reason: str) -> str:
        app.reports.append((user_id, reason))  # type: ignore[attr-defined]
        return f"report {user_id} ({reason})"

    return app
