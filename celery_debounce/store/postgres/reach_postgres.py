"""``celery debounce check --connect`` on the PostgreSQL store: the server and the role
reach the deployment's schema at this package's version, the role holds the grants the
calls need, and the schema (the key prefix's) is one something uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import DebounceError
from ..reach import Reached
from .schema import SchemaMismatch
from .step import many, one

if TYPE_CHECKING:  # pragma: no cover
    from .store import PostgresStore

__all__ = ["reach_postgres"]

_WHERE = (
    "SELECT current_setting('server_version'), current_database(), current_user, "
    "current_schema(), host(inet_server_addr()), inet_server_port()"
)
#: What the role may not do of what the calls need (schema.GRANTS_SQL gives it all).
_MISSING = (
    "SELECT 'table ' || c.relname FROM pg_class c JOIN pg_namespace n "
    "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relkind = 'r' "
    "AND c.relname LIKE 'debounce\\_%%' "
    "AND NOT has_table_privilege(c.oid, 'SELECT, INSERT, UPDATE, DELETE') "
    "UNION ALL SELECT DISTINCT 'function ' || p.proname FROM pg_proc p JOIN pg_namespace n "
    "ON n.oid = p.pronamespace WHERE n.nspname = current_schema() "
    "AND p.proname LIKE 'debounce\\_%%' AND NOT has_function_privilege(p.oid, 'EXECUTE') "
    "ORDER BY 1"
)
_USED = (
    "SELECT (SELECT count(*) FROM debounce_open), (SELECT count(*) FROM debounce_taken), "
    "(SELECT count(*) FROM debounce_dispatchers), (SELECT count(*) FROM debounce_stats)"
)


def reach_postgres(store: PostgresStore) -> Reached:
    """What reaching ``store``'s database found (:class:`Reached`)."""
    found = Reached()
    try:
        version, database, user, schema, host, port = store._read(one(_WHERE))
        found.server = f"PostgreSQL {version} at {host or 'a local socket'}"
        found.server += f":{port}/{database} as {user}" if port else f", {database} as {user}"
        store._check()
    except SchemaMismatch as exc:
        found.problems.append(("schema", str(exc)))
        _other_deployments(store, found, missing=True)
        return found
    except DebounceError as exc:
        return found.refused(exc)
    try:
        found.server += f", schema {schema!r} version {store.schema_version()}"
        missing = [row[0] for row in store._read(many(_MISSING))]
        if missing:
            found.problems.append(
                (
                    "privileges",
                    f"role {user!r} may not use {', '.join(missing)} of schema {schema!r}: "
                    f"run `celery -A proj debounce migrate --grant-to {user}` as the "
                    "schema's owner",
                )
            )
            return found
        opened, taken, dispatchers, counters = store._read(one(_USED))
    except DebounceError as exc:
        return found.refused(exc)
    found.notes.append(
        f"schema {schema!r}: {opened} open window(s), {taken} taken, {dispatchers} "
        "dispatcher(s) recorded"
    )
    if not (opened or taken or dispatchers or counters):
        _other_deployments(store, found, missing=False)
    return found


def _other_deployments(store: PostgresStore, found: Reached, missing: bool) -> None:
    """Other schemas of the database holding windows: this one (missing, or unused)
    is likely a misspelt prefix or schema."""
    try:
        others = [name for name, windows in store.other_schemas() if windows]
    except DebounceError:
        return
    prefix = store.settings.key_prefix
    if others:
        what = "has no schema" if missing else "is used by nothing"
        found.problems.append(
            (
                "key prefix",
                f"debounce_key_prefix={prefix!r} {what} on this database while schema(s) "
                f"{', '.join(map(repr, others))} hold windows: a misspelt prefix or "
                "debounce_postgres_schema, or the wrong database?",
            )
        )
    elif not missing:
        found.notes.append("nothing uses this schema yet (a new deployment)")
