#!/usr/bin/env python3
"""Mutation check: every guarantee's tests must catch a realistic bug in its code.

    .venv/bin/python scripts/mutation_check.py            # every mutation in scripts/mutations.py
    .venv/bin/python scripts/mutation_check.py -k lease   # those whose name contains "lease"
    .venv/bin/python scripts/mutation_check.py --in store/postgres/functions/  # by file
    .venv/bin/python scripts/mutation_check.py --list     # list them, run nothing
    .venv/bin/python scripts/mutation_check.py --jobs 4   # four at a time (CI)

Copies the tree (package, tests, docs, pyproject.toml) to a temporary directory once
per job, then for each mutation: applies its edits to a free copy, runs only the tests
that guard it (pytest -x, a timeout per mutation) with that copy first on PYTHONPATH, and
restores the copy. The working tree is never touched. Each job has its own redis-server
(DEBOUNCE_TEST_REDIS_URL), unless one is given and there is one job. Running jobs side
by side can only add load: a slowed test fails (a kill), it cannot make a mutant survive.

Exit status 1 if a mutation survives (its tests pass), if a mutation's target text
is not found exactly once (the list went stale), or if a run errors (collection
error, unknown test id). Prints a table: mutation, guarantee, killing test, seconds.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from mutations import MUTATIONS, Mutation  # noqa: E402

#: What the tests need from the tree; nothing else is copied.
COPIED = (
    "celery_debounce",
    "tests",
    "docs",
    "contract",
    "pyproject.toml",
    "mkdocs.yml",
    "README.md",
)
_FAILED = re.compile(r"^(?:FAILED|ERROR) ([^\s\[]+(?:\[[^\]]*\])?)", re.M)


@dataclass
class Outcome:
    mutation: Mutation
    status: str  # killed | survived | timeout | error
    killer: str
    seconds: float
    output: str = ""


def stale(mutations: list[Mutation], root: Path) -> list[str]:
    """Mutations whose target text is not in its file exactly once."""
    problems = []
    for m in mutations:
        for edit in m.edits:
            path = root / edit.path
            if not path.exists():
                problems.append(f"{m.name}: {edit.path} does not exist")
                continue
            count = path.read_text("utf-8").count(edit.find)
            if count != 1:
                problems.append(
                    f"{m.name}: {edit.path}: target found {count} times, not once: {edit.find!r}"
                )
    return problems


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "logs")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copy2(src, dest / name)


def run_mutation(m: Mutation, copy: Path, env: dict[str, str], timeout: float) -> Outcome:
    originals = {e.path: (copy / e.path).read_text("utf-8") for e in m.edits}
    try:
        for edit in m.edits:
            path = copy / edit.path
            text = path.read_text("utf-8")
            path.write_text(text.replace(edit.find, edit.replace, 1), "utf-8")
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-p",
            "no:cacheprovider",
            # hypothesis's plugin imports the whole library at the session's end (about
            # 1.5 s of CPU a run, a third of a short run); ``@given`` tests run without it
            "-p",
            "no:hypothesispytest",
            "-rfE",
            "--no-header",
            "--timeout",
            str(int(timeout)),
            *m.tests,
        ]
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=copy,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return Outcome(
                m, "timeout", f"(no result within {timeout:.0f}s)", time.monotonic() - start, out
            )
        seconds = time.monotonic() - start
        if proc.returncode == 0:
            return Outcome(m, "survived", "-", seconds, out)
        if proc.returncode == 1:
            failed = _FAILED.findall(out)
            return Outcome(m, "killed", failed[0] if failed else "?", seconds, out)
        return Outcome(m, "error", f"pytest exit {proc.returncode}", seconds, out)
    finally:
        for rel, text in originals.items():
            (copy / rel).write_text(text, "utf-8")


def short(node: str) -> str:
    return node.split("/", 1)[-1] if node.startswith("tests/") else node


def table(outcomes: list[Outcome]) -> str:
    rows = [("mutation", "guarantee", "killing test", "s", "result")]
    for o in outcomes:
        status = (
            o.status
            if not (o.status == "survived" and o.mutation.pending)
            else f"survived (pending {o.mutation.pending})"
        )
        rows.append(
            (o.mutation.name, o.mutation.guarantee, short(o.killer), f"{o.seconds:.1f}", status)
        )
    widths = [min(max(len(r[i]) for r in rows), 70) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-k", dest="match", help="only mutations whose name contains this")
    parser.add_argument(
        "--in", dest="path", help="only mutations with an edit in a file whose path contains this"
    )
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="mutations run side by side, each in its own copy with its own "
        "redis-server (default 1)",
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds per mutation (default 180)"
    )
    parser.add_argument(
        "--allow-pending",
        action="store_true",
        help="a survivor marked pending (until another branch is merged) does not fail the check",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print pytest's output for survivors and errors",
    )
    opts = parser.parse_args()

    mutations = [
        m
        for m in MUTATIONS
        if (not opts.match or opts.match in m.name)
        and (not opts.path or any(opts.path in edit.path for edit in m.edits))
    ]
    if opts.list:
        for m in mutations:
            print(f"{m.name}  [{m.guarantee}]  ->  {', '.join(m.tests)}")
        return 0
    problems = stale(mutations, ROOT)
    if problems:
        print("mutation check: stale mutation list (update scripts/mutations.py):")
        print("\n".join(f"  {p}" for p in problems))
        return 1

    sys.path.insert(0, str(ROOT))
    from celery_debounce.testing.servers import LocalRedis

    jobs = max(1, opts.jobs)
    servers: list[LocalRedis] = []
    copies: list[tuple[Path, dict[str, str]]] = []
    given = os.environ.get("DEBOUNCE_TEST_REDIS_URL")
    try:
        for _ in range(jobs):
            if given and jobs == 1:
                url = given
            else:
                servers.append(LocalRedis().start())
                url = servers[-1].url
            tmp = Path(tempfile.mkdtemp(prefix="debounce-mutants-"))
            copy_tree(tmp)
            env = dict(
                os.environ,
                DEBOUNCE_TEST_REDIS_URL=url,
                PYTHONDONTWRITEBYTECODE="1",
                PYTHONPATH=os.pathsep.join(
                    filter(None, [str(tmp), os.environ.get("PYTHONPATH", "")])
                ),
            )
            copies.append((tmp, env))
            where = subprocess.run(
                [sys.executable, "-c", "import celery_debounce; print(celery_debounce.__file__)"],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            if not where.startswith(str(tmp)):
                print(f"mutation check: the copy's package is not the one imported ({where})")
                return 1
        print(
            f"mutation check: {len(mutations)} mutations, {jobs} at a time, tests from "
            f"copies in {', '.join(str(c[0]) for c in copies)}",
            flush=True,
        )
        free = list(copies)
        lock = threading.Lock()

        def one(m: Mutation) -> Outcome:
            with lock:
                tmp, env = free.pop()
            try:
                o = run_mutation(m, tmp, env, opts.timeout)
            finally:
                with lock:
                    free.append((tmp, env))
            with lock:
                print(
                    f"  {o.status:8} {o.seconds:6.1f}s  {m.name}  ({short(o.killer)})", flush=True
                )
                if opts.verbose and o.status in ("survived", "error", "timeout"):
                    print(o.output[-4000:])
            return o

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            outcomes = list(pool.map(one, mutations))
        total = time.monotonic() - started
    finally:
        for tmp, _env in copies:
            shutil.rmtree(tmp, ignore_errors=True)
        for server in servers:
            server.cleanup()

    print()
    print(table(outcomes))
    bad = [
        o
        for o in outcomes
        if o.status in ("survived", "error")
        and not (o.status == "survived" and o.mutation.pending and opts.allow_pending)
    ]
    timeouts = [o for o in outcomes if o.status == "timeout"]
    print(
        f"\n{len(outcomes)} mutations in {total:.0f}s: "
        f"{sum(o.status == 'killed' for o in outcomes)} killed, "
        f"{len(timeouts)} timed out (counted as killed: the tests hang), "
        f"{sum(o.status == 'survived' for o in outcomes)} survived, "
        f"{sum(o.status == 'error' for o in outcomes)} errors"
    )
    for o in bad:
        print(
            f"FAILED: {o.mutation.name}: {o.status}"
            + (f" (pending {o.mutation.pending})" if o.mutation.pending else "")
        )
        if o.status == "error":
            print(o.output[-3000:])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
