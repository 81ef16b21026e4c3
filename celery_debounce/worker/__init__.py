"""The worker stage of celery_debounce (see docs/design.md, "Module map")."""

from __future__ import annotations

__all__ = ["install"]


def install() -> None:
    """Connect the worker's receivers in this process (idempotent): a run of a window
    is claimed when it starts and finished when it ends, a message the worker drops
    finishes its window, and at ``worker_init`` / in a pool child every task gets the
    duplicate skip and the window request class (:mod:`celery_debounce.worker.receivers`).

    Called where it must hold, never by an import: by ``DebouncedTask`` when bound to an
    app, by the package's public names on first use, and by the ``celery`` command's
    plugin (``ops/cli.py``), which every ``celery worker`` loads. A pool child forked
    after it inherits the receivers; a fresh interpreter (spawn) connects them again as
    its app's tasks are bound."""
    from .receivers import connect

    connect()
