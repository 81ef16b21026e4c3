"""The PostgreSQL store's schema: its version, its SQL, and the refusals of a database
whose schema is missing, older or newer than this package's."""

from __future__ import annotations

from importlib import resources

from ...errors import (
    MigrationBlocked,
    SchemaMismatch,
    SchemaMissing,
    SchemaTooNew,
    SchemaTooOld,
)

__all__ = [
    "MIGRATE_COMMAND",
    "MIN_SERVER_VERSION",
    "SCHEMA_VERSION",
    "MigrationBlocked",
    "SchemaMismatch",
    "SchemaMissing",
    "SchemaTooNew",
    "SchemaTooOld",
    "functions_sql",
    "schema_sql",
    "steps_to",
]

#: The schema version this package reads and writes (``debounce_schema.version``).
SCHEMA_VERSION = 6
#: The oldest server the schema is written for (``server_version_num // 10000``).
MIN_SERVER_VERSION = 13
#: What creates or upgrades the schema.
MIGRATE_COMMAND = "celery -A proj debounce migrate"
#: ``pg_advisory_xact_lock`` key that serializes concurrent migrations ("debounce").
MIGRATE_LOCK = 0x6465626F756E6365

#: What every migration runs (``celery debounce migrate``, the Django migrations): the
#: lock (with :data:`MIGRATE_LOCK`), whether the schema exists, its version, and the
#: version written once the steps ran.
LOCK_SQL = "SELECT pg_advisory_xact_lock(%s)"
HAS_SCHEMA_SQL = "SELECT to_regclass('debounce_schema') IS NOT NULL"
VERSION_SQL = "SELECT max(version) FROM debounce_schema"
WRITE_VERSION_SQL = "UPDATE debounce_schema SET version = %s, written_at = clock_timestamp()"


#: What the role of the workers, dispatchers and producers needs on the schema, run by
#: its owner (``migrate --grant-to``): no DDL, no right to change the schema's version.
GRANTS_SQL = """\
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
REVOKE INSERT, UPDATE, DELETE ON {schema}.debounce_schema FROM {role};
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role};
"""


def grants_sql(role: str, schema: str) -> str:
    """:data:`GRANTS_SQL` for ``role`` on ``schema``, both quoted as identifiers."""

    def quoted(name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    return GRANTS_SQL.format(schema=quoted(schema), role=quoted(role))


#: After an upgrade: each role granted on the schema before it (it may write the
#: windows: ``migrate --grant-to``) gets :data:`GRANTS_SQL` again, so the tables and
#: functions the upgrade added are its too.
REGRANTS_SQL = """\
DO $regrant$
DECLARE grantee text;
BEGIN
  FOR grantee IN
    SELECT DISTINCT a.grantee::regrole::text
    FROM pg_class c, aclexplode(c.relacl) a
    WHERE c.oid = 'debounce_open'::regclass AND a.privilege_type = 'INSERT'
      AND a.grantee NOT IN (0, c.relowner)
  LOOP
    EXECUTE format({template}, current_schema(), grantee);
  END LOOP;
END
$regrant$;
"""


def regrants_sql() -> str:
    """:data:`REGRANTS_SQL`, with :data:`GRANTS_SQL` as its template."""
    template = GRANTS_SQL.format(schema="%1$I", role="%2$s")
    return REGRANTS_SQL.format(template="'" + template.replace("'", "''") + "'")


def _sql(*path: str) -> str:
    return resources.files(__package__).joinpath(*path).read_text("utf-8")


#: The schema's functions, one file each (``functions/<name>.sql``, every signature of
#: that name), applied in this order with ``CREATE OR REPLACE`` by every migration, after
#: its steps: a ``LANGUAGE sql`` function is checked when it is created, so what it
#: calls comes first.
FUNCTIONS = (
    "debounce_ms",
    "debounce_wake_channel",
    "debounce_refuse",
    "debounce_running",
    "debounce_close",
    "debounce_replacement",
    "debounce_gate",
    "debounce_take",
    "debounce_ack",
    "debounce_release",
    "debounce_quarantine",
    "debounce_claim",
    "debounce_renew",
    "debounce_end_claim",
    "debounce_put_back",
    "debounce_finish",
    "debounce_heartbeat",
    "debounce_layouts",
    "debounce_expiring",
    "debounce_expire",
    "debounce_sweep",
    "debounce_expired",
    "debounce_cancel",
    "debounce_cancel_revoking",
    "debounce_task_of",
    "debounce_history_ttl",
    "debounce_count",
    "debounce_count_call",
    "debounce_counters",
    "debounce_late_bucket",
    "debounce_splice",
    "debounce_gate_many",
)

#: version n -> the step that takes a schema of version n to n + 1
#: (``steps/<n + 1>.sql``: table changes only). A new database gets ``steps/1.sql``
#: (version 1), then each.
UPGRADES: dict[int, str] = {
    version: _sql("steps", f"{version + 1}.sql") for version in range(1, SCHEMA_VERSION)
}


def schema_sql() -> str:
    """The tables of version 1 (``steps/1.sql``): :func:`steps_to` takes them on to a
    later version."""
    return _sql("steps", "1.sql")


def functions_sql() -> str:
    """Every function of the schema (:data:`FUNCTIONS`), each ``CREATE OR REPLACE``."""
    return "\n".join(_sql("functions", f"{name}.sql") for name in FUNCTIONS)


def _changes(sql: str) -> bool:
    """``sql`` holds a statement (a step with no table change is comments only)."""
    return any(line.strip() and not line.lstrip().startswith("--") for line in sql.splitlines())


def steps_to(found: int | None, version: int) -> list[str]:
    """The SQL that takes a schema of version ``found`` (None: none) to ``version``:
    its steps, then, at this package's version, every function (so that each migration
    to it applies them, whatever it found), then the grants again (:func:`regrants_sql`:
    a function or table added since ``migrate --grant-to`` is the granted role's too).
    Nothing below this package's version when the schema is there already (the Django
    migrations, one per version)."""
    first = [schema_sql()] if found is None else []
    steps = first + [UPGRADES[v] for v in range(found or 1, version)]
    steps = [step for step in steps if _changes(step)]
    if version == SCHEMA_VERSION:
        steps.append(functions_sql())
    if version == SCHEMA_VERSION or (found is not None and found < version):
        steps.append(regrants_sql())
    return steps


#: How long one attempt of a migration waits for a table lock (ms): every call that
#: needs the table queues behind the waiting ALTER, so never longer than this.
MIGRATE_LOCK_TIMEOUT_MS = 500
#: How long a migration retries, by default, before it gives up (seconds).
MIGRATE_WAIT_S = 60.0
#: Sessions that hold a lock on one of the schema's tables (not this one).
BLOCKERS_SQL = (
    "SELECT DISTINCT a.pid, a.application_name, a.state, "
    "to_char(coalesce(a.xact_start, a.query_start), 'YYYY-MM-DD HH24:MI:SS TZ') "
    "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "JOIN pg_class c ON c.oid = l.relation "
    "WHERE c.relname LIKE 'debounce\\_%%' AND c.relnamespace = current_schema()::regnamespace "
    "AND l.granted AND a.pid <> pg_backend_pid() ORDER BY a.pid"
)


def blocked(waited_s: float, blockers: list[tuple[int, str, str, str]]) -> MigrationBlocked:
    """The error of a migration that gave up after ``waited_s``."""
    named = "; ".join(
        f"pid {pid} (application {app or '-'!r}, {state or 'state unknown'}, since {since})"
        for pid, app, state, since in blockers
    )
    return MigrationBlocked(
        f"the migration could not lock the schema's tables within {waited_s:g}s (each "
        f"attempt waits {MIGRATE_LOCK_TIMEOUT_MS} ms, so calls are held up no longer); "
        f"nothing changed. Holding them: {named or 'none any more (try again)'}. End "
        "those sessions or run it again with a longer --wait",
        blockers,
    )


def refusal(found: int | None) -> SchemaMismatch | None:
    """The error for a database whose schema version is ``found``; None when it fits."""
    if found is None:
        return SchemaMissing(
            f"the database has no celery_debounce schema (expected version "
            f"{SCHEMA_VERSION}): run `{MIGRATE_COMMAND}`",
            found,
            SCHEMA_VERSION,
        )
    if found < SCHEMA_VERSION:
        return SchemaTooOld(
            f"the database's celery_debounce schema is version {found}, older than this "
            f"package's {SCHEMA_VERSION}: run `{MIGRATE_COMMAND}`",
            found,
            SCHEMA_VERSION,
        )
    if found > SCHEMA_VERSION:
        return SchemaTooNew(
            f"the database's celery_debounce schema is version {found}, newer than this "
            f"package's {SCHEMA_VERSION}: upgrade celery-debounced (a schema is never "
            f"downgraded)",
            found,
            SCHEMA_VERSION,
        )
    return None


def _schema_error(exc: Exception) -> Exception:
    error = refusal(None)
    assert error is not None
    return error


def _safe(exc: BaseException) -> str:
    """An error's first line: psycopg's messages name host and port, never the
    password."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
