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

#: What :func:`maxmemory_policy` returns when Redis does not say (CONFIG refused, ...).
UNKNOWN = "unknown"


def maxmemory_policy(client: Any) -> str:
    """The server's ``maxmemory-policy``, or ``"unknown"`` if it cannot be read.

    ``CONFIG GET`` is often refused to a least-privilege ACL user or by managed
    services; that is never an error here.
    """
    try:
        reply = client.config_get("maxmemory-policy")
    except Exception:  # NOPERM, unknown command, outage: say unknown, never fail
        return UNKNOWN
    value = reply.get("maxmemory-policy", reply.get(b"maxmemory-policy")) if reply else None
    if value is None:
        return UNKNOWN
    return value.decode() if isinstance(value, bytes) else str(value)


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
        return (f"maxmemory-policy: {policy}  WARNING: Redis may evict window records "
                "(set maxmemory-policy noeviction)")
    return f"maxmemory-policy: {policy}"


def warn_if_evicting(store: Any, who: str, logger: logging.Logger | None = None) -> str:
    """Log a WARNING if the windows' Redis may evict window keys; return the policy.
    ``store``: a :class:`~celery_debounce.store.WindowStore`."""
    log = logger or logging.getLogger("celery_debounce")
    policy: str = store.maxmemory_policy()
    evicts = evicts_windows(policy)
    if evicts:
        log.warning(
            "debounce: %s: the windows' Redis has maxmemory-policy %s, which can evict "
            "window records (pending calls or windows being dispatched would be lost): "
            "use maxmemory-policy noeviction for the debounce Redis", who, policy,
        )
    elif evicts is None:
        log.info("debounce: %s: could not read the windows' Redis maxmemory-policy "
                 "(CONFIG GET refused?); make sure it is noeviction", who)
    return policy
