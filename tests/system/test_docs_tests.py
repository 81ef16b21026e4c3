"""docs/guarantees.md names a test for every statement: those tests must exist.

Reads the page, extracts every test it cites (backticked `test_...` names and
`tests/test_x.py::test_y` / `tests/test_x.py` forms) and fails when one does not
exist in tests/, or exists but is skipped or expected to fail unconditionally (a
guarantee backed by a test that never runs is not backed). Every row of the crash
table and of the lingering-records table must cite a test (or say why none can).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
PAGE = ROOT / "docs" / "guarantees.md"

#: `test_name`, possibly with a path or a truncated `test_name_...`; one case of a
#: parametrised test is cited with its param: `test_name[redis]`
_BACKTICKED = re.compile(r"`([^`\n]*\btest_[^`\n]*)`")
_NODE = re.compile(r"^(tests/[\w/]+\.py)(?:::(\w+)(?:\[[\w.-]+\])?)?$")
_NAME = re.compile(r"^(test_\w+)(?:\[[\w.-]+\])?$")


@cache
def collect_test_functions() -> dict[str, dict[str, list[str]]]:
    """{file relative to the root: {test function name: [its decorators' source]}}."""
    found: dict[str, dict[str, list[str]]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"), str(path))
        funcs: dict[str, list[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "test_"
            ):
                funcs[node.name] = [ast.unparse(d) for d in node.decorator_list]
        found[path.relative_to(ROOT).as_posix()] = funcs
    return found


def cited() -> list[str]:
    """Every test reference on the page, in order, without duplicates."""
    refs: list[str] = []
    for match in _BACKTICKED.finditer(PAGE.read_text("utf-8")):
        ref = match.group(1).strip()
        if ref not in refs:
            refs.append(ref)
    return refs


def problem(ref: str) -> str | None:
    """Why ``ref`` does not name a runnable test, or None if it does."""
    functions = collect_test_functions()
    node = _NODE.match(ref)
    if node:
        path, name = node.groups()
        if path not in functions:
            return f"{path} does not exist"
        if name is None:
            return None
        candidates = {path: functions[path]}
    elif named := _NAME.match(ref):
        name = named.group(1)
        candidates = functions
    else:
        return "not a test name (truncated or decorated?): cite the exact function name"
    where = [path for path, funcs in candidates.items() if name in funcs]
    if not where:
        return f"no test function {name} in {', '.join(candidates) if node else 'tests/'}"
    for path in where:
        for decorator in candidates[path][name]:
            if re.match(r"(pytest\.)?mark\.(skip|skipif|xfail)\b", decorator):
                return f"{path}::{name} is marked {decorator}: it does not prove the row"
    return None


# Parse the test files now, at collection, before any test runs: CPython 3.11.7's
# ast.parse can raise "SystemError: AST constructor recursion depth mismatch" in a
# thread that caught a RecursionError earlier (seen once after the fault tests).
collect_test_functions()


def test_the_page_cites_tests() -> None:
    assert len(cited()) >= 20, cited()


@pytest.mark.parametrize("ref", cited())
def test_every_test_the_guarantees_page_cites_exists(ref: str) -> None:
    reason = problem(ref)
    assert reason is None, f"docs/guarantees.md cites `{ref}`: {reason}"


def table_rows(header_start: str) -> list[str]:
    """The body rows of the first table whose header row starts with ``header_start``."""
    lines = PAGE.read_text("utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


@pytest.mark.parametrize(
    ("table", "allowed"),
    [
        ("| fault |", "(Celery semantics)"),
        ("| case | record |", None),
    ],
)
def test_every_row_of_the_failure_tables_cites_a_test(table: str, allowed: str | None) -> None:
    rows = table_rows(table)
    assert rows
    for row in rows:
        last = row.rstrip(" |").rsplit("|", 1)[-1]
        refs = [m.group(1) for m in _BACKTICKED.finditer(last)]
        assert refs or (allowed and allowed in last), f"row cites no test: {row}"


def test_the_checker_catches_a_missing_or_truncated_name() -> None:
    assert problem("test_no_such_test_anywhere") is not None
    assert problem("test_broker_down_...") is not None
    assert problem("tests/test_nope.py") is not None
    assert problem("tests/system/test_faults.py::test_no_such_test") is not None
    assert problem("test_no_such_test_anywhere[redis]") is not None
    assert problem("test_max_wait_forces_a_run_under_a_never_ending_stream[rabbitmq]") is None
    assert (
        problem("tests/system/test_faults.py::test_producer_clock_skew_does_not_change_deadlines")
        is None
    )


def test_the_mutation_list_matches_the_code_and_the_tests() -> None:
    """scripts/mutations.py: every target text is in its file exactly once, and every
    test a mutation selects exists (the mutation check itself fails on both, later)."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from mutation_check import stale
        from mutations import MUTATIONS
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert stale(MUTATIONS, ROOT) == []
    functions = collect_test_functions()
    for mutation in MUTATIONS:
        assert mutation.tests, mutation.name
        for node in mutation.tests:
            path, _, name = node.partition("::")
            assert name.split("[")[0] in functions.get(path, {}), (mutation.name, node)


def test_every_test_a_mutation_selects_is_collected_by_its_exact_id() -> None:
    """A mutation's test id with parameters (``[redis-...]``) names a case pytest collects:
    a module newly run over both stores renames its cases, and a stale id fails the
    mutation check only at its end."""
    import sys

    from helpers import collect_only

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from mutations import MUTATIONS
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    out = collect_only(sorted({node for mutation in MUTATIONS for node in mutation.tests}))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
