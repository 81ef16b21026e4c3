"""The store's side of ``celery debounce doctor``: the key scan and one call per
``doctor_*.lua`` step (each decides, and with repair fixes, inside one script)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...settings import Settings
from ..records import as_text
from .keys import all_keys_pattern, held_key
from .translate import translate_errors

#: Names (ARGV) per doctor script call: a step stays short on a busy server.
DOCTOR_BATCH = 200


class DoctorOps:
    """``doctor`` reads and repairs of :class:`~celery_debounce.store.WindowStore`."""

    settings: Settings
    client: Any
    run: Callable[[str, list[str], list[Any]], Any]

    def doctor_keys(self, kind: str = "") -> Iterator[str]:
        """Every key under the prefix (SCAN; each master of a cluster), or only those
        ``<tag>:<kind>:...``."""
        pattern = all_keys_pattern(self.settings.key_prefix)
        if kind:
            pattern += f"}}:{kind}:*"
        with translate_errors("doctor"):
            for key in self.client.scan_iter(match=pattern, count=1000):
                yield as_text(key)

    def held_members(self, tag: str) -> list[str]:
        """The idents in ``<tag>:held`` (a held window stays there until its run ends)."""
        with translate_errors("doctor"):
            return [as_text(m) for m in self.client.zrange(held_key(tag), 0, -1)]

    def collect_lists_named(self, open_keys: Sequence[str]) -> set[str]:
        """The ``cl`` field of each of these open records (a collect window's list)."""
        found: set[str] = set()
        with translate_errors("doctor"):
            for start in range(0, len(open_keys), DOCTOR_BATCH):
                with self.client.pipeline(transaction=False) as pipe:
                    for key in open_keys[start : start + DOCTOR_BATCH]:
                        pipe.hget(key, "cl")
                    found.update(
                        as_text(v)
                        for v in pipe.execute(raise_on_error=False)
                        if isinstance(v, bytes)
                    )
        return found

    def doctor_step(
        self, script: str, tag: str, first_key: str, names: Sequence[str], repair: bool, *extra: Any
    ) -> list[Any]:
        """Run ``doctor_<script>.lua`` on ``names`` of one tag, in batches; its findings.

        Each script is idempotent (it decides from the state it reads, and a repair
        makes that state healthy), so a repeat after a lost reply changes nothing.
        """
        found: list[Any] = []
        keys = [f"{tag}:{first_key}"]
        flag = "1" if repair else "0"
        if not names:
            return list(self.run(f"doctor_{script}", keys, [tag, flag, *extra]))
        for start in range(0, len(names), DOCTOR_BATCH):
            found += self.run(
                f"doctor_{script}", keys, [tag, flag, *extra, *names[start : start + DOCTOR_BATCH]]
            )
        return found
