"""simple_query (the store's steps without a cursor) sends what psycopg's client-side
cursor sends, reads what it reads, and leaves to the cursor what it cannot quote."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from celery_debounce.store.postgres.simple_query import UNQUOTABLE, simple_query
from celery_debounce.testing.postgres import LocalPostgres

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -7,
    2**62,
    "",
    "plain",
    "it's",
    "back\\slash",
    "E'\\x00' -- ;",
    "ünïcødé ✓ 𝄞",
    "'; DROP TABLE t; --",
    b"",
    b"\x00\x01\xff'\\",
]


@pytest.fixture
def conn(postgres_server: LocalPostgres) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres_server.url(), autocommit=True, prepare_threshold=None) as c:
        yield c


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_value_comes_back_as_the_cursor_sends_and_reads_it(
    conn: psycopg.Connection[Any], value: Any
) -> None:
    sql = "SELECT %s, 'literal %%s stays', %s"
    expected = psycopg.ClientCursor(conn).execute(sql, (value, value)).fetchall()
    assert simple_query(conn, sql, (value, value)) == expected
    assert expected[0][1] == "literal %s stays"


def test_the_rows_of_the_last_statement_are_the_answer(conn: psycopg.Connection[Any]) -> None:
    rows = simple_query(
        conn,
        "SELECT set_config('application_name', %s, true); SELECT g FROM generate_series(1, %s) g",
        ("x", 3),
    )
    assert rows == [(1,), (2,), (3,)]
    # the setting was the implicit transaction's only
    assert conn.execute("SHOW application_name").fetchone() != ("x",)


@pytest.mark.parametrize(
    "params",
    [(["a", "b"],), ("nul\x00byte",), (1.5,), ({"a": 1},)],
    ids=["array", "nul", "float", "dict"],
)
def test_what_it_cannot_quote_is_left_to_the_cursor_and_nothing_is_sent(
    conn: psycopg.Connection[Any], params: tuple[Any, ...]
) -> None:
    conn.execute("CREATE TEMP TABLE sent (v text)")
    assert simple_query(conn, "INSERT INTO sent VALUES (%s::text)", params) is UNQUOTABLE
    assert conn.execute("SELECT count(*) FROM sent").fetchone() == (0,)


def test_named_placeholders_are_left_to_the_cursor(conn: psycopg.Connection[Any]) -> None:
    assert simple_query(conn, "SELECT %(a)s", ()) is UNQUOTABLE


def test_a_refused_statement_raises_the_cursors_error_with_its_sqlstate(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero) as caught:
        simple_query(conn, "SELECT 1 / %s", (0,))
    assert caught.value.sqlstate == "22012"
    assert simple_query(conn, "SELECT %s", (1,)) == [(1,)]  # the connection goes on


def test_a_closed_connection_is_an_operational_error(postgres_server: LocalPostgres) -> None:
    conn = psycopg.connect(postgres_server.url(), autocommit=True)
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        simple_query(conn, "SELECT %s", (1,))


def test_a_wrong_count_of_values_is_refused_before_anything_is_sent(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(TypeError, match="2 placeholders for 1 values"):
        simple_query(conn, "SELECT %s, %s", (1,))


@pytest.mark.parametrize(
    "setting", ["client_encoding TO 'LATIN1'", "standard_conforming_strings TO off"]
)
def test_a_connection_it_cannot_quote_for_is_left_to_the_cursor(
    conn: psycopg.Connection[Any], setting: str
) -> None:
    conn.execute(f"SET {setting}")
    assert simple_query(conn, "SELECT %s", ("it's",)) is UNQUOTABLE
    assert psycopg.ClientCursor(conn).execute("SELECT %s", ("it's",)).fetchone() == ("it's",)


def test_each_column_type_is_read_as_the_cursor_reads_it(conn: psycopg.Connection[Any]) -> None:
    """The types read here (text, varchar, name, boolean, the integers, NULLs of each) and
    a row with another type (left to psycopg's loaders) come back as the cursor's rows."""
    read_here = (
        "SELECT 'a''b\\c'::text, 'v'::varchar, 'n'::name, true, false, (-1)::int2, 2::int4, "
        "(2^62)::int8, NULL::text, NULL::bool, NULL::int8, '' FROM generate_series(1, 2)"
    )
    with_others = (
        "SELECT 1, 'x'::text, '2026-01-01 00:00+00'::timestamptz, '\\x00ff'::bytea, ARRAY[1]"
    )
    for sql in (read_here, with_others):
        expected = psycopg.ClientCursor(conn).execute(sql).fetchall()
        assert simple_query(conn, sql, ()) == expected
        assert [type(v) for v in simple_query(conn, sql, ())[0]] == [type(v) for v in expected[0]]
