"""A window's states and a gate call's edges, as types every store shares."""

from __future__ import annotations

from typing import Literal, cast, get_args

__all__ = ["EDGES", "STATES", "Edge", "WindowState", "as_before", "as_edge", "as_state"]

#: A window's state: open (``pending``), taken for dispatch (``dispatching``, under a
#: lease), published (``queued``), run by a worker (``claimed``, under a claim lease),
#: that lease passed (``stale``), done (``finished``) or set aside (``quarantined``).
WindowState = Literal[
    "pending", "dispatching", "queued", "claimed", "stale", "finished", "quarantined"
]
#: What the gate says of an edge call: a leading run (``lead``), folded into one
#: (``suppressed``), or neither (``""``).
Edge = Literal["lead", "suppressed", ""]

STATES: frozenset[str] = frozenset(get_args(WindowState))
EDGES: frozenset[str] = frozenset(get_args(Edge))

# The readers below type what a store wrote; they never refuse it. During a deploy a
# newer package's scripts or functions may write a state or an edge this one does not
# know: refusing it would fail a call the store already wrote (a gate) or a claim whose
# run was decided, so it passes through as it is, and compares equal to no known one.


def as_state(text: str) -> WindowState:
    """``text`` read from a store as a :data:`WindowState` (an unknown one as it is)."""
    return cast(WindowState, text)


def as_before(text: str) -> WindowState | Literal[""]:
    """A claim's ``before`` read from a store: a :data:`WindowState`, or ``""`` when the
    window's record is gone (an unknown state as it is)."""
    return cast(WindowState, text)


def as_edge(text: str) -> Edge:
    """``text`` read from a store as an :data:`Edge` (an unknown one as it is)."""
    return cast(Edge, text)
