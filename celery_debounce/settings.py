"""Settings read from ``app.conf``; every name starts with ``debounce_``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery

from .durations import parse_duration
from .errors import DebounceConfigError
from .redact import redact
from .sentinel_settings import (
    SentinelConfig,
    is_sentinel_url,
    refuse_without_sentinel,
    sentinel_config,
)
from .unknown_names import refuse_unknown_settings

__all__ = ["DEFAULTS", "Settings", "settings_for"]

#: Every setting with its default. The configuration reference is checked against this.
DEFAULTS: dict[str, Any] = {
    "debounce_redis_url": None,
    "debounce_store_url": None,
    "debounce_key_prefix": "debounce",
    "debounce_shards": 1,
    "debounce_dispatcher": True,
    "debounce_dispatcher_process": False,
    "debounce_poll_interval": 1.0,
    "debounce_dispatch_batch": 500,
    "debounce_dispatch_batch_bytes": 16 * 1024 * 1024,
    "debounce_dispatch_lease": 30.0,
    "debounce_claim_lease": 60.0,
    "debounce_history_ttl": 3600,
    "debounce_record_ttl": 7 * 86400,
    "debounce_redis_timeout": 2.0,
    "debounce_postgres_timeout": 5.0,
    "debounce_postgres_schema": None,
    "debounce_postgres_listen_url": None,
    "debounce_postgres_pool_size": 8,
    "debounce_max_key_length": 1024,
    "debounce_max_payload_bytes": 1024 * 1024,
    "debounce_redis_sentinel_master": None,
    "debounce_redis_transport_options": None,
    "debounce_redis_cluster": False,
    "debounce_redis_wait_replicas": 0,
    "debounce_on_outage": "raise",
    "debounce_outage_probe_interval": 1.0,
}


#: debounce_record_ttl must be at least this many dispatch leases (see Settings.check).
RECORD_TTL_LEASES = 4

#: Shortest debounce_claim_lease (ms): claims are renewed every third of it.
MIN_CLAIM_LEASE_MS = 1000

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


#: The values of ``debounce_on_outage`` (outage.py): what a call does when the windows'
#: Redis cannot take it.
OUTAGE_POLICIES = ("raise", "publish")


def check_on_outage(
    value: Any, name: str = "debounce_on_outage", allow_none: bool = True
) -> str | None:
    """``debounce_on_outage``: ``"raise"`` or ``"publish"`` (None: the setting's)."""
    if value is None and allow_none:
        return None
    if not isinstance(value, str) or value not in OUTAGE_POLICIES:
        raise DebounceConfigError(
            f"{name}={value!r}: expected one of {', '.join(map(repr, OUTAGE_POLICIES))} "
            "(what a call does when the windows' Redis cannot take it)"
        )
    return value


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
    #: Set when ``redis_url`` is a ``sentinel://`` URL (see sentinel_settings.py).
    sentinel: SentinelConfig | None = None
    redis_cluster: bool = False
    #: replicas that must acknowledge a gate call (Redis WAIT) before it returns; 0: off
    wait_replicas: int = 0
    #: how long a worker's claim on a window's run lasts unless renewed (worker/receivers.py)
    claim_lease_ms: int = 60_000
    #: Celery's ``result_expires`` in ms (None: results never expire). A leading-only
    #: quiet period never outlasts it: its suppressed calls hold the leading run's id
    #: (gate.gate_args)
    result_expires_ms: int | None = None
    #: what a call does when the windows' Redis cannot take it (outage.py)
    on_outage: str = "raise"
    #: how long calls skip Redis after one timed out, before one call probes it again
    outage_probe_interval_ms: int = 1000
    #: ``debounce_store_url`` when it selects the PostgreSQL store (``postgresql://``
    #: or ``postgres://``); None: the Redis store at ``redis_url``
    postgres_url: str | None = None
    #: the PostgreSQL store's call timeout: the wait for a pooled connection and each
    #: connection's ``statement_timeout`` (at most)
    postgres_timeout_s: float = 5.0
    #: the PostgreSQL schema of this deployment's tables: ``debounce_postgres_schema``, or
    #: a ``debounce_key_prefix`` other than the default; None: the URL's ``search_path``
    postgres_schema: str | None = None
    #: where a PostgreSQL dispatcher LISTENs for wake-ups: ``debounce_postgres_listen_url``
    #: (None: ``postgres_url``; ``""``: nowhere, the dispatcher polls)
    postgres_listen_url: str | None = None
    #: the most connections a process's PostgreSQL store pool opens
    postgres_pool_size: int = 8
    #: the most bytes of bodies one take leases (the first window whatever its size)
    dispatch_batch_bytes: int = DEFAULTS["debounce_dispatch_batch_bytes"]

    @classmethod
    def from_app(cls, app: Celery, *, redis_url: str | None = None) -> Settings:
        """``redis_url``: use this URL instead of the app's (eager mode's checks).

        An error names each setting as the app is configured: under a namespace
        (Django's ``namespace="CELERY"``) ``CELERY_DEBOUNCE_REDIS_URL``."""
        try:
            return cls._from_app(app, redis_url=redis_url)
        except DebounceConfigError as exc:
            if app.namespace:
                exc.args = (spell_settings(str(exc), app.namespace), *exc.args[1:])
            raise

    @classmethod
    def _from_app(cls, app: Celery, *, redis_url: str | None = None) -> Settings:
        conf = app.conf
        refuse_unknown_settings(conf, app.namespace, DEFAULTS)

        def get(name: str) -> Any:
            value = conf.get(name)
            return DEFAULTS[name] if value is None else value

        def duration(name: str) -> int:
            return parse_duration(name, get(name))

        postgres_url = None
        chosen_here = not redis_url  # else an override (eager mode): the app's store aside
        if not redis_url:
            redis_url, postgres_url = _store_urls(
                app, get("debounce_redis_url"), get("debounce_store_url")
            )
        if not is_sentinel_url(redis_url):
            refuse_without_sentinel(conf, redis_url)
        settings = cls(
            redis_url=redis_url,
            key_prefix=_prefix(get("debounce_key_prefix")),
            shards=_positive_int("debounce_shards", get("debounce_shards")),
            poll_interval_ms=duration("debounce_poll_interval"),
            dispatch_batch=_positive_int("debounce_dispatch_batch", get("debounce_dispatch_batch")),
            dispatch_batch_bytes=_positive_int(
                "debounce_dispatch_batch_bytes", get("debounce_dispatch_batch_bytes")
            ),
            dispatch_lease_ms=duration("debounce_dispatch_lease"),
            history_ttl_ms=duration("debounce_history_ttl"),
            record_ttl_ms=duration("debounce_record_ttl"),
            redis_timeout_s=duration("debounce_redis_timeout") / 1000,
            max_key_length=_positive_int("debounce_max_key_length", get("debounce_max_key_length")),
            max_payload_bytes=_positive_int(
                "debounce_max_payload_bytes", get("debounce_max_payload_bytes")
            ),
            sentinel=sentinel_config(
                conf,
                redis_url,
                from_broker=not (get("debounce_redis_url") or get("debounce_store_url")),
            )
            if is_sentinel_url(redis_url)
            else None,
            redis_cluster=parse_bool("debounce_redis_cluster", get("debounce_redis_cluster")),
            wait_replicas=_non_negative_int(
                "debounce_redis_wait_replicas", get("debounce_redis_wait_replicas")
            ),
            claim_lease_ms=duration("debounce_claim_lease"),
            result_expires_ms=_result_expires_ms(conf.get("result_expires")),
            on_outage=str(check_on_outage(get("debounce_on_outage"), allow_none=False)),
            outage_probe_interval_ms=duration("debounce_outage_probe_interval"),
            postgres_url=postgres_url,
            postgres_timeout_s=duration("debounce_postgres_timeout") / 1000,
            postgres_schema=_postgres_schema(
                conf.get("debounce_postgres_schema"), get("debounce_key_prefix")
            ),
            postgres_listen_url=_listen_url(conf.get("debounce_postgres_listen_url")),
            postgres_pool_size=_positive_int(
                "debounce_postgres_pool_size", get("debounce_postgres_pool_size")
            ),
        )
        if chosen_here and postgres_url is None:
            for name, remedy in (
                ("debounce_postgres_timeout", "remove it, or set debounce_redis_timeout"),
                ("debounce_postgres_schema", "remove it (debounce_key_prefix scopes Redis)"),
                ("debounce_postgres_listen_url", "remove it"),
                ("debounce_postgres_pool_size", "remove it"),
            ):
                if conf.get(name) is not None:
                    raise DebounceConfigError(
                        f"{name} is a setting of the PostgreSQL store, but the windows are "
                        f"in Redis (debounce_store_url is not a postgresql:// URL): {remedy}"
                    )
        # read by the worker bootstep (bootstep.py) only; refused here too, early
        parse_bool("debounce_dispatcher", get("debounce_dispatcher"))
        parse_bool("debounce_dispatcher_process", get("debounce_dispatcher_process"))
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse settings that contradict each other (each one alone is valid)."""
        if self.postgres_url is not None:
            for name, used in (
                ("debounce_shards", self.shards != 1),
                ("debounce_redis_cluster", self.redis_cluster),
                ("debounce_redis_wait_replicas", self.wait_replicas),
            ):
                if used:
                    raise DebounceConfigError(
                        f"{name} is a setting of the Redis store, but debounce_store_url "
                        f"selects the PostgreSQL store ({redact(self.postgres_url)!r}): "
                        f"remove {name}"
                    )
        if self.redis_cluster and not self.redis_url.startswith(("redis://", "rediss://")):
            raise DebounceConfigError(
                redact(
                    f"debounce_redis_cluster=True needs a redis:// or rediss:// URL naming any "
                    f"cluster node, got debounce_redis_url={self.redis_url!r}"
                )
            )
        if self.claim_lease_ms < MIN_CLAIM_LEASE_MS:
            raise DebounceConfigError(
                f"debounce_claim_lease={self.claim_lease_ms / 1000:g}s is too short: a worker "
                f"renews its claims every third of the lease, so it must be at least "
                f"{MIN_CLAIM_LEASE_MS / 1000:g}s"
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

    @property
    def wait_replicas_ms(self) -> int:
        """WAIT's timeout: half of ``debounce_redis_timeout``, so the reply arrives before
        the socket timeout (the rest is for the script and the network)."""
        return max(1, int(self.redis_timeout_s * 500))


_SETTING = re.compile(r"(?:\bapp\.conf\.)?\b(debounce_[a-z_]+)\b")


def spell_settings(message: str, namespace: str) -> str:
    """``message`` with each setting named as a namespaced config module spells it:
    ``app.conf.debounce_redis_url`` and ``debounce_shards`` become
    ``CELERY_DEBOUNCE_REDIS_URL`` and ``CELERY_DEBOUNCE_SHARDS`` for ``"CELERY"``."""

    def spell(match: re.Match[str]) -> str:
        name = match.group(1)
        return f"{namespace.upper()}_{name.upper()}" if name in DEFAULTS else match.group(0)

    return _SETTING.sub(spell, message)


def settings_for(app: Celery) -> Settings:
    """The app's settings, read once and cached on the app."""
    cached: Settings | None = getattr(app, "_debounce_settings", None)
    if cached is None:
        cached = Settings.from_app(app)
        app._debounce_settings = cached  # type: ignore[attr-defined, unused-ignore]
    return cached


_SCHEMES = ("redis://", "rediss://", "unix://", "sentinel://")
#: The schemes of ``debounce_store_url`` that select the PostgreSQL store.
POSTGRES_SCHEMES = ("postgresql://", "postgres://")
#: What stands for the Redis URL when the PostgreSQL store is selected (never connected).
NO_REDIS_URL = "redis://no-redis.invalid:6379/0"


def _store_urls(app: Celery, redis_value: object, store_value: object) -> tuple[str, str | None]:
    """``(Redis URL, PostgreSQL URL or None)`` from ``debounce_redis_url`` and
    ``debounce_store_url`` (or the broker's URL when neither is set)."""
    if not store_value:
        return _redis_url(app, redis_value), None
    if not isinstance(store_value, str) or not store_value.startswith(
        (*POSTGRES_SCHEMES, *_SCHEMES)
    ):
        raise DebounceConfigError(
            redact(
                f"debounce_store_url={store_value!r}: expected a postgresql:// (or postgres://) "
                "URL for the PostgreSQL store, or a redis://, rediss://, unix:// or "
                "sentinel:// URL for the Redis store"
            )
        )
    if redis_value and redis_value != store_value:
        raise DebounceConfigError(
            redact(
                f"debounce_store_url={store_value!r} and debounce_redis_url={redis_value!r} "
                "name different stores: set only debounce_store_url"
            )
        )
    if store_value.startswith(POSTGRES_SCHEMES):
        return NO_REDIS_URL, store_value
    return _redis_url(app, store_value), None


def _redis_url(app: Celery, value: object) -> str:
    if value:
        if not isinstance(value, str) or not value.startswith(_SCHEMES):
            raise DebounceConfigError(
                redact(
                    f"debounce_redis_url={value!r}: expected a redis://, rediss://, unix:// or "
                    "sentinel:// URL"
                )
            )
        return value
    broker = app.conf.broker_url
    if isinstance(broker, str) and broker.startswith(("redis://", "rediss://", "sentinel://")):
        return broker
    raise DebounceConfigError(
        redact(
            f"debounce_redis_url is not set and the broker URL ({broker!r}) is not a Redis URL: "
            "set app.conf.debounce_redis_url = 'redis://host:6379/0' (the windows in "
            "Redis), or app.conf.debounce_store_url = 'postgresql://host/db' (in "
            "PostgreSQL)"
        )
    )


def _result_expires_ms(value: object) -> int | None:
    """Celery's ``result_expires`` (a timedelta or seconds; None or 0: never) in ms."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None  # unset, never, or not a number (Celery's own check reports it)
    return max(1, int(value * 1000))


#: PostgreSQL's longest identifier (bytes).
_MAX_IDENTIFIER = 63


def _postgres_schema(value: object, prefix: object) -> str | None:
    """``debounce_postgres_schema``; unset, a prefix other than the default names the
    schema (two deployments on one database keep apart, as on Redis); else None."""
    name, given = ("debounce_postgres_schema", value)
    if value is None:
        if prefix is None or prefix == DEFAULTS["debounce_key_prefix"]:
            return None
        name, given = ("debounce_key_prefix", prefix)
    if (
        not isinstance(given, str)
        or not given
        or "\x00" in given
        or len(given.encode("utf-8")) > _MAX_IDENTIFIER
    ):
        extra = (
            " (on PostgreSQL the prefix names the schema of the windows: set "
            "debounce_postgres_schema to a shorter name)"
            if name == "debounce_key_prefix"
            else ""
        )
        raise DebounceConfigError(
            f"{name}={given!r}: expected a PostgreSQL schema name, a non-empty str of at "
            f"most {_MAX_IDENTIFIER} bytes without NUL{extra}"
        )
    return given


def _listen_url(value: object) -> str | None:
    """``debounce_postgres_listen_url``: None (the store's URL), "" (poll) or a URL."""
    if value is None or value == "":
        return value
    if not isinstance(value, str) or not value.startswith(POSTGRES_SCHEMES):
        raise DebounceConfigError(
            redact(
                f"debounce_postgres_listen_url={value!r}: expected a postgresql:// URL of a "
                "direct connection (not through a pooler in transaction mode), or '' to poll"
            )
        )
    return value


def _prefix(value: object) -> str:
    if not isinstance(value, str) or not value or any(c in value for c in "{}"):
        raise DebounceConfigError(
            f"debounce_key_prefix={value!r}: expected a non-empty str without braces"
        )
    return value


#: An integer setting given as a string: ASCII digits only, surrounding blanks ignored
#: ("1_000", "4.0", "1e3", "0x10", Arabic-Indic or full-width digits are refused).
_DIGITS = re.compile(r"[0-9]+")


def _int_setting(option: str, value: object, minimum: int) -> int:
    """An integer setting >= ``minimum``: an int, or a string of its ASCII digits (as an
    environment-driven settings module gives it: ``os.environ.get(...)``)."""
    what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    if isinstance(value, str):
        text = value.strip()
        if not _DIGITS.fullmatch(text):
            raise DebounceConfigError(
                f"{option}={value!r}: expected {what} (a string must be its ASCII digits, e.g. '4')"
            )
        number = int(text)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise DebounceConfigError(f"{option}={value!r}: expected {what}")
    else:
        number = value
    if number < minimum:
        raise DebounceConfigError(f"{option}={value!r}: expected {what}")
    return number


def _non_negative_int(option: str, value: object) -> int:
    return _int_setting(option, value, 0)


def _positive_int(option: str, value: object) -> int:
    return _int_setting(option, value, 1)
