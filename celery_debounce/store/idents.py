"""Idents and shards: how a call's (task, key) names its window in every store, which
shard of a layout it lives in, and a shard's wire form on a message. Nothing here knows
how a store keeps its windows.
"""

from __future__ import annotations

import fnmatch
import zlib
from functools import lru_cache
from typing import Literal

from ..errors import DebounceConfigError


def window_ident(task_name: str, key: str) -> str:
    """Injective encoding of (task, key): ``<UTF-8 bytes of task>:<task>:<key>``.

    The length counts UTF-8 bytes, as the Lua scripts do (``string.sub``), so both
    sides cut the same task name out of an ident whatever characters it holds.
    """
    return ident_prefix(task_name) + key


@lru_cache(maxsize=4096)
def ident_prefix(task_name: str) -> str:
    """``<UTF-8 bytes of task>:<task>:``, what every ident of ``task_name`` starts with."""
    try:
        size = len(task_name.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise DebounceConfigError(
            f"task name {task_name!r}: not valid Unicode text ({exc.reason})"
        ) from None
    if "\x00" in task_name:
        raise DebounceConfigError(f"task name {task_name!r}: a NUL character cannot be stored")
    return f"{size}:{task_name}:"


def shard_of(ident: str, shards: int) -> int:
    """The shard a window lives in: ``crc32(ident) % shards``."""
    return zlib.crc32(ident.encode("utf-8")) % shards if shards > 1 else 0


def shard_tag(prefix: str, shard: int) -> str:
    """A shard's wire form (a message's ``debounce_tag``) and, on Redis, the hash-tagged
    prefix of its keys: ``<prefix>:{<shard>}``."""
    return f"{prefix}:{{{shard}}}"


def is_tag_of(prefix: str, tag: object) -> bool:
    """True when ``tag`` is a shard's wire form under ``prefix`` (``<prefix>:{<digits and
    dots>}``: a Redis Cluster's tags have dots), as a message's ``debounce_tag`` must be:
    a header naming any other key is ignored."""
    if not isinstance(tag, str) or not tag.startswith(prefix + ":{") or not tag.endswith("}"):
        return False
    inner = tag[len(prefix) + 2 : -1]
    return (
        bool(inner)
        and len(inner) <= 32
        and all(c.isdigit() or c == "." for c in inner)
        and inner.isascii()
    )


def split_ident(ident: str) -> tuple[str, str]:
    """Inverse of :func:`window_ident`."""
    length, _, rest = ident.partition(":")
    size = int(length)
    if rest.isascii():
        if rest[size : size + 1] != ":":
            raise ValueError(f"malformed ident {ident!r}")
        return rest[:size], rest[size + 1 :]
    raw = rest.encode("utf-8")
    if raw[size : size + 1] == b":":
        try:
            return raw[:size].decode("utf-8"), raw[size + 1 :].decode("utf-8")
        except UnicodeDecodeError:
            pass
    if rest[size : size + 1] == ":":  # written before 0.2: the length in characters
        return rest[:size], rest[size + 1 :]
    raise ValueError(f"malformed ident {ident!r}")


#: A group of taken windows (:data:`TAKEN_SETS`).
TakenGroup = Literal["leased", "active", "quarantine"]

#: The groups of taken windows (in the Redis store, its sorted sets) and the states a
#: window listed in each can be in.
TAKEN_SETS: tuple[tuple[TakenGroup, frozenset[str]], ...] = (
    ("leased", frozenset({"dispatching"})),
    ("active", frozenset({"queued", "claimed"})),
    ("quarantine", frozenset({"quarantined"})),
)


def matches(ident: str, task: str | None, key_glob: str | None) -> bool:
    """:func:`key_matches` for the window ``ident``; a malformed ident matches only when
    nothing is filtered."""
    try:
        name, key = split_ident(ident)
    except ValueError:
        return task is None and key_glob is None
    return key_matches(name, key, task, key_glob)


def key_matches(name: str, key: str, task: str | None, key_glob: str | None) -> bool:
    """Whether a window of task ``name`` and key ``key`` is of ``task`` (None: any) and its
    key matches the ``fnmatch`` glob ``key_glob`` (None: any; case-sensitive): the
    operators' one filter, in every store and in ``inspect``."""
    if task is not None and name != task:
        return False
    return key_glob is None or fnmatch.fnmatchcase(key, key_glob)
