"""The windows' Redis layout: key names, record fields, the record and options codecs.

This module is the one owner of every name the Python side shares with the Lua
scripts (docs/design.md, "Key layout" and "Window record fields"). Nothing here
talks to Redis; :mod:`celery_debounce.store` does, with these names.

Keys of shard ``s`` start with its hash-tagged prefix ``<P>:{s}`` (:func:`shard_tag`),
so every key of one window is in one cluster slot.
"""

from __future__ import annotations

import binascii
import itertools
import os
import zlib
from functools import lru_cache
from typing import Any, NamedTuple

from kombu.utils import json as kombu_json

from .errors import DebounceConfigError

#: Content type not stored in a window record (``ct`` absent means this).
DEFAULT_CONTENT_TYPE = "application/json"

#: Header that marks a published window and names where its record is: the shard's
#: whole tag (``<prefix>:{<tag>}``, :func:`shard_tag`, :func:`cluster_shard_tags`), so
#: a worker finds the record whatever its own ``debounce_shards``.
TAG_HEADER = "debounce_tag"

#: Header of 0.2 (still sent, for 0.2 workers during a rolling upgrade, and read from
#: messages without :data:`TAG_HEADER`): the window's shard *number*, which names the
#: record only for a reader with the writer's ``debounce_shards``.
SHARD_HEADER = "debounce_shard"

#: Header sent with ``debounce_redis_wait_replicas`` only: the window's ident, so that a
#: worker whose claim finds no record but the window still open under its id there
#: (the take was lost with a failover) skips the delivery (``claim.lua`` ARGV[6]).
IDENT_HEADER = "debounce_ident"

#: Header of a delivery a worker sent through the broker again because too few
#: replicas acknowledged its claim (``debounce_redis_wait_replicas``): how many times.
DEFERRED_HEADER = "debounce_deferred"

#: Header (in the stored options) of a ``debounce_exclusive`` window: ``take.lua`` finds
#: it in the options JSON (``"debounce_exclusive"``) and holds the window while a run of
#: its (task, key) is in progress (key :func:`run_key`).
EXCLUSIVE_HEADER = "debounce_exclusive"

#: Stored options of a call that has none (``o`` absent means this).
EMPTY_OPTIONS = "{}"

#: Upper bounds (ms) of the dispatch lateness buckets counted by take.lua in
#: ``l<b>|<task>`` (the last bucket, index ``len(LATE_BUCKETS_MS)``, is everything
#: above). take.lua receives them as its ARGV[8..]; nothing else keeps a copy.
LATE_BUCKETS_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)

#: How many idents ``<tag>:hot`` keeps (take.lua: calls absorbed per ident, for ``top``).
HOT_KEYS_KEPT = 100


# -- idents and shards ---------------------------------------------------------------------


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
    return f"{size}:{task_name}:"


def shard_of(ident: str, shards: int) -> int:
    """The shard a window lives in: ``crc32(ident) % shards``."""
    return zlib.crc32(ident.encode("utf-8")) % shards if shards > 1 else 0


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


# -- keys ------------------------------------------------------------------------------


def shard_tag(prefix: str, shard: int) -> str:
    """The hash-tagged prefix every key of ``shard`` starts with: ``<prefix>:{<shard>}``."""
    return f"{prefix}:{{{shard}}}"


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


def shard_tags(prefix: str, shards: int) -> tuple[str, ...]:
    """:func:`shard_tag` of every shard."""
    return tuple(shard_tag(prefix, shard) for shard in range(shards))


def layouts_key(prefix: str) -> str:
    """hash layout name -> ms: the shard layouts whose dispatchers took windows lately
    (layouts.lua); dispatchers of another layout drain their shards."""
    return f"{prefix}:layouts"


def layout_name(shards: int, cluster: bool) -> str:
    """How a shard layout is named in :func:`layouts_key`: ``node:<N>`` or ``cluster:<N>``."""
    return f"{'cluster' if cluster else 'node'}:{shards}"


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

    Every key of the package but :func:`layouts_key` (which callers add by name) is
    ``<prefix>:{<tag>}:...`` (``shard_tag``), so the pattern ends in ``:{*``: another
    app's prefix that starts with this one and a colon (``debounce:tenant2``) is not
    matched. Glob characters in the prefix (``*``, ``?``, ``[``, ``]``, ``\\``)
    are escaped, so they match only themselves.
    """
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    return f"{escaped}:{{*"


#: zsets of taken windows, and the states a window listed in each can be in.
TAKEN_SETS: tuple[tuple[str, frozenset[str]], ...] = (
    ("leased", frozenset({"dispatching"})),
    ("active", frozenset({"queued", "claimed"})),
    ("quarantine", frozenset({"quarantined"})),
)

_SET_KEYS = {"leased": leased_key, "active": active_key, "quarantine": quarantine_key}


def taken_set_key(tag: str, name: str) -> str:
    """The key of one of :data:`TAKEN_SETS` by name."""
    return _SET_KEYS[name](tag)


# -- stats counters ----------------------------------------------------------------------

#: Counter kinds in ``<tag>:stats`` (field ``<kind>|<task>``): runs, calls in them,
#: forced by max wait, cancelled, closed by the call cap, leading runs (take.lua), calls
#: suppressed after a leading run (gate.lua), duplicate deliveries skipped (claim.lua),
#: exclusive windows held and the ms they were held, counted when taken (take.lua);
#: ``l<b>`` is lateness bucket b.
COUNTER_KINDS = {
    "r": "runs",
    "c": "calls",
    "f": "forced",
    "x": "cancelled",
    "m": "closed_by_cap",
    "e": "leading_runs",
    "s": "suppressed",
    "d": "duplicates_skipped",
    "h": "holds",
    "hm": "held_ms",
    "i": "calls_in",
}


def split_counter(name: str) -> tuple[str, str]:
    """``(kind, task)`` of a stats field ``<kind>|<task>``."""
    kind, _, task = name.partition("|")
    return kind, task


# -- record fields -------------------------------------------------------------------------

F_ID = "id"  # the window's Celery task id
F_IDENT = "i"  # the ident, copied in when taken
F_FIRST_SEEN = "fs"  # first call, ms
F_DEADLINE = "dl"  # deadline ms (taken windows; pending ones: the due score)
F_MAX_WAIT = "mw"  # max wait in ms (a duration, from fs)
F_CALLS = "n"  # calls absorbed
F_CONTENT_TYPE = "ct"  # payload content type; absent: DEFAULT_CONTENT_TYPE
F_PAYLOAD = "p"  # the protocol-2 body
F_OPTIONS = "o"  # stored options JSON; absent: EMPTY_OPTIONS
F_STATE = "st"  # state once taken
F_ERROR = "qe"  # quarantine reason
F_MAX_CALLS = "mc"  # debounce_max_calls of the opener
F_CAPPED = "cx"  # 1: closed by the call cap, 2: a collect window closed full
F_COLLECT_LIST = "cl"  # a collect window's list suffix (calls_key), until take.lua splices
F_COLLECT_BYTES = "cb"  # a collect window: bytes of the body its run gets
F_TRIES = "tries"  # times taken
F_FAILURES = "fl"  # publish failures counted against it (not the broker's outages)
F_LEADING = "ld"  # 1: a leading run (debounce_leading), closed by gate.lua at once
F_TRAILING = "tr"  # 1: a trailing window, opened during a quiet period

#: The quiet period's hash (:func:`quiet_key`): the leading run's id, the leading
#: call's first seen and max wait, the quiet period's end (ms), calls, mode (L or B).
QUIET_FIELDS = ("id", "fs", "mw", "dl", "n", "m")
QUIET_ID, QUIET_END = QUIET_FIELDS[0], QUIET_FIELDS[3]  # what operator views read

#: Fields an operator view reads (HMGET) from a record.
INSPECT_FIELDS = (
    F_ID,
    F_IDENT,
    F_FIRST_SEEN,
    F_DEADLINE,
    F_MAX_WAIT,
    F_CALLS,
    F_STATE,
    F_ERROR,
    F_MAX_CALLS,
    F_LEADING,
    F_TRAILING,
    F_COLLECT_BYTES,
)
#: Fields the testing helpers read from a pending record (its payload and options too).
PAYLOAD_FIELDS = (
    F_ID,
    F_FIRST_SEEN,
    F_MAX_WAIT,
    F_CALLS,
    F_CONTENT_TYPE,
    F_PAYLOAD,
    F_OPTIONS,
    F_COLLECT_LIST,
)
#: The order of each window in take.lua's reply.
TAKE_FIELDS = (
    F_ID,
    F_IDENT,
    F_FIRST_SEEN,
    F_DEADLINE,
    F_MAX_WAIT,
    F_CALLS,
    F_CONTENT_TYPE,
    F_PAYLOAD,
    F_OPTIONS,
    F_TRIES,
    F_CAPPED,
    F_LEADING,
)
#: The order of each window in list.lua's reply (after its ident).
LIST_FIELDS = (
    F_ID,
    F_FIRST_SEEN,
    F_DEADLINE,
    F_MAX_WAIT,
    F_CALLS,
    F_MAX_CALLS,
    F_TRAILING,
    F_COLLECT_BYTES,
)
#: flush.lua's reply.
FLUSH_FIELDS = (F_ID, F_FIRST_SEEN, F_DEADLINE, F_MAX_WAIT, F_CALLS)
#: cancel.lua's reply (then the aliases).
CANCEL_FIELDS = (F_ID, F_CALLS, F_FIRST_SEEN, F_DEADLINE, F_MAX_WAIT)


class Record(NamedTuple):
    """One window record as decoded by :func:`decode_record` (times in Redis ms)."""

    task_id: str
    ident: str | None
    first_seen_ms: int
    deadline_ms: int
    max_wait_ms: int  # a duration: the ceiling is first_seen_ms + max_wait_ms
    calls: int
    state: str | None = None
    error: str | None = None
    max_calls: int | None = None
    content_type: str = DEFAULT_CONTENT_TYPE
    payload: bytes | None = None
    options_json: str = EMPTY_OPTIONS
    tries: int = 1
    capped: bool = False
    leading: bool = False  # ld: a leading run
    trailing: bool = False  # tr: a trailing window
    collected_bytes: int | None = None  # a debounce_collect window (cb)
    collect_list: str | None = None  # its list suffix while pending (cl)

    @property
    def ceiling_ms(self) -> int:
        """The absolute time (ms) the max wait forces the deadline to."""
        return self.first_seen_ms + self.max_wait_ms


def as_text(value: Any) -> str:
    """A Redis reply field (bytes) as text."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _strict_int(value: Any) -> int:
    return int(value)


def _lenient_int(value: Any) -> int:
    """0 when missing or garbled (an unreadable record is still shown)."""
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


def decode_record(
    fields: tuple[str, ...],
    row: list[Any] | tuple[Any, ...],
    *,
    ident: str | None = None,
    deadline: Any = None,
    strict: bool = False,
) -> Record | None:
    """The one record decoder: ``row`` holds the values of ``fields`` (an HMGET or a
    script's reply in that order). None when the record has no id (gone).

    ``ident``/``deadline`` supply what a pending record keeps outside its hash (its
    due member and score). ``strict``: a missing or garbled number raises
    (TypeError/ValueError/UnicodeDecodeError: the dispatcher quarantines the record);
    otherwise it reads as 0 (operator views show such records as they are).
    """
    get = dict(zip(fields, row, strict=False)).get
    tid = get(F_ID)
    if tid is None:
        return None
    number = _strict_int if strict else _lenient_int
    raw_ident = get(F_IDENT)
    ct = get(F_CONTENT_TYPE)
    opts = get(F_OPTIONS)
    mc = get(F_MAX_CALLS)
    st = get(F_STATE)
    qe = get(F_ERROR)
    payload = get(F_PAYLOAD)
    tries = get(F_TRIES)
    return Record(
        task_id=as_text(tid),
        ident=ident
        if ident is not None
        else (as_text(raw_ident) if raw_ident is not None else None),
        first_seen_ms=number(get(F_FIRST_SEEN)),
        deadline_ms=number(deadline if deadline is not None else get(F_DEADLINE)),
        max_wait_ms=number(get(F_MAX_WAIT)),
        calls=number(get(F_CALLS)),
        state=as_text(st) if st is not None else None,
        error=as_text(qe) if qe is not None else None,
        max_calls=_lenient_int(mc) if mc is not None else None,
        content_type=as_text(ct) if ct is not None else DEFAULT_CONTENT_TYPE,
        payload=(
            payload if isinstance(payload, bytes) or payload is None else as_text(payload).encode()
        ),
        options_json=as_text(opts) if opts is not None else EMPTY_OPTIONS,
        tries=int(tries or 1) if strict else _lenient_int(tries or 1),
        capped=get(F_CAPPED) is not None,
        leading=get(F_LEADING) is not None,
        trailing=get(F_TRAILING) is not None,
        collected_bytes=_lenient_int(cb) if (cb := get(F_COLLECT_BYTES)) is not None else None,
        collect_list=as_text(cl) if (cl := get(F_COLLECT_LIST)) is not None else None,
    )


# -- stored options ----------------------------------------------------------------------


def encode_options(stored: dict[str, Any]) -> str:
    """Stored options as JSON (kombu's encoder, as the Redis transport uses).
    Raises TypeError/ValueError for a value JSON cannot hold."""
    return EMPTY_OPTIONS if not stored else str(kombu_json.dumps(stored))


def decode_options(text: str) -> dict[str, Any]:
    """The stored options of a record; ValueError when they are not a JSON object."""
    opts = kombu_json.loads(text) if text != EMPTY_OPTIONS else {}
    if not isinstance(opts, dict):
        raise ValueError("options are not a JSON object")
    return opts


def new_task_id() -> str:
    """A random (version 4) UUID as text, like ``str(uuid.uuid4())`` at a third of the cost."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
