"""Start-up checks of the windows' Redis: settings there that break the guarantees.

Window records must never be evicted: an evicted ``open:`` record loses its calls, an
evicted ``win:`` record (these carry ``debounce_record_ttl``) loses a window that is
still being dispatched or run. Redis evicts keys only under its ``maxmemory-policy``:
``noeviction`` (the default) is safe, every ``allkeys-*`` policy can evict any window
and every ``volatile-*`` policy the taken ones.
"""

from __future__ import annotations

import logging
from typing import Any

#: The policy read when Redis does not say (CONFIG refused, ...): see
#: :meth:`WindowStore.maxmemory_policy <celery_debounce.store.WindowStore.maxmemory_policy>`.
UNKNOWN = "unknown"


def combined_policy(policies: list[str]) -> str:
    """One answer for several servers (a cluster's masters): the policy of one that can
    evict windows if any can, else the common policy (``unknown`` when one does not
    say, or they differ)."""
    evicting = [p for p in policies if evicts_windows(p)]
    if evicting:
        return evicting[0]
    return policies[0] if policies and len(set(policies)) == 1 else UNKNOWN


def evicts_windows(policy: str) -> bool | None:
    """True if ``policy`` can evict window keys, False if not, None when unknown."""
    if policy == UNKNOWN:
        return None
    return policy.startswith(("allkeys-", "volatile-"))


def describe_policy(policy: str) -> str:
    """One line for ``celery debounce stats``."""
    evicts = evicts_windows(policy)
    if evicts is None:
        return "maxmemory-policy: unknown (CONFIG GET refused or unavailable)"
    if evicts:
        return (
            f"maxmemory-policy: {policy}  WARNING: Redis may evict window records "
            "(set maxmemory-policy noeviction)"
        )
    return f"maxmemory-policy: {policy}"


def store_policy(store: Any) -> str | None:
    """The eviction policy of the windows' Redis (``maxmemory-policy``), or None for a
    store that never evicts (it has no such setting: PostgreSQL)."""
    read = getattr(store, "maxmemory_policy", None)
    return None if read is None else str(read())


def warn_if_evicting(store: Any, who: str, logger: logging.Logger | None = None) -> str | None:
    """Log a WARNING if the windows' Redis may evict window keys; return the policy (None:
    a store that never evicts, nothing logged)."""
    log = logger or logging.getLogger("celery_debounce")
    policy = store_policy(store)
    if policy is None:
        return None
    evicts = evicts_windows(policy)
    if evicts:
        log.warning(
            "debounce: %s: the windows' Redis has maxmemory-policy %s, which can evict "
            "window records (pending calls or windows being dispatched would be lost): "
            "use maxmemory-policy noeviction for the debounce Redis",
            who,
            policy,
        )
    elif evicts is None:
        log.info(
            "debounce: %s: could not read the windows' Redis maxmemory-policy "
            "(CONFIG GET refused?); make sure it is noeviction",
            who,
        )
    return policy
