"""celery_debounce.compat: each helper matches the installed Celery's own behaviour.

These tests run on whatever Celery/kombu is installed (the CI corners run them on
5.3, 5.5 and 5.7).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import celery.utils.time as celery_time
import pytest

from celery_debounce import compat

HAS_57_HELPERS = hasattr(celery_time, "add_seconds_to_datetime")


def test_the_package_imports_without_celery_57_time_helpers() -> None:
    """Celery 5.3-5.6 lack add_seconds_to_datetime/subtract_datetimes (an ImportError
    on ``import celery_debounce`` before the compat module)."""
    code = textwrap.dedent("""
        import celery.app.amqp, celery.app.base, celery.schedules  # they import them on 5.7
        import celery.utils.time as t
        for name in ("add_seconds_to_datetime", "subtract_datetimes"):
            if hasattr(t, name):
                delattr(t, name)
        import celery_debounce, celery_debounce.message, celery_debounce.cli
        from celery_debounce import compat
        from datetime import datetime, timedelta, timezone
        now = datetime(2026, 1, 1, tzinfo=timezone.utc)
        assert compat.add_seconds_to_datetime(now, 5) == now + timedelta(seconds=5)
        assert compat.subtract_datetimes(now + timedelta(seconds=5), now) == timedelta(seconds=5)
        print("ok")
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={**os.environ}, check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_helpers_are_celerys_own_where_it_has_them() -> None:
    if not HAS_57_HELPERS:
        pytest.skip("this Celery has no add_seconds_to_datetime (5.3-5.6): the backfill runs")
    assert compat.add_seconds_to_datetime is celery_time.add_seconds_to_datetime
    assert compat.subtract_datetimes is celery_time.subtract_datetimes


@pytest.mark.parametrize("tz", [timezone.utc, ZoneInfo("Europe/Paris"), ZoneInfo("Asia/Kolkata")])
@pytest.mark.parametrize("seconds", [0, 1.5, 30, 3600, -2, 86400 * 3])
def test_add_seconds_matches_celery_outside_dst_changes(tz: timezone, seconds: float) -> None:
    """Where no DST change lies between, every Celery adds seconds the same way:
    5.3-5.6 as ``now + timedelta(seconds=...)``, 5.7 with add_seconds_to_datetime."""
    now = datetime(2026, 6, 10, 12, 0, 0, 123456, tzinfo=tz)
    got = compat.add_seconds_to_datetime(now, seconds)
    assert got == now + timedelta(seconds=seconds)
    assert got.isoformat() == (now + timedelta(seconds=seconds)).isoformat()
    assert got.tzinfo is now.tzinfo
    naive = now.replace(tzinfo=None)
    assert compat.add_seconds_to_datetime(naive, seconds) == naive + timedelta(seconds=seconds)


def test_add_seconds_counts_elapsed_time_across_a_dst_change() -> None:
    """Across a DST change the helper counts elapsed seconds, as Celery 5.7 does (5.3-5.6's
    plain ``+`` adds wall-clock time there: the documented difference, docs/deployment.md)."""
    paris = ZoneInfo("Europe/Paris")
    before = datetime(2026, 3, 29, 1, 30, tzinfo=paris)  # 02:00 -> 03:00 that night
    after = compat.add_seconds_to_datetime(before, 3600)
    assert after.isoformat() == "2026-03-29T03:30:00+02:00"
    assert compat.subtract_datetimes(after, before) == timedelta(hours=1)


@pytest.mark.parametrize(
    ("end", "start", "delta"),
    [
        (datetime(2026, 1, 1, 0, 0, 10, tzinfo=timezone.utc),
         datetime(2026, 1, 1, tzinfo=timezone.utc), timedelta(seconds=10)),
        (datetime(2026, 1, 1, 1, 0, 0, tzinfo=ZoneInfo("Europe/Paris")),
         datetime(2026, 1, 1, tzinfo=timezone.utc), timedelta(0)),
        (datetime(2026, 1, 1, 0, 0, 5),  # naive counts as UTC
         datetime(2026, 1, 1, tzinfo=timezone.utc), timedelta(seconds=5)),
        (datetime(2026, 1, 1, tzinfo=timezone.utc),
         datetime(2026, 1, 1, 0, 1, tzinfo=timezone.utc), timedelta(seconds=-60)),
    ],
)
def test_subtract_datetimes(end: datetime, start: datetime, delta: timedelta) -> None:
    assert compat.subtract_datetimes(end, start) == delta
    if end.tzinfo is not None:  # Celery 5.3-5.6: `(expires - now).total_seconds()`
        assert compat.subtract_datetimes(end, start) == end - start
