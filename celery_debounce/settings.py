"""Settings read from ``app.conf``; every name starts with ``debounce_``."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from celery import Celery
from redis.crc import key_slot

from .durations import parse_duration
from .errors import DebounceConfigError

#: Every setting with its default. The configuration reference is checked against this.
DEFAULTS: dict[str, Any] = {
    "debounce_redis_url": None,
    "debounce_key_prefix": "debounce",
    "debounce_shards": 1,
    "debounce_dispatcher": True,
    "debounce_poll_interval": 1.0,
    "debounce_dispatch_batch": 500,
    "debounce_dispatch_lease": 30.0,
    "debounce_history_ttl": 3600,
    "debounce_record_ttl": 7 * 86400,
    "debounce_redis_timeout": 2.0,
    "debounce_max_key_length": 1024,
    "debounce_max_payload_bytes": 1024 * 1024,
    "debounce_redis_cluster": False,
    "debounce_redis_wait_replicas": 0,
}


#: debounce_record_ttl must be at least this many dispatch leases (see Settings.check).
RECORD_TTL_LEASES = 4

#: Strings accepted for a boolean setting (as environment-driven settings give them).
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def parse_bool(option: str, value: object) -> bool:
    """A boolean setting: a bool, 0/1, or one of true/false/1/0/yes/no/on/off (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise DebounceConfigError(
        f"{option}={value!r}: expected True or False (or one of the strings "
        "true/false, 1/0, yes/no, on/off)"
    )


@dataclass(frozen=True)
class Settings:
    redis_url: str
    key_prefix: str
    shards: int
    dispatcher: bool
    poll_interval_ms: int
    dispatch_batch: int
    dispatch_lease_ms: int
    history_ttl_ms: int
    record_ttl_ms: int
    redis_timeout_s: float
    max_key_length: int
    max_payload_bytes: int
    redis_cluster: bool = False
    #: replicas that must acknowledge a gate call (Redis WAIT) before it returns; 0: off
    wait_replicas: int = 0

    @classmethod
    def from_app(cls, app: Celery) -> Settings:
        conf = app.conf

        def get(name: str) -> Any:
            value = conf.get(name)
            return DEFAULTS[name] if value is None else value

        def duration(name: str) -> int:
            return parse_duration(name, get(name))

        settings = cls(
            redis_url=_redis_url(app, get("debounce_redis_url")),
            key_prefix=_prefix(get("debounce_key_prefix")),
            shards=_positive_int("debounce_shards", get("debounce_shards")),
            dispatcher=parse_bool("debounce_dispatcher", get("debounce_dispatcher")),
            poll_interval_ms=duration("debounce_poll_interval"),
            dispatch_batch=_positive_int("debounce_dispatch_batch", get("debounce_dispatch_batch")),
            dispatch_lease_ms=duration("debounce_dispatch_lease"),
            history_ttl_ms=duration("debounce_history_ttl"),
            record_ttl_ms=duration("debounce_record_ttl"),
            redis_timeout_s=duration("debounce_redis_timeout") / 1000,
            max_key_length=_positive_int("debounce_max_key_length", get("debounce_max_key_length")),
            max_payload_bytes=_positive_int(
                "debounce_max_payload_bytes", get("debounce_max_payload_bytes")
            ),
            redis_cluster=parse_bool("debounce_redis_cluster", get("debounce_redis_cluster")),
            wait_replicas=_non_negative_int(
                "debounce_redis_wait_replicas", get("debounce_redis_wait_replicas")
            ),
        )
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse settings that contradict each other (each one alone is valid)."""
        if self.redis_cluster and not self.redis_url.startswith(("redis://", "rediss://")):
            raise DebounceConfigError(
                f"debounce_redis_cluster=True needs a redis:// or rediss:// URL naming any "
                f"cluster node, got debounce_redis_url={self.redis_url!r}"
            )
        floor = RECORD_TTL_LEASES * self.dispatch_lease_ms
        if self.record_ttl_ms < floor:
            raise DebounceConfigError(
                f"debounce_record_ttl={self.record_ttl_ms / 1000:g}s is too short for "
                f"debounce_dispatch_lease={self.dispatch_lease_ms / 1000:g}s: a taken window's "
                f"record must outlive {RECORD_TTL_LEASES} leases (a publish retried after lease "
                f"expiries), so set debounce_record_ttl to at least {floor / 1000:g}s or "
                "shorten the lease"
            )

    def tag(self, shard: int) -> str:
        """The hash-tagged prefix every key of ``shard`` starts with.

        ``{<shard>}`` on a single node; on a cluster the tag of
        :func:`cluster_shard_tag`, so shard ``i`` of ``N`` lands in the ``i``-th
        ``N``-th of the slot range (and so on its own master when ``N`` is a
        multiple of the masters).
        """
        if self.redis_cluster:
            if shard >= self.shards:  # see legacy_shards
                return f"{self.key_prefix}:{{{shard - self.shards}}}"
            return f"{self.key_prefix}:{{{cluster_shard_tag(shard, self.shards)}}}"
        return f"{self.key_prefix}:{{{shard}}}"

    @cached_property
    def legacy_shards(self) -> tuple[int, ...]:
        """On a cluster, the shards of the single-node layout (``{<i>}``) whose tag
        differs from the cluster tag, numbered ``shards + i``: windows a release
        before cluster support wrote there are drained by the dispatchers (taken and
        published as usual; their runs find their records by this number), never
        written again. Empty on a single node and with one shard (same tag)."""
        if not self.redis_cluster:
            return ()
        return tuple(self.shards + i for i in range(self.shards)
                     if cluster_shard_tag(i, self.shards) != str(i))

    @cached_property
    def tags(self) -> tuple[str, ...]:
        """:meth:`tag` of every shard, built once."""
        return tuple(self.tag(shard) for shard in range(self.shards))

    @property
    def wake_channel(self) -> str:
        return f"{self.key_prefix}:wake"

    @property
    def wait_replicas_ms(self) -> int:
        """WAIT's timeout: half of ``debounce_redis_timeout``, so the reply arrives before
        the socket timeout (the rest is for the script and the network)."""
        return max(1, int(self.redis_timeout_s * 500))

    def shard_wake_channel(self, shard: int) -> str:
        """The sharded pub/sub channel of ``shard`` (cluster): in the shard's slot."""
        return f"{self.tag(shard)}:wake"


def settings_for(app: Celery) -> Settings:
    """The app's settings, read once and cached on the app."""
    cached: Settings | None = getattr(app, "_debounce_settings", None)
    if cached is None:
        cached = Settings.from_app(app)
        app._debounce_settings = cached  # type: ignore[attr-defined, unused-ignore]
    return cached


def _redis_url(app: Celery, value: object) -> str:
    if value:
        if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
            raise DebounceConfigError(
                f"debounce_redis_url={value!r}: expected a redis://, rediss:// or unix:// URL"
            )
        return value
    broker = app.conf.broker_url
    if isinstance(broker, str) and broker.startswith(("redis://", "rediss://")):
        return broker
    raise DebounceConfigError(
        f"debounce_redis_url is not set and the broker URL ({broker!r}) is not a Redis URL: "
        "set app.conf.debounce_redis_url = 'redis://host:6379/0'"
    )


def _prefix(value: object) -> str:
    if not isinstance(value, str) or not value or any(c in value for c in "{}"):
        raise DebounceConfigError(
            f"debounce_key_prefix={value!r}: expected a non-empty str without braces"
        )
    return value


#: Redis Cluster's hash slots (CRC16 of the hash tag, modulo this).
CLUSTER_SLOTS = 16384


@lru_cache(maxsize=256)
def cluster_shard_tag(shard: int, shards: int) -> str:
    """The hash tag (without braces) of ``shard`` of ``shards`` on a Redis Cluster.

    Its slot falls in ``[shard * 16384 // shards, (shard + 1) * 16384 // shards)``:
    ``redis-cli --cluster create`` gives each master one contiguous range, so
    with ``shards`` a multiple of the masters the shards spread evenly. The tag
    is ``<shard>`` itself when its slot already falls there (always for one
    shard: ``{0}``, the single-node tag), else ``<shard>.<k>`` for the smallest
    ``k`` that does. Deterministic: every process computes the same tags.
    """
    low = shard * CLUSTER_SLOTS // shards
    high = (shard + 1) * CLUSTER_SLOTS // shards
    if low <= key_slot(str(shard).encode()) < high:
        return str(shard)
    for k in itertools.count():
        candidate = f"{shard}.{k}"
        if low <= key_slot(candidate.encode()) < high:
            return candidate
    raise AssertionError("unreachable")  # pragma: no cover


def _non_negative_int(option: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DebounceConfigError(f"{option}={value!r}: expected an int >= 0")
    return value


def _positive_int(option: str, value: object) -> int:
    if isinstance(value, str):  # e.g. from os.environ: refused, never guessed
        raise DebounceConfigError(
            f"{option}={value!r}: expected a positive int, got a str (convert it, e.g. "
            f"int(os.environ[...]))"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DebounceConfigError(f"{option}={value!r}: expected a positive int")
    return value
