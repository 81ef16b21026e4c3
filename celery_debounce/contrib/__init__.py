"""Integrations with other frameworks."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..ops.validation import Problem


def import_problem(exc: Exception) -> Problem:
    """A module ``debounce check`` (or Django's check) imports raised ``exc`` (a
    SyntaxError, a NameError...): one ``imports`` problem naming the exception and
    where it was raised, instead of a traceback (and ``-j`` still prints JSON)."""
    import traceback

    from ..ops.validation import Problem

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
    if isinstance(exc, SyntaxError):  # its message names the file and line
        where = ""
    return Problem("imports", f"{type(exc).__name__}: {exc}{where}")
