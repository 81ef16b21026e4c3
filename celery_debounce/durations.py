"""Parsing of duration options ("250ms", "1h30m", 10, timedelta) into milliseconds."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import DebounceConfigError

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")

Duration = str | int | float | timedelta

#: Longest duration accepted (10 years): keeps every deadline an exact integer in Lua.
MAX_MS = 10 * 365 * 86_400_000


def parse_duration(option: str, value: object) -> int:
    """Return ``value`` as a positive number of milliseconds.

    Raises :class:`DebounceConfigError` naming ``option`` when the value is
    unparsable, zero or negative.
    """
    ms: float
    if isinstance(value, bool):
        raise DebounceConfigError(f"{option}={value!r}: expected a duration, not a bool")
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000
    elif isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise DebounceConfigError(f"{option}={value!r}: duration must be finite")
        ms = value * 1000
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if _WHOLE.fullmatch(text):
            ms = sum(float(num) * _UNIT_MS[unit] for num, unit in _PART.findall(text))
        else:
            try:
                ms = float(text) * 1000
            except ValueError:
                raise DebounceConfigError(
                    f"{option}={value!r}: cannot parse duration; use e.g. "
                    "'250ms', '10s', '5m', '2h', '1d', '1h30m' or seconds as a number"
                ) from None
            if not math.isfinite(ms):
                raise DebounceConfigError(f"{option}={value!r}: duration must be finite")
    else:
        raise DebounceConfigError(
            f"{option}={value!r}: expected a duration (str, int, float or timedelta), "
            f"got {type(value).__name__}"
        )
    if ms > MAX_MS:
        raise DebounceConfigError(f"{option}={value!r}: duration longer than 10 years")
    result = round(ms)
    if result <= 0:
        raise DebounceConfigError(f"{option}={value!r}: duration must be positive")
    return result
