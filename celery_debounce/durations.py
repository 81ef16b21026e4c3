"""Parsing of duration options ("250ms", "1h30m", 10, timedelta) into milliseconds."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import DebounceConfigError

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# ASCII digits only ("1_000", Arabic-Indic or full-width digits are refused); each unit at
# most once and largest first ("1h30m", not "30m1h" or "5s5s").
_NUM = r"[0-9]+(?:\.[0-9]+)?"
_WHOLE = re.compile(
    rf"(?:(?P<d>{_NUM})d)?(?:(?P<h>{_NUM})h)?(?:(?P<m>{_NUM})m(?!s))?(?:(?P<s>{_NUM})s)?"
    rf"(?:(?P<ms>{_NUM})ms)?"
)
#: A capital M that does not start "ms"/"MS" (milliseconds): "2M" is refused, not read
#: as 2 minutes (it reads as 2 months in ISO 8601 periods and many config formats).
_CAPITAL_M = re.compile(r"M(?![sS])")
_SECONDS = re.compile(rf"-?{_NUM}|-?\.[0-9]+")

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
        if _CAPITAL_M.search(value):
            raise DebounceConfigError(
                f"{option}={value!r}: 'M' is ambiguous (minutes, or months as in ISO 8601 "
                "and many config formats?): write 'm' for minutes, or the duration in days "
                "('30d')"
            )
        text = value.strip().lower().replace(" ", "")
        whole = _WHOLE.fullmatch(text) if text else None
        if whole is not None and any(whole.groupdict().values()):
            ms = sum(
                float(num) * _UNIT_MS[unit]
                for unit, num in whole.groupdict().items()
                if num is not None
            )
        elif _SECONDS.fullmatch(text):
            ms = float(text) * 1000
        else:
            raise DebounceConfigError(
                f"{option}={value!r}: cannot parse duration; use e.g. "
                "'250ms', '10s', '5m', '2h', '1d', '1h30m' (each unit once, largest first) "
                "or seconds as a number with ASCII digits"
            )
    else:
        raise DebounceConfigError(
            f"{option}={value!r}: expected a duration (str, int, float or timedelta), "
            f"got {type(value).__name__}"
        )
    if ms > MAX_MS:
        raise DebounceConfigError(f"{option}={value!r}: duration longer than 10 years")
    if ms <= 0:
        raise DebounceConfigError(f"{option}={value!r}: duration must be positive")
    result = round(ms)
    if result <= 0:
        raise DebounceConfigError(
            f"{option}={value!r}: duration below 1 ms (durations are whole milliseconds; "
            "the shortest is '1ms')"
        )
    return result
