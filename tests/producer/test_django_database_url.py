"""``celery_debounce.contrib.django.database_url``: the PostgreSQL store's URL from an
entry of Django's ``DATABASES``, read back by libpq exactly as Django's entry says."""

from __future__ import annotations

import pytest

from celery_debounce.contrib.django.database import database_url
from celery_debounce.errors import DebounceConfigError

psycopg = pytest.importorskip("psycopg")


def parsed(url: str) -> dict[str, str]:
    return dict(psycopg.conninfo.conninfo_to_dict(url))


def test_every_part_of_the_entry_reaches_libpq_as_given() -> None:
    url = database_url(
        {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "shop db",
            "USER": "app@shop",
            "PASSWORD": "p@ss:w/rd%;",
            "HOST": "db.internal",
            "PORT": 6432,
            "OPTIONS": {"sslmode": "require", "isolation_level": 2, "pool": True},
        }
    )
    assert parsed(url) == {
        "dbname": "shop db",
        "user": "app@shop",
        "password": "p@ss:w/rd%;",
        "host": "db.internal",
        "port": "6432",
        "sslmode": "require",  # libpq's; Django's own OPTIONS are not passed on
    }


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("", "localhost"),
        ("/var/run/postgresql", "/var/run/postgresql"),
        ("/run/pg:main", "/run/pg:main"),  # a socket directory with a colon: not IPv6
        ("::1", "::1"),
    ],
)
def test_a_socket_directory_or_an_ipv6_host_is_the_host_libpq_reads(
    host: str, expected: str
) -> None:
    given = {"ENGINE": "django.contrib.gis.db.backends.postgis", "NAME": "app", "HOST": host}
    assert parsed(database_url(given))["host"] == expected


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        (
            {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"},
            "'django.db.backends.sqlite3'",
        ),
        ({"ENGINE": "django.db.backends.postgresql", "NAME": ""}, "no NAME"),
    ],
)
def test_an_entry_the_store_cannot_use_is_refused_by_name(
    entry: dict[str, str], named: str
) -> None:
    with pytest.raises(DebounceConfigError, match=named):
        database_url(entry)
