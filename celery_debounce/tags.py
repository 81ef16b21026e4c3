"""The shards' hash tags and the channels named from them: the one cluster fact of
the key layout (docs/design.md, "Key layout"), and Redis Cluster's slot arithmetic.

``Settings`` computes its tags and channels with these, and a worker checks a message's
tag and a dispatcher reads a layout's tags with them (so they stay outside ``store/``
until ``Settings.tag``/``tags`` move there); every other key builder is the Redis
store's (:mod:`celery_debounce.store.redis.keys`). Keys of shard ``s`` start with its hash-tagged
prefix ``<P>:{s}`` (:func:`shard_tag`), so every key of one window is in one cluster slot.
"""

from __future__ import annotations

import binascii
import itertools
from functools import lru_cache


def shard_tag(prefix: str, shard: int) -> str:
    """The hash-tagged prefix every key of ``shard`` starts with: ``<prefix>:{<shard>}``."""
    return f"{prefix}:{{{shard}}}"


def shard_tags(prefix: str, shards: int) -> tuple[str, ...]:
    """:func:`shard_tag` of every shard."""
    return tuple(shard_tag(prefix, shard) for shard in range(shards))


def layout_name(shards: int, cluster: bool) -> str:
    """How a shard layout is named in :func:`layouts_key`: ``node:<N>`` or ``cluster:<N>``."""
    return f"{'cluster' if cluster else 'node'}:{shards}"


def wake_channel(prefix: str) -> str:
    """The pub/sub channel gate.lua and flush.lua publish "an earlier deadline" on."""
    return f"{prefix}:wake"


#: Redis Cluster's hash slots.
CLUSTER_SLOTS = 16384


def key_slot(key: str) -> int:
    """The Redis Cluster hash slot of ``key``: CRC16 (XMODEM) of its hash tag (the
    text between the first ``{`` and the next ``}``, when not empty), else of the key."""
    raw = key.encode("utf-8")
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return binascii.crc_hqx(raw, 0) % CLUSTER_SLOTS


@lru_cache(maxsize=256)
def cluster_shard_tag(shard: int, shards: int) -> str:
    """The hash tag (without braces) of ``shard`` of ``shards`` on a Redis Cluster.

    Its slot falls in ``[shard * 16384 // shards, (shard + 1) * 16384 // shards)``:
    ``redis-cli --cluster create`` gives each master one contiguous range, so with
    ``shards`` a multiple of the masters the shards spread evenly. The tag is
    ``<shard>`` itself when its slot already falls there (always for one shard:
    ``{0}``, the single-node tag), else ``<shard>.<k>`` for the smallest ``k`` that
    does. Deterministic: every process computes the same tags.
    """
    low = shard * CLUSTER_SLOTS // shards
    high = (shard + 1) * CLUSTER_SLOTS // shards
    for candidate in itertools.chain((str(shard),), (f"{shard}.{k}" for k in itertools.count())):
        if low <= key_slot(candidate) < high:
            return candidate
    raise AssertionError("unreachable")  # pragma: no cover


def cluster_shard_tags(prefix: str, shards: int) -> tuple[str, ...]:
    """``<prefix>:{<cluster_shard_tag>}`` of every shard (``debounce_redis_cluster``)."""
    return tuple(f"{prefix}:{{{cluster_shard_tag(shard, shards)}}}" for shard in range(shards))


def shard_wake_channel(tag: str) -> str:
    """The sharded pub/sub channel of one shard (a cluster with SPUBLISH): in its slot."""
    return f"{tag}:wake"


def is_tag_of(prefix: str, tag: object) -> bool:
    """True when ``tag`` is a shard tag under ``prefix`` (``<prefix>:{<digits and dots>}``),
    as a :data:`TAG_HEADER` must be: a header naming any other key is ignored."""
    if not isinstance(tag, str) or not tag.startswith(prefix + ":{") or not tag.endswith("}"):
        return False
    inner = tag[len(prefix) + 2 : -1]
    return (
        bool(inner)
        and len(inner) <= 32
        and all(c.isdigit() or c == "." for c in inner)
        and inner.isascii()
    )


#: Layouts with more shards than this are ignored when read back (a garbled field).
MAX_LAYOUT_SHARDS = 4096


def layout_tags(prefix: str, name: str) -> tuple[str, ...]:
    """Every tag a layout named ``name`` reads: ``node:<N>`` the single-node tags of
    ``N`` shards; ``cluster:<N>`` the cluster tags of ``N`` shards and the single-node
    tags it drains (``settings.legacy_shards``). Empty for a name it cannot read."""
    kind, _, count = name.partition(":")
    if not count.isdigit() or not 0 < int(count) <= MAX_LAYOUT_SHARDS:
        return ()
    shards = int(count)
    if kind == "node":
        return shard_tags(prefix, shards)
    if kind == "cluster":
        return cluster_shard_tags(prefix, shards) + shard_tags(prefix, shards)
    return ()
