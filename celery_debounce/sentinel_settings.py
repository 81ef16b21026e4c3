"""Redis Sentinel: the ``sentinel://`` form of ``debounce_redis_url``, as Celery reads it.

The URL is the one Celery's Redis broker (kombu's ``SentinelChannel``) and result
backend (``SentinelBackend``) take: sentinels separated by ``;``, each
``sentinel://[[user]:password@]host:port[/db]``. As there, the first sentinel's
user, password and database are those of the *master* (the sentinels themselves
are reached without a password unless ``sentinel_kwargs`` gives one), and the
master's name is a transport option, ``master_name``.

Where the name comes from, first found wins:

1. ``debounce_redis_sentinel_master``;
2. ``debounce_redis_transport_options["master_name"]``;
3. ``broker_transport_options["master_name"]``, only when ``debounce_redis_url`` is
   unset and the broker URL (a ``sentinel://`` URL) is used for the windows too.

Options 1 and 2 naming different masters is an error. ``sentinel_kwargs`` and
``min_other_sentinels`` are read from the same transport options as the name.

This module only reads the settings; the client (redis-py's ``Sentinel``) and the
``+switch-master`` watcher live in :mod:`celery_debounce.store`, the one module
that imports redis-py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import DebounceConfigError
from .redact import redact

SCHEME = "sentinel://"
#: Port of a sentinel URL without one (Redis Sentinel's default).
DEFAULT_PORT = 26379
#: The transport options read here (Celery's own names); others are refused in
#: ``debounce_redis_transport_options`` and ignored in ``broker_transport_options``.
TRANSPORT_OPTIONS = ("master_name", "sentinel_kwargs", "min_other_sentinels")


@dataclass(frozen=True)
class SentinelConfig:
    """Where the windows' master is found: parsed once, with the settings."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    #: Connection arguments for the sentinels, over the defaults (the master's
    #: timeouts, no retry: see ``store.sentinel_client``).
    sentinel_kwargs: tuple[tuple[str, Any], ...] | None = None
    min_other_sentinels: int = 0


def is_sentinel_url(url: object) -> bool:
    return isinstance(url, str) and url.startswith(SCHEME)


def parse_sentinel_url(
    option: str, url: str
) -> tuple[tuple[tuple[str, int], ...], int, str | None, str | None]:
    """``(sentinels, db, username, password)`` of a ``sentinel://...;sentinel://...`` URL."""
    hosts: list[tuple[str, int]] = []
    shown = redact(url)
    db, username, password = 0, None, None
    for index, chunk in enumerate(part for part in url.split(";") if part.strip()):
        chunk = chunk.strip()
        if not chunk.startswith(SCHEME):
            raise DebounceConfigError(  # not the part: a password with ';' is cut there
                f"{option}={shown!r}: every ';'-separated part must be a sentinel:// URL, "
                f"part {index + 1} is not (a password holding ';' must be percent-encoded: "
                "%3B)"
            )
        if "?" in chunk:
            raise DebounceConfigError(
                f"{option}={shown!r}: query parameters are not read in a sentinel:// URL "
                "(TLS to Sentinel is not supported; see docs/deployment.md)"
            )
        parts = urlsplit(chunk)
        # A part is named by its number, never shown, and urllib's error is not chained:
        # a password holding ';' or '/' unencoded is cut there, and would show in either.
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise DebounceConfigError(
                f"{option}={shown!r}: bad port in part {index + 1} (a password holding ';', "
                "'/' or '@' must be percent-encoded)"
            ) from None
        if not parts.hostname:
            raise DebounceConfigError(f"{option}={shown!r}: no host in part {index + 1}")
        hosts.append((parts.hostname, port))
        if index == 0:  # Celery's rule: the first URL carries the master's credentials
            path = parts.path.strip("/")
            if path:
                if not path.isdigit():  # the path is not shown: it may hold a password
                    raise DebounceConfigError(
                        f"{option}={shown!r}: the database must be a number (a password "
                        "holding '/' must be percent-encoded: %2F)"
                    )
                db = int(path)
            username = unquote(parts.username) if parts.username else None
            password = unquote(parts.password) if parts.password else None
    if not hosts:
        raise DebounceConfigError(f"{option}={shown!r}: no sentinel in the URL")
    return tuple(hosts), db, username, password


def sentinel_config(conf: Mapping[str, Any], url: str, *, from_broker: bool) -> SentinelConfig:
    """The sentinel settings of an app whose windows' URL ``url`` is a sentinel URL.

    ``from_broker``: ``url`` is the broker's (``debounce_redis_url`` unset), so the
    broker's transport options are read too.
    """
    option = "broker_url" if from_broker else "debounce_redis_url"
    shown = redact(url)
    sentinels, db, username, password = parse_sentinel_url(option, url)
    own = _transport_options(conf.get("debounce_redis_transport_options"))
    master = conf.get("debounce_redis_sentinel_master")
    source = own
    if master is not None:
        if not isinstance(master, str) or not master:
            raise DebounceConfigError(
                f"debounce_redis_sentinel_master={master!r}: expected the master's name, "
                "a non-empty str"
            )
        other = own.get("master_name")
        if other is not None and other != master:
            raise DebounceConfigError(
                f"debounce_redis_sentinel_master={master!r} and "
                f"debounce_redis_transport_options['master_name']={other!r} differ: set one"
            )
    elif own.get("master_name") is not None:
        master = own["master_name"]
    elif from_broker:
        broker = conf.get("broker_transport_options") or {}
        if isinstance(broker, Mapping):
            source = {k: v for k, v in broker.items() if k in TRANSPORT_OPTIONS}
            master = source.get("master_name")
    if not isinstance(master, str) or not master:
        raise DebounceConfigError(
            f"{option}={shown!r} is a Sentinel URL but no master name is set: set "
            "app.conf.debounce_redis_sentinel_master = 'mymaster' (or "
            "debounce_redis_transport_options={'master_name': 'mymaster'}"
            + (", or broker_transport_options['master_name']" if from_broker else "")
            + ")"
        )
    kwargs = source.get("sentinel_kwargs")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise DebounceConfigError(  # the value may hold a password: not shown
            f"sentinel_kwargs: expected a dict of connection arguments for the sentinels, "
            f"got a {type(kwargs).__name__}"
        )
    others = source.get("min_other_sentinels", 0)
    if isinstance(others, bool) or not isinstance(others, int) or others < 0:
        raise DebounceConfigError(f"min_other_sentinels={others!r}: expected an int >= 0")
    return SentinelConfig(
        sentinels=sentinels,
        master_name=master,
        db=db,
        username=username,
        password=password,
        sentinel_kwargs=None if kwargs is None else tuple(sorted(kwargs.items())),
        min_other_sentinels=others,
    )


def _transport_options(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DebounceConfigError(
            f"debounce_redis_transport_options: expected a dict, got a {type(value).__name__}"
        )
    unknown = sorted(str(k) for k in value if k not in TRANSPORT_OPTIONS)
    if unknown:  # the values may hold a password (sentinel_kwargs): keys only
        raise DebounceConfigError(
            f"debounce_redis_transport_options: unknown option(s) {', '.join(unknown)} "
            f"(known: {', '.join(TRANSPORT_OPTIONS)})"
        )
    return dict(value)


def refuse_without_sentinel(conf: Mapping[str, Any], url: str) -> None:
    """The Sentinel settings are set but the windows' URL is not a Sentinel URL:
    a half-changed configuration, refused rather than ignored."""
    for name in ("debounce_redis_sentinel_master", "debounce_redis_transport_options"):
        if conf.get(name):  # None or {}: not set
            raise DebounceConfigError(
                f"{name} is set but the windows' URL {redact(url)!r} is not a sentinel:// "
                f"URL: set debounce_redis_url to the sentinels, or remove {name}"
            )
