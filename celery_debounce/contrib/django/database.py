"""The PostgreSQL store on the database Django already uses: ``database_url`` turns one
entry of ``DATABASES`` into the store's URL, in ``settings.py`` (no Django set-up needed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from ...errors import DebounceConfigError

__all__ = ["database_url"]

#: Django's PostgreSQL backends (PostGIS is PostgreSQL underneath).
POSTGRES_ENGINES = (
    "django.db.backends.postgresql",
    "django.contrib.gis.db.backends.postgis",
)

#: ``OPTIONS`` that are libpq's connection parameters, passed on in the URL; Django's own
#: (``isolation_level``, ``pool``, ``server_side_binding``, ...) are not the store's.
LIBPQ_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "connect_timeout",
    "application_name",
    "options",
    "target_session_attrs",
    "passfile",
    "service",
)


def database_url(database: Mapping[str, Any]) -> str:
    """The ``postgresql://`` URL of one ``DATABASES`` entry (its ``NAME``, ``USER``,
    ``PASSWORD``, ``HOST``, ``PORT`` and libpq ``OPTIONS``), for
    ``CELERY_DEBOUNCE_STORE_URL``; refuses an entry of another engine by name."""
    engine = str(database.get("ENGINE") or "")
    if engine not in POSTGRES_ENGINES:
        raise DebounceConfigError(
            f"database_url: ENGINE {engine!r} is not PostgreSQL "
            f"({' or '.join(POSTGRES_ENGINES)}): the store needs a PostgreSQL database"
        )
    if not database.get("NAME"):
        raise DebounceConfigError("database_url: the database entry has no NAME")
    user = quote(str(database.get("USER") or ""), safe="")
    password = quote(str(database.get("PASSWORD") or ""), safe="")
    login = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(database.get("HOST") or "localhost")
    options: dict[str, Any] = {}
    if host.startswith("/"):  # a Unix socket's directory: libpq's host parameter
        options["host"], host = host, ""
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    port = f":{database['PORT']}" if database.get("PORT") else ""
    given = database.get("OPTIONS") or {}
    options.update({k: given[k] for k in LIBPQ_OPTIONS if given.get(k) is not None})
    query = f"?{urlencode(options)}" if options else ""
    name = quote(str(database["NAME"]), safe="")
    return f"postgresql://{login}{host}{port}/{name}{query}"
