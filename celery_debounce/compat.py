"""What the package borrows from Celery and kombu internals that differs across 5.3-5.7.

Everything here is either Celery's own helper (where the installed version has it)
or a copy of its newest behaviour (where it does not). Each helper has a test in
``tests/shared/test_compat.py`` that runs on whatever version is installed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from datetime import timezone as _utc_tz

from celery.utils.time import is_naive, maybe_make_aware

__all__ = ["add_seconds_to_datetime", "subtract_datetimes"]

try:  # Celery >= 5.7
    from celery.utils.time import (  # type: ignore[attr-defined,unused-ignore]
        add_seconds_to_datetime,
        subtract_datetimes,
    )
except ImportError:  # Celery 5.3-5.6: the same arithmetic, as 5.7 defines it

    def add_seconds_to_datetime(dt: datetime, seconds: float) -> datetime:
        """``dt`` plus elapsed ``seconds`` (across a DST change too); naive stays naive."""
        delta = timedelta(seconds=seconds)
        if is_naive(dt):
            return dt + delta
        return (dt.astimezone(_utc_tz.utc) + delta).astimezone(dt.tzinfo)

    def subtract_datetimes(end: datetime, start: datetime) -> timedelta:
        """Elapsed time from ``start`` to ``end``; a naive datetime counts as UTC."""
        end_utc: datetime = maybe_make_aware(end).astimezone(_utc_tz.utc)
        start_utc: datetime = maybe_make_aware(start).astimezone(_utc_tz.utc)
        return end_utc - start_utc
