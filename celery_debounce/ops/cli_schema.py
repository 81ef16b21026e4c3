"""What a deploy writes into the store: ``celery debounce migrate`` (the PostgreSQL
store's schema, created or upgraded, and the grants of the role the workers and
producers use) and ``celery debounce publish`` (the task definitions producers by
name read)."""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand

from ..errors import DebounceError
from .cli_common import echo_json, json_option
from .formatting import config_error


@click.command(cls=CeleryCommand)
@json_option(
    'a JSON object ({"store": "postgresql" or "redis", "schema": its name or null, '
    '"before": N or null, "after": N or null})'
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="seconds to keep retrying while live sessions hold the tables' locks",
)
@click.option(
    "--grant-to",
    "grant_to",
    metavar="ROLE",
    help="then grant ROLE what workers and producers need (docs/stores.md, least privilege)",
)
@click.pass_context
def migrate(ctx: click.Context, as_json: bool, wait_s: float, grant_to: str | None) -> None:
    """Create or upgrade the PostgreSQL store's schema (debounce_store_url).

    Creates or upgrades the tables and functions in one transaction (concurrent runs
    wait for each other) and prints the version before and after. Each attempt waits
    0.5 s at most for a table lock, retried for up to --wait seconds; then it names
    the sessions holding the locks and exits 1, nothing changed. A newer schema is
    refused (exit 1). Safe to run again. On the Redis store: nothing to do (exit 0).
    """
    from ..settings import settings_for
    from ..store import build_store

    app = ctx.obj.app
    try:
        settings = settings_for(app)
    except DebounceError as exc:
        raise config_error(exc, app) from exc
    if settings.postgres_url is None:
        if as_json:
            echo_json({"store": "redis", "before": None, "after": None})
        else:
            click.echo("The Redis store has no schema: nothing to migrate.")
        return
    try:
        store = build_store(settings)  # not store_for: it refuses the schema migrated here
    except DebounceError as exc:
        raise config_error(exc, app) from exc
    schema = settings.postgres_schema
    before, after, others = _migrate(store, wait_s, grant_to)
    where = "" if schema is None else f" (schema {schema!r})"
    if as_json:
        echo_json({"store": "postgresql", "schema": schema, "before": before, "after": after})
    elif before == after:
        click.echo(f"PostgreSQL schema version {after}{where}: up to date, nothing to migrate.")
    else:
        was = "none" if before is None else f"version {before}"
        click.echo(f"PostgreSQL schema migrated{where}: {was} -> version {after}.")
    for name, windows in others if before is None and schema is not None else ():
        if windows:
            click.echo(
                f"Note: schema {name!r} of this database also holds celery_debounce "
                f"windows ({windows} open). Earlier releases kept every prefix's tables in "
                "the search_path: if they are this deployment's, set "
                f"debounce_postgres_schema = {name!r} instead, or let them drain first.",
                err=True,
            )


def _migrate(
    store: Any, wait_s: float, grant_to: str | None
) -> tuple[int | None, int, list[tuple[str, int]]]:
    """``store.migrate()`` (a PostgreSQL store), its errors as one line each; with the
    other schemas holding windows (``other_schemas``)."""
    try:
        before, after = store.migrate(wait_s)
        if grant_to:
            store.grant(grant_to)
        others = store.other_schemas() if before is None else []
    except DebounceError as exc:  # a server's refusal too (no right to create tables)
        raise click.ClickException(str(exc)) from exc
    finally:
        store.close()
    return before, after, others


@click.command(cls=CeleryCommand)
@json_option('a JSON object ({"tasks": {name: version}, "written": N, "skipped": {name: why}})')
@click.pass_context
def publish(ctx: click.Context, as_json: bool) -> None:
    """Write the app's task definitions into the store (docs/node.md).

    Producers by name (the Node package) read each debounced task's options, signature
    and route from its definition. Workers write them when they start; run this at
    deploy time so that a changed task is read before the first worker restarts.
    Writes only what is new or changed; safe to run again. A task whose definition
    cannot be made is named on stderr and the command exits 1 (the others are written).
    """
    import json

    from ..producer.published import definitions
    from ..store import store_for

    app = ctx.obj.app
    skipped: dict[str, str] = {}
    try:
        found = definitions(app, skipped)
        written = store_for(app).publish_definitions(found) if found else 0
    except DebounceError as exc:
        raise config_error(exc, app) from exc
    versions = {name: json.loads(text)["version"] for name, text in found.items()}
    if as_json:
        echo_json({"tasks": versions, "written": written, "skipped": skipped})
    elif not found and not skipped:
        click.echo("No debounced task in this app: nothing to publish.")
    else:
        for name, version in versions.items():
            click.echo(f"{name}  {version}")
        click.echo(f"{len(found)} task definition(s), {written} written.")
    if skipped:
        for name, why in skipped.items():
            click.echo(f"not published: {name}: {why}", err=True)
        ctx.exit(1)
