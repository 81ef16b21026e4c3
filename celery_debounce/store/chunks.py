"""How a bulk call (``gate_many``) is cut into chunks, each one round trip: at most a
count of calls and at most :data:`CHUNK_BYTES` of bodies and options, so a batch of
large bodies is never one reply-sized request (a chunk's first call goes whatever its
size)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["CHUNK_BYTES", "chunks"]

#: The most bytes of bodies and options one chunk carries (docs/operations.md, "Bulk calls").
CHUNK_BYTES = 16 * 1024 * 1024


def chunks(calls: Sequence[Any], chunk_size: int, max_bytes: int | None = None) -> Iterator[range]:
    """Consecutive ranges of ``calls``' indexes, each at most ``chunk_size`` calls and at
    most ``max_bytes`` (:data:`CHUNK_BYTES`) of ``payload`` and ``options_json``."""
    budget = CHUNK_BYTES if max_bytes is None else max_bytes
    start, total = 0, len(calls)
    while start < total:
        end, used = start, 0
        while end < total and end - start < chunk_size:
            size = len(calls[end].payload) + len(calls[end].options_json)
            if end > start and used + size > budget:
                break
            used += size
            end += 1
        yield range(start, end)
        start = end
