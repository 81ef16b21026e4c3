"""The dispatchers' heartbeats and their read (a base of
:class:`~celery_debounce.store.redis.operators.Operators`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...settings import Settings
from ..records import as_text
from ..results import Shard
from .keys import alive_key, stopped_key
from .translate import translate_errors


class Liveness:
    """``heartbeat`` (the dispatcher's) and ``liveness`` (the operators' read)."""

    settings: Settings
    client: Any
    run: Callable[[str, list[str], list[Any]], Any]

    if TYPE_CHECKING:  # pragma: no cover

        def tag(self, shard: Shard) -> str: ...

        def time_ms(self, operation: str = "time") -> int: ...

    def heartbeat(self, name: str, alive: bool = True) -> int:
        """Record that dispatcher ``name`` runs (``alive``) or stopped cleanly
        (``alive.lua``, on shard 0's tag); returns the Redis time, ms."""
        tag = self.tag(0)
        return int(
            self.run(
                "alive",
                [alive_key(tag), stopped_key(tag)],
                [name, "1" if alive else "0", self.settings.history_ttl_ms],
            )
        )

    def liveness(self) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
        """``(Redis time ms, [(name, last heartbeat ms)], [(name, stopped at ms)])``."""
        tag = self.tag(0)
        now_ms = self.time_ms("ping")
        with translate_errors("ping"), self.client.pipeline(False) as pipe:
            pipe.zrange(alive_key(tag), 0, -1, withscores=True)
            pipe.zrange(stopped_key(tag), 0, -1, withscores=True)
            alive, stopped = pipe.execute()
        return (
            now_ms,
            [(as_text(n), int(ms)) for n, ms in alive],
            [(as_text(n), int(ms)) for n, ms in stopped],
        )
