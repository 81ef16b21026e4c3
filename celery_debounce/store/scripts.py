"""The Lua scripts: read from ``celery_debounce/lua/`` and, on a cluster, switched to
sharded wake-ups (SPUBLISH)."""

from __future__ import annotations

from importlib import resources


def _script_names() -> tuple[str, ...]:
    lua = resources.files("celery_debounce").joinpath("lua")
    return tuple(sorted(p.name[:-4] for p in lua.iterdir() if p.name.endswith(".lua")))


#: Every script in celery_debounce/lua/, by file name (listed at import).
SCRIPT_NAMES = _script_names()


#: The line of gate.lua and flush.lua that chooses plain PUBLISH to ``<prefix>:wake``;
#: :func:`script_source` turns it on (SPUBLISH to ``<tag>:wake``) for a cluster.
SHARDED_WAKE_OFF = "local SHARDED_WAKE = false"
SHARDED_WAKE_ON = "local SHARDED_WAKE = true"


def script_source(name: str, sharded_wake: bool = False) -> str:
    lua = resources.files("celery_debounce").joinpath("lua")
    source = lua.joinpath(f"{name}.lua").read_text("utf-8")
    if sharded_wake and SHARDED_WAKE_OFF in source:
        source = source.replace(SHARDED_WAKE_OFF, SHARDED_WAKE_ON, 1)
    return source
