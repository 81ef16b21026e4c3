"""Settings read from ``app.conf``; every name starts with ``debounce_``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from celery import Celery

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
}


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

    @classmethod
    def from_app(cls, app: Celery) -> Settings:
        conf = app.conf

        def get(name: str) -> Any:
            value = conf.get(name)
            return DEFAULTS[name] if value is None else value

        def duration(name: str) -> int:
            return parse_duration(name, get(name))

        return cls(
            redis_url=_redis_url(app, get("debounce_redis_url")),
            key_prefix=_prefix(get("debounce_key_prefix")),
            shards=_positive_int("debounce_shards", get("debounce_shards")),
            dispatcher=bool(get("debounce_dispatcher")),
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

    def tag(self, shard: int) -> str:
        """The hash-tagged prefix every key of ``shard`` starts with."""
        return f"{self.key_prefix}:{{{shard}}}"

    @cached_property
    def tags(self) -> tuple[str, ...]:
        """:meth:`tag` of every shard, built once."""
        return tuple(self.tag(shard) for shard in range(self.shards))

    @property
    def wake_channel(self) -> str:
        return f"{self.key_prefix}:wake"


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
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DebounceConfigError(f"{option}={value!r}: expected a positive int")
    return value
