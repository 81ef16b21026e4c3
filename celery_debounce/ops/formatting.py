"""What the CLI prints: tables whose columns line up on a terminal (wide characters
included), relative times, cells made safe to print, configuration errors.

A CJK ideograph or most emoji take two terminal cells, a combining accent none;
``len()`` counts each as one, so a key such as ``"報告:42"`` pushed every later column
of its row one cell right per wide character. :func:`cell_width` measures what a
terminal shows (Unicode East Asian Width, the standard library's
:mod:`unicodedata`); :func:`pad` and :func:`clip` pad and cut by it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

import click

from ..errors import DebounceConfigError, DebounceError

__all__ = ["cell_width", "clip", "config_error", "pad", "printable", "relative", "table_lines"]


def _char_width(char: str) -> int:
    if unicodedata.combining(char) or char in "\u200b\u200c\u200d\ufe0e\ufe0f":
        return 0  # combining marks, zero-width (joiners, variation selectors)
    category = unicodedata.category(char)
    if category in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def cell_width(text: str) -> int:
    """Terminal cells ``text`` takes: 2 per wide (W/F) character, 0 per combining one."""
    if text.isascii():
        return len(text)
    return sum(_char_width(char) for char in text)


def pad(text: str, width: int) -> str:
    """``text`` left-aligned in ``width`` cells (``str.ljust`` by cells)."""
    return text + " " * max(0, width - cell_width(text))


def clip(text: str, width: int, ellipsis: str = "...") -> str:
    """``text`` cut to at most ``width`` cells, ending with ``ellipsis`` when cut; a wide
    character is never split."""
    if cell_width(text) <= width:
        return text
    room = max(0, width - cell_width(ellipsis))
    out, used = [], 0
    for char in text:
        w = _char_width(char)
        if used + w > room:
            break
        out.append(char)
        used += w
    return "".join(out) + ellipsis


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The header and rows as aligned lines (two spaces between columns, no trailing
    blanks), column widths measured in terminal cells."""
    every = [header, *rows]
    widths = [max(cell_width(r[i]) for r in every) for i in range(len(header))]
    return ["  ".join(pad(c, widths[i]) for i, c in enumerate(r)).rstrip() for r in every]


def relative(seconds: float) -> str:
    """'in 4.2s', '12m ago': a human offset from now."""
    future = seconds >= 0
    s = abs(seconds)
    whole = int(s)
    if s < 60:
        text = f"{s:.1f}s"
    elif s < 3600:
        text = f"{whole // 60}m{whole % 60:02d}s"
    elif s < 86400:
        text = f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    else:
        text = f"{whole // 86400}d{whole % 86400 // 3600:02d}h"
    return f"in {text}" if future else f"{text} ago"


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def printable(text: str) -> str:
    """``text`` safe for one table cell: control, format and line/paragraph separator
    characters (and the backslash, so escapes stay unambiguous) are written as
    Python escapes. A newline in a key can then never start a fake row, nor an
    ANSI sequence repaint the terminal."""
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char.isprintable() or char == " ":
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    return "".join(out)


def config_error(exc: DebounceError, app: Any = None) -> click.ClickException:
    """``exc`` as a CLI error; a Redis URL missing because no app was named says so
    (Celery's default app, main ``"default"``, with no broker URL)."""
    message = str(exc)
    default = app is None or (
        getattr(app, "main", None) in (None, "default") and not app.conf.broker_url
    )
    if isinstance(exc, DebounceConfigError) and "is not a Redis URL" in message and default:
        message += (
            "\nHint: name your app with -A/--app before the command, e.g. "
            "`celery -A proj debounce inspect` (without it Celery uses its "
            "default app, which has no Redis URL)."
        )
    return click.ClickException(message)
