"""The Lua scripts: read from ``store/redis/lua/``, their ``--@include NAME`` lines
replaced by ``store/redis/lua/lib/NAME.lua``, and, on a cluster, switched to sharded
wake-ups (SPUBLISH)."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

#: A line ``--@include NAME`` (alone on its line) is replaced by the text of
#: ``lua/lib/NAME.lua``: every path (EVALSHA, SCRIPT LOAD on each cluster node, fakeredis)
#: sees one flat script, whose SHA is that of the flat text.
INCLUDE = re.compile(r"^--@include ([A-Za-z0-9_]+)[ \t]*$", re.MULTILINE)


def _lua() -> Traversable:
    return resources.files(__package__).joinpath("lua")


def _script_names() -> tuple[str, ...]:
    return tuple(sorted(p.name[:-4] for p in _lua().iterdir() if p.name.endswith(".lua")))


#: Every script in celery_debounce/store/redis/lua/, by file name (listed at import).
SCRIPT_NAMES = _script_names()


#: The line of gate.lua and flush.lua that chooses plain PUBLISH to ``<prefix>:wake``;
#: :func:`script_source` turns it on (SPUBLISH to ``<tag>:wake``) for a cluster.
SHARDED_WAKE_OFF = "local SHARDED_WAKE = false"
SHARDED_WAKE_ON = "local SHARDED_WAKE = true"


def library_names() -> tuple[str, ...]:
    """The includable pieces, by file name in ``celery_debounce/store/redis/lua/lib/``."""
    lib = _lua().joinpath("lib")
    return tuple(sorted(p.name[:-4] for p in lib.iterdir() if p.name.endswith(".lua")))


def inline_includes(
    source: str, where: str, read: Callable[[str], str | None] | None = None
) -> str:
    """``source`` with each ``--@include NAME`` line replaced by ``lib/NAME.lua`` (its own
    includes resolved the same way); a piece already included is not included again.

    ``where`` names the script in the error for an unknown piece. ``read`` (for tests)
    maps a name to its text, or None for an unknown one; by default the package's lib/.
    """
    lib = _lua().joinpath("lib")

    def default(name: str) -> str | None:
        piece = lib.joinpath(f"{name}.lua")
        return piece.read_text("utf-8") if piece.is_file() else None

    reader = read or default
    done: set[str] = set()

    def expand(text: str, owner: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in done:
                return ""
            piece = reader(name)
            if piece is None:
                raise ValueError(
                    f"{owner}: --@include {name}: no celery_debounce/store/redis/lua/lib/"
                    f"{name}.lua (the library has: {', '.join(library_names()) or 'nothing'})"
                )
            done.add(name)
            return expand(piece, f"lib/{name}.lua").rstrip("\n")

        return INCLUDE.sub(one, text)

    return expand(source, where)


def script_source(name: str, sharded_wake: bool = False) -> str:
    """The flat text of ``lua/<name>.lua`` that is loaded into Redis (includes inlined)."""
    source = _lua().joinpath(f"{name}.lua").read_text("utf-8")
    source = inline_includes(source, f"{name}.lua")
    if sharded_wake and SHARDED_WAKE_OFF in source:
        source = source.replace(SHARDED_WAKE_OFF, SHARDED_WAKE_ON, 1)
    return source
