"""``celery debounce check --connect`` on the Redis store: the server answers as the
package needs it (its version, its scripts over the prefix's keys), and the key prefix
is one something uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import DebounceError
from ..reach import Reached

if TYPE_CHECKING:  # pragma: no cover
    from .. import WindowStore

__all__ = ["reach_redis"]

#: Keys whose name ends so are written by a deployment of this package under its prefix
#: (``<prefix>:layouts``, ``<prefix>:{<shard>}:due``, ``<prefix>:{<shard>}:alive``).
_MARKS = (":layouts", ":due", ":alive")
#: The most keys looked at for other deployments' prefixes, per server.
SCAN_LIMIT = 100_000


def reach_redis(store: WindowStore) -> Reached:
    """What reaching ``store``'s Redis found (:class:`Reached`)."""
    found = Reached()
    prefix = store.settings.key_prefix
    try:
        store.check_server(outage_raises=True)
        versions = store.server_versions()
        if not versions and not store.ping():
            found.problems.append(("unreachable", "the windows' Redis does not answer"))
            return found
        found.server = (
            ", ".join(f"{name} {version} at {where}" for where, name, version in versions)
            or "Redis (its version could not be read)"
        )
        now = store.time_ms()
        counts = [store.counts(shard, now) for shard in range(store.settings.shards)]
        _, alive, stopped = store.liveness()
        _, layouts = store.layouts()
    except DebounceError as exc:
        return found.refused(exc)
    windows = sum(c.open for c in counts)
    found.notes.append(
        f"key prefix {prefix!r}: {windows} open window(s), {len(alive)} dispatcher(s) "
        f"alive, {len(layouts)} layout(s) recorded"
    )
    if windows or alive or stopped or layouts or any(c.counters for c in counts):
        return found
    others = sorted(_prefixes(store) - {prefix})
    if others:
        found.problems.append(
            (
                "key prefix",
                f"debounce_key_prefix={prefix!r} is used by nothing on this server (no "
                f"window, dispatcher or layout), while {', '.join(map(repr, others))} "
                "is: a misspelt prefix, or the wrong database?",
            )
        )
    else:
        found.notes.append(f"nothing uses key prefix {prefix!r} yet (a new deployment)")
    return found


def _prefixes(store: WindowStore) -> set[str]:
    """The key prefixes of this package's deployments on the store's servers (each
    looked at up to :data:`SCAN_LIMIT` keys)."""
    found: set[str] = set()
    for _, client in store.transport.servers():
        cursor, seen = b"0", 0
        while seen < SCAN_LIMIT:
            cursor, keys = client.execute_command("SCAN", cursor, "COUNT", 1000)
            seen += max(1, len(keys))
            for key in keys:
                name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
                if name.endswith(":layouts"):
                    found.add(name[: -len(":layouts")])
                elif name.endswith(_MARKS) and ":{" in name:
                    found.add(name[: name.rindex(":{")])
            if int(cursor) == 0:
                break
    return found
