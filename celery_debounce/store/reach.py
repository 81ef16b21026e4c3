"""What a deploy-time check found on reaching the store (``celery debounce check
--connect``): what it reached, and each problem by kind."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import DebounceConfigError, DebounceError, StoreMisconfigured
from .domain import StoreUnavailable

__all__ = ["KINDS", "Reached", "kind_of"]

#: The kinds of problem, in the order they are reported.
KINDS = (
    "unreachable",
    "authentication",
    "privileges",
    "schema",
    "server version",
    "key prefix",
)


@dataclass
class Reached:
    """``server``: what was reached and where (no secret); ``problems``: ``(kind, message)``
    each (:data:`KINDS`); ``notes``: what was checked and found in order."""

    server: str = ""
    problems: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def refused(self, exc: DebounceError) -> Reached:
        """Add ``exc`` (raised on reaching the store) as a problem of its kind."""
        self.problems.append((kind_of(exc), str(exc)))
        return self


#: Words of a server's refusal that say the credentials or the rights are wrong.
_AUTH = ("WRONGPASS", "NOAUTH", "invalid username-password", "password authentication")
_RIGHTS = ("NOPERM", "permission denied", "insufficient privilege")


def kind_of(exc: DebounceError) -> str:
    """The kind of problem ``exc`` raised on reaching the store is."""
    text = str(exc)
    if any(word in text for word in _RIGHTS):
        return "privileges"
    if isinstance(exc, StoreMisconfigured) or any(word in text for word in _AUTH):
        return "authentication"
    if isinstance(exc, StoreUnavailable):
        return "unreachable"
    if isinstance(exc, DebounceConfigError):
        return "server version"
    return "unreachable"
