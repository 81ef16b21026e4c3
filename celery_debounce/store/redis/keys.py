"""The Redis store's key names: every key builder (docs/design.md, "Key layout");
``lua/lib/keys.lua`` holds their Lua twins, checked against these by
tests/store/redis/test_lua_library.py. Idents and shards are the store's
(:mod:`celery_debounce.store.idents`), the shards' hash tags
:mod:`celery_debounce.store.redis.tags`'s. Nothing here talks to Redis.
"""

from __future__ import annotations


def layouts_key(prefix: str) -> str:
    """hash layout name -> ms: the shard layouts whose dispatchers took windows lately
    (layouts.lua); dispatchers of another layout drain their shards."""
    return f"{prefix}:layouts"


def tasks_key(prefix: str) -> str:
    """hash task name -> definition JSON: what a producer by name reads of each
    debounced task (``producer/published.py``); written by workers at start and by
    ``celery debounce publish``."""
    return f"{prefix}:tasks"


def open_key(tag: str, ident: str) -> str:
    """The record of the pending window of ``ident`` (hash)."""
    return f"{tag}:open:{ident}"


def win_key(tag: str, task_id: str) -> str:
    """The record of a taken window (hash)."""
    return f"{tag}:win:{task_id}"


def due_key(tag: str) -> str:
    """zset ident -> deadline ms: the pending windows."""
    return f"{tag}:due"


def leased_key(tag: str) -> str:
    """zset task id -> lease expiry ms: windows taken, publish not confirmed."""
    return f"{tag}:leased"


def active_key(tag: str) -> str:
    """zset task id -> ms handed to the broker: queued and claimed windows."""
    return f"{tag}:active"


def run_key(tag: str, ident: str) -> str:
    """hash, field ``id``: the window of ``ident`` in progress (``debounce_exclusive``),
    from its take until its run ends (finish.lua) or its claim goes stale (take.lua)."""
    return f"{tag}:run:{ident}"


def held_key(tag: str) -> str:
    """zset ident -> ms held since: exclusive windows held while a run of their key is
    in progress (take.lua); due at once when that run ends (finish.lua, take.lua)."""
    return f"{tag}:held"


def claims_key(tag: str) -> str:
    """zset task id -> claim lease expiry ms: windows a worker is running (claim.lua)."""
    return f"{tag}:claims"


def expiring_key(tag: str) -> str:
    """zset task id -> ms its message expires: published windows with ``expires``
    (expiring.lua), finished as REVOKED by expire.lua if still queued then."""
    return f"{tag}:expiring"


def quarantine_key(tag: str) -> str:
    """zset task id -> ms quarantined."""
    return f"{tag}:quarantine"


def stats_key(tag: str) -> str:
    """hash of counters per task (see :data:`COUNTER_KINDS`)."""
    return f"{tag}:stats"


def stats_reset_key(tag: str, token: str) -> str:
    """Where ``stats --reset`` renames a shard's counters (same slot)."""
    return f"{stats_key(tag)}:reset:{token}"


def quiet_key(tag: str, ident: str) -> str:
    """hash: the quiet period after a leading run of ``ident`` (gate.lua writes it;
    fields :data:`QUIET_FIELDS`)."""
    return f"{tag}:quiet:{ident}"


def hot_key(tag: str) -> str:
    """zset ident -> calls absorbed by its taken windows (top 100)."""
    return f"{tag}:hot"


def calls_key(tag: str, collect_list: str) -> str:
    """list: a debounce_collect window's calls, in call order (record field ``cl``)."""
    return f"{tag}:calls:{collect_list}"


def ids_key(tag: str) -> str:
    """hash task id -> ident: the pending windows opened under a caller-chosen id
    (written by gate.lua only; the Python side never reads it, lib/keys.lua's twin is
    checked against this one)."""
    return f"{tag}:ids"


def dispatchers_key(tag: str) -> str:
    """zset dispatcher name -> ms of its last pass that took windows."""
    return f"{tag}:dispatchers"


def alive_key(tag: str) -> str:
    """zset dispatcher name -> ms of its last heartbeat (``alive.lua``; shard 0's tag)."""
    return f"{tag}:alive"


def stopped_key(tag: str) -> str:
    """zset dispatcher name -> ms it stopped cleanly (``alive.lua``; shard 0's tag)."""
    return f"{tag}:stopped"


def bulk_marker_prefix(tag: str, token: str) -> str:
    """``enqueue_many``'s "this chunk ran" marker keys start with this (plus the chunk's start)."""
    return f"{tag}:bulk:{token}:"


def cancel_marker_key(tag: str, token: str) -> str:
    """``cancel.lua``'s "this cancel ran" key: its reply, kept so that the same call sent
    again (its reply was lost) gets the same answer instead of acting twice."""
    return f"{tag}:cancelled:{token}"


def all_keys_pattern(prefix: str) -> str:
    """A SCAN pattern matching every key (and nothing else) under ``prefix``.

    Every key of the package but :func:`layouts_key` and :func:`tasks_key` (which
    callers add by name) is
    ``<prefix>:{<tag>}:...`` (``shard_tag``), so the pattern ends in ``:{*``: another
    app's prefix that starts with this one and a colon (``debounce:tenant2``) is not
    matched. Glob characters in the prefix (``*``, ``?``, ``[``, ``]``, ``\\``)
    are escaped, so they match only themselves.
    """
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}:{{*"


_SET_KEYS = {"leased": leased_key, "active": active_key, "quarantine": quarantine_key}


def taken_set_key(tag: str, name: str) -> str:
    """The key of one of :data:`~celery_debounce.store.idents.TAKEN_SETS` by name."""
    return _SET_KEYS[name](tag)
