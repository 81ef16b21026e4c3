"""A step sent as one simple query, its values quoted on the client, its answer read
without a cursor.

Each store call is short, and psycopg's client-side cursor spent about 0.2 ms of CPU per
call quoting and reading it: as much as the gate's own work on the server
(docs/performance.md, row 12g). Values here are quoted to what that cursor's quoting
means (libpq's ``PQescapeLiteral`` for text, hex for bytea): on a UTF-8 connection with
``standard_conforming_strings`` a text literal is the text between quotes, each quote
doubled (UTF-8 never hides a quote byte inside a character, and a backslash is an
ordinary character there). A value of any other type, a text with a NUL byte (refused by
the cursor, by name), a connection whose client encoding is not UTF-8 or without
``standard_conforming_strings`` is :data:`UNQUOTABLE`: the caller sends it through the
cursor instead. Columns of text, boolean and integer types are read here; a row with any
other type is read by psycopg's loaders.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import generators, pq
from psycopg.adapt import Transformer

__all__ = ["UNQUOTABLE", "simple_query"]

#: What :func:`simple_query` answers when it cannot quote a value or the connection.
UNQUOTABLE: Any = object()

_pieces: dict[str, tuple[bytes, ...] | None] = {}
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_PLACEHOLDER = re.compile(r"%(.)", re.DOTALL)


def _split(sql: str) -> tuple[bytes, ...] | None:
    """``sql`` around its ``%s`` placeholders (``%%`` read as ``%``); None when it has
    another kind (named ones: the cursor's)."""
    if sql not in _pieces:
        pieces, piece, end = [], [], 0
        for mark in _PLACEHOLDER.finditer(sql):
            piece.append(sql[end : mark.start()])
            end = mark.end()
            if mark.group(1) == "%":
                piece.append("%")
            elif mark.group(1) == "s":
                pieces.append("".join(piece).encode())
                piece = []
            else:
                _pieces[sql] = None
                return None
        piece.append(sql[end:])
        pieces.append("".join(piece).encode())
        _pieces[sql] = tuple(pieces)
    return _pieces[sql]


def _quoted(value: Any) -> bytes | None:
    """``value`` as an SQL literal (for a UTF-8 connection with standard conforming
    strings), or None when it is not one of the plain types."""
    if value is None:
        return b"NULL"
    kind = type(value)
    if kind is bool:
        return b"true" if value else b"false"
    if kind is int:
        return b"%d" % value if value >= 0 else b" %d" % value
    if kind is str:
        if "\x00" in value:
            return None
        text: str = value
        return b"'" + text.replace("'", "''").encode() + b"'"
    if kind is bytes:
        return b"'\\x" + bytes(value).hex().encode() + b"'::bytea"
    return None


def simple_query(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...]) -> Any:
    """Run ``sql`` (``%s`` placeholders, one per value of ``params``) as one simple query
    on ``conn`` (in autocommit: one implicit transaction); the rows of its *last*
    statement, as tuples. :data:`UNQUOTABLE` when a value or the connection cannot be
    quoted here (nothing was sent). A statement the server refused raises its psycopg
    error, as a cursor would."""
    pgconn = conn.pgconn
    if (
        pgconn.parameter_status(b"client_encoding") != b"UTF8"
        or pgconn.parameter_status(b"standard_conforming_strings") != b"on"
    ):
        return UNQUOTABLE
    pieces = _split(sql)
    if pieces is None:
        return UNQUOTABLE
    if len(pieces) != len(params) + 1:
        raise TypeError(f"{len(pieces) - 1} placeholders for {len(params)} values: {sql!r}")
    parts = [pieces[0]]
    for value, piece in zip(params, pieces[1:], strict=True):
        literal = _quoted(value)
        if literal is None:
            return UNQUOTABLE
        parts += (literal, piece)
    with conn.lock:
        if conn.closed:
            raise psycopg.OperationalError("the connection is closed")
        pgconn.send_query(b"".join(parts))
        results = conn.wait(generators.execute(pgconn))
    for result in results:
        if result.status not in _OK:
            raise pg_errors.error_from_result(result, encoding="utf-8")
    return _rows(conn, results[-1])


def _bool(data: bytes) -> bool:
    return data == b"t"


#: Readers of a text-format value by type oid: text, varchar, name, boolean, the integers.
_READERS: dict[int, Callable[[bytes], Any]] = {
    25: bytes.decode,
    1043: bytes.decode,
    19: bytes.decode,
    16: _bool,
    20: int,
    21: int,
    23: int,
}


def _rows(conn: psycopg.Connection[Any], result: pq.abc.PGresult) -> list[tuple[Any, ...]]:
    """The rows of ``result`` as tuples, read as the cursor reads them."""
    readers = [_READERS.get(result.ftype(i)) for i in range(result.nfields)]
    if None in readers:
        loader = Transformer(conn)
        loader.set_pgresult(result)
        return loader.load_rows(0, result.ntuples, tuple)
    value = result.get_value
    columns = list(enumerate(readers))
    return [
        tuple([None if (data := value(row, i)) is None else read(data) for i, read in columns])  # type: ignore[misc]
        for row in range(result.ntuples)
    ]
