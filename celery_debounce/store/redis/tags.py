"""The Redis store's shard layout: each shard's hash tag, the channels named from them,
Redis Cluster's slot arithmetic, and the layouts a dispatcher drains
(docs/design.md, "Key layout").

Keys of shard ``s`` start with its hash-tagged prefix ``<P>:{s}``
(:func:`~celery_debounce.store.idents.shard_tag`, a shard's wire form in every store),
so every key of one window is in one cluster slot; on a cluster the tag is chosen so
that the shards spread over the masters (:func:`cluster_shard_tag`). Every other key
builder is :mod:`celery_debounce.store.redis.keys`'s.
"""

from __future__ import annotations

import binascii
import itertools
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from ..idents import shard_tag

if TYPE_CHECKING:  # pragma: no cover
    from ...settings import Settings


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


#: Layouts with more shards than this are ignored when read back (a garbled field).
MAX_LAYOUT_SHARDS = 4096


def layout_tags(prefix: str, name: str) -> tuple[str, ...]:
    """Every tag a layout named ``name`` reads: ``node:<N>`` the single-node tags of
    ``N`` shards; ``cluster:<N>`` the cluster tags of ``N`` shards and the single-node
    tags it drains (:attr:`ShardLayout.legacy_shards`). Empty for a name it cannot read."""
    kind, _, count = name.partition(":")
    if not count.isdigit() or not 0 < int(count) <= MAX_LAYOUT_SHARDS:
        return ()
    shards = int(count)
    if kind == "node":
        return shard_tags(prefix, shards)
    if kind == "cluster":
        return cluster_shard_tags(prefix, shards) + shard_tags(prefix, shards)
    return ()


@dataclass(frozen=True)
class ShardLayout:
    """One process's shard layout on Redis (``debounce_key_prefix``, ``debounce_shards``,
    ``debounce_redis_cluster``): the store's ``layout``, which its dispatcher reads."""

    prefix: str
    shards: int
    cluster: bool

    def tag(self, shard: int) -> str:
        """The hash-tagged prefix every key of ``shard`` starts with.

        ``{<shard>}`` on a single node; on a cluster the tag of :func:`cluster_shard_tag`,
        so shard ``i`` of ``N`` lands in the ``i``-th ``N``-th of the slot range (and so
        on its own master when ``N`` is a multiple of the masters). On a cluster,
        ``shards + i`` is the single-node tag of shard ``i`` (see :attr:`legacy_shards`).
        """
        if self.cluster:
            if shard >= self.shards:
                return shard_tag(self.prefix, shard - self.shards)
            return self.tags[shard]
        return shard_tag(self.prefix, shard)

    @cached_property
    def tags(self) -> tuple[str, ...]:
        """:meth:`tag` of every shard, built once."""
        if self.cluster:
            return cluster_shard_tags(self.prefix, self.shards)
        return shard_tags(self.prefix, self.shards)

    @property
    def name(self) -> str:
        """This layout's name in ``<prefix>:layouts`` (:func:`layout_name`)."""
        return layout_name(self.shards, self.cluster)

    @cached_property
    def legacy_shards(self) -> tuple[int, ...]:
        """On a cluster, the shards of the single-node layout (``{<i>}``) whose tag
        differs from the cluster tag, numbered ``shards + i``: windows a release
        before cluster support wrote there are drained by the dispatchers (taken and
        published as usual; their runs find their records by this number), never
        written again. Empty on a single node and with one shard (same tag)."""
        if not self.cluster:
            return ()
        return tuple(
            self.shards + i
            for i in range(self.shards)
            if cluster_shard_tag(i, self.shards) != str(i)
        )

    def tags_of(self, name: str) -> tuple[str, ...]:
        """The tags a layout named ``name`` reads (:func:`layout_tags`)."""
        return layout_tags(self.prefix, name)

    @property
    def wake_channel(self) -> str:
        return wake_channel(self.prefix)

    def shard_wake_channel(self, shard: int) -> str:
        """The sharded pub/sub channel of ``shard`` (cluster): in the shard's slot."""
        return shard_wake_channel(self.tag(shard))


def layout_of(settings: Settings) -> ShardLayout:
    """The layout of ``settings``, built once per process."""
    return _layout(settings.key_prefix, settings.shards, settings.redis_cluster)


@lru_cache(maxsize=64)
def _layout(prefix: str, shards: int, cluster: bool) -> ShardLayout:
    return ShardLayout(prefix, shards, cluster)
