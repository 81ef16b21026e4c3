"""``delay_on_commit`` / ``apply_async_on_commit`` for debounced tasks, as Celery's DjangoTask has.

``@app.task(base=DebouncedTask)`` replaces the app's task class, so with Django the
task would lose the two methods Celery's ``DjangoTask`` adds. Here they are: the
gate runs when the surrounding transaction commits, and a rolled-back
transaction writes nothing. Django is imported only when one of them is called.
"""

from __future__ import annotations

import functools
from typing import Any


class OnCommitMixin:
    """Adds Django's on-commit calls to a task class."""

    delay: Any
    apply_async: Any

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """Call ``delay(*args, **kwargs)`` when the current Django transaction commits."""
        _on_commit(functools.partial(self.delay, *args, **kwargs))

    def apply_async_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """Call ``apply_async(*args, **kwargs)`` when the current Django transaction commits."""
        _on_commit(functools.partial(self.apply_async, *args, **kwargs))


def _on_commit(call: functools.partial[Any]) -> None:
    try:
        from django.db import transaction
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "delay_on_commit/apply_async_on_commit need Django (pip install django)"
        ) from exc
    transaction.on_commit(call)
