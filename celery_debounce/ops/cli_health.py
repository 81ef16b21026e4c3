"""``celery debounce ping`` (the dispatchers' heartbeats, a liveness probe) and
``celery debounce check`` (the debounced task definitions, at deploy time)."""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from ..errors import DebounceConfigError, DebounceError
from .cli_common import _admin, echo_json, json_option
from .formatting import config_error, printable, relative


def liveness(app: Any) -> dict[str, Any]:
    """Every dispatcher's heartbeat: ``{"now": s, "dispatchers": [{name, status,
    heartbeat_age_s, stopped_at}]}``; status is "alive" (a heartbeat in the last
    3 x HEARTBEAT_S), "silent" (older: killed, hung or cut off from Redis) or "stopped"
    (stopped cleanly)."""
    from ..dispatch.dispatcher import HEARTBEAT_S
    from ..store import store_for

    now_ms, alive, stopped = store_for(app).liveness()
    rows = []
    for name, ms in alive:
        age = max(0.0, (now_ms - ms) / 1000)
        rows.append(
            {
                "name": name,
                "status": "alive" if age <= 3 * HEARTBEAT_S else "silent",
                "heartbeat_age_s": round(age, 3),
                "stopped_at": None,
            }
        )
    for name, ms in stopped:
        rows.append(
            {"name": name, "status": "stopped", "heartbeat_age_s": None, "stopped_at": ms / 1000}
        )
    rows.sort(key=lambda r: (r["status"] != "alive", r["name"]))
    return {"now": now_ms / 1000, "dispatchers": rows}


@click.command(cls=CeleryCommand)
@click.option(
    "-n",
    "--name",
    "names",
    multiple=True,
    cls=CeleryOption,
    help_group="Ping",
    help="Only this dispatcher (repeatable); exit 1 unless every one named is alive.",
)
@json_option("a JSON object")
@click.pass_context
def ping(ctx: click.Context, names: tuple[str, ...], as_json: bool) -> None:
    """Which dispatchers are alive, from their heartbeats in Redis.

    Every dispatcher (embedded in a worker, in beat, or `celery debounce
    dispatch`) writes a heartbeat every 5 s. ALIVE: one in the last 15 s;
    SILENT: older (killed, hung, or cut off from Redis); STOPPED: it stopped
    cleanly. Exit 0 when at least one dispatcher (every one named with --name)
    is alive, else 1: usable as a liveness probe.
    """
    try:
        _admin(ctx)  # the configuration errors, with the -A hint
        found = liveness(ctx.obj.app)
    except DebounceError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = found["dispatchers"]
    if names:
        rows = [r for r in rows if r["name"] in names]
    alive = {r["name"] for r in rows if r["status"] == "alive"}
    ok = set(names) <= alive if names else bool(alive)
    if as_json:
        echo_json({**found, "dispatchers": rows, "ok": ok})
    else:
        for row in rows:
            detail = (
                f"heartbeat {relative(-row['heartbeat_age_s'])}"
                if row["status"] != "stopped"
                else f"stopped {relative(row['stopped_at'] - found['now'])}"
            )
            click.echo(f"-> {printable(row['name'])}: {row['status'].upper()} ({detail})")
        for missing in sorted(set(names) - {r["name"] for r in rows}):
            click.echo(f"-> {printable(missing)}: no heartbeat recorded")
        if not rows and not names:
            click.echo("No dispatcher heartbeat recorded.")
        click.echo(f"{len(alive)} dispatcher(s) alive.")
    if not ok:
        ctx.exit(1)


@click.command(cls=CeleryCommand)
@click.option(
    "--connect",
    is_flag=True,
    cls=CeleryOption,
    help_group="Check",
    help="Also reach the windows' store: the server, the credentials and rights, the "
    "schema (PostgreSQL), the server's version and whether the key prefix is in use.",
)
@json_option(
    'a JSON object ({"ok": bool, "problems": [{"where", "message"}]}; with --connect '
    'also "store": {"server", "notes"})'
)
@click.pass_context
def check(ctx: click.Context, connect: bool, as_json: bool) -> None:
    """Check every debounced task definition and the debounce settings, at deploy time.

    Imports the modules a worker imports (imports, include, autodiscover_tasks) and
    reports each definition a worker would refuse to start with, with the same
    message. Connects to nothing unless --connect: then it reaches the store too and
    reports each problem by kind (store/unreachable, store/authentication,
    store/privileges, store/schema, store/server version, store/key prefix). Exit 0
    when all are valid, else 1.
    """
    from ..contrib import import_problem
    from .validation import Problem, check_app, reach_app

    try:
        problems = check_app(ctx.obj.app)
    except Exception as exc:  # a task module that fails to import: the worker fails too
        problems = [import_problem(exc)]
    reached = None
    if connect and not any(p.where == "settings" for p in problems):
        reached = reach_app(ctx.obj.app)
        problems += [Problem(f"store/{kind}", message) for kind, message in reached.problems]
    if as_json:
        found: dict[str, object] = {
            "ok": not problems,
            "problems": [{"where": p.where, "message": p.message} for p in problems],
        }
        if reached is not None:
            found["store"] = {"server": reached.server, "notes": reached.notes}
        echo_json(found)
    else:
        if reached is not None and reached.server:
            click.echo(f"store: reached {reached.server}")
        for note in reached.notes if reached is not None else ():
            click.echo(f"store: {note}")
        for problem in problems:
            click.echo(
                f"{printable(problem.where)}: {problem.message}"
                if not problem.message.startswith(f"{problem.where}:")
                else problem.message
            )
        for problem in problems:  # no -A (Celery's default app): say so
            if problem.where == "settings":
                said = config_error(DebounceConfigError(problem.message), ctx.obj.app).message
                if "\n" in said:
                    click.echo(said.partition("\n")[2])
        click.echo(
            f"{len(problems)} problem(s) found."
            if problems
            else "All debounced tasks and settings are valid."
        )
    if problems:
        ctx.exit(1)
