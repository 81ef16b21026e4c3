"""Settings read from ``app.conf``; every name starts with ``debounce_``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from celery import Celery

from .durations import parse_duration
from .errors import DebounceConfigError
from .layout import shard_tag, shard_tags, wake_channel

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
    poll_interval_ms: int
    dispatch_batch: int
    dispatch_lease_ms: int
    history_ttl_ms: int
    record_ttl_ms: int
    redis_timeout_s: float
    max_key_length: int
    max_payload_bytes: int

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
        )
        # read by the worker bootstep (bootstep.py) only; refused here too, early
        parse_bool("debounce_dispatcher", get("debounce_dispatcher"))
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse settings that contradict each other (each one alone is valid)."""
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
        """The hash-tagged prefix every key of ``shard`` starts with."""
        return shard_tag(self.key_prefix, shard)

    @cached_property
    def tags(self) -> tuple[str, ...]:
        """:meth:`tag` of every shard, built once."""
        return shard_tags(self.key_prefix, self.shards)

    @property
    def wake_channel(self) -> str:
        return wake_channel(self.key_prefix)


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


def _positive_int(option: str, value: object) -> int:
    if isinstance(value, str):  # e.g. from os.environ: refused, never guessed
        raise DebounceConfigError(
            f"{option}={value!r}: expected a positive int, got a str (convert it, e.g. "
            f"int(os.environ[...]))"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DebounceConfigError(f"{option}={value!r}: expected a positive int")
    return value
