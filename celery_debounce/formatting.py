"""Text tables whose columns line up on a terminal, wide characters included.

A CJK ideograph or most emoji take two terminal cells, a combining accent none;
``len()`` counts each as one, so a key such as ``"報告:42"`` pushed every later column
of its row one cell right per wide character. :func:`cell_width` measures what a
terminal shows (Unicode East Asian Width, the standard library's
:mod:`unicodedata`); :func:`pad` and :func:`clip` pad and cut by it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

__all__ = ["cell_width", "clip", "pad", "table_lines"]


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
