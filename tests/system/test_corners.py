"""The declared test matrix (scripts/corners.toml) is what runs: the lowest corner is the
lower bounds of pyproject.toml, each run has its row's versions, the docs show the matrix.

``test_this_run_has_its_rows_versions`` runs in every corner (scripts/corners.py sets
$CELERY_DEBOUNCE_CORNER; there only ``tests/`` and ``pyproject.toml`` are copied) and in the
main run; the others need the whole checkout (scripts/, docs/) and run in the main run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import celery
import kombu
import pytest
import redis
from helpers import collect_only

import celery_debounce
from celery_debounce.store import MIN_REDIS

try:
    import tomllib
except ImportError:  # Python 3.10 (pytest brings tomli there)
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
CORNER = os.environ.get("CELERY_DEBOUNCE_CORNER")
in_checkout = pytest.mark.skipif(
    bool(CORNER) or not (ROOT / "scripts" / "corners.py").exists(),
    reason="needs the checkout (scripts/, docs/): a main-run test",
)


def matrix() -> dict[str, Any]:
    return tomllib.loads((ROOT / "scripts" / "corners.toml").read_text())


def row_named(name: str) -> dict[str, Any]:
    data = matrix()
    if name == "main":
        return {"name": "main", **data["main"]}
    return next(row for row in data["corner"] if row["name"] == name)


def series(version: str, prefix: str) -> bool:
    want = [int(part) for part in prefix.split(".")]
    return [int(part) for part in re.findall(r"\d+", version)][: len(want)] == want


def lower_bounds() -> dict[str, str]:
    """The lower bound of each declared range, as major.minor: python, celery, redis-py, and
    the postgres extra's psycopg and psycopg-pool."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounds = {"python": re.fullmatch(r">=\s*([\d.]+)", project["requires-python"]).group(1)}
    for requirement in [*project["dependencies"], *project["optional-dependencies"]["postgres"]]:
        found = re.fullmatch(r"([A-Za-z0-9_-]+)(\[[^\]]*\])?\s*>=\s*([\d.]+)", requirement)
        assert found, f"{requirement!r}: every dependency declares its range as NAME>=X.Y"
        name = {"redis": "redis-py"}.get(found.group(1), found.group(1))
        bounds[name] = found.group(3)
    return {name: ".".join([*bound.split("."), "0"][:2]) for name, bound in bounds.items()}


def server_info(url: str) -> tuple[str, str]:
    info = redis.Redis.from_url(f"{url}/0").info("server")
    if "valkey_version" in info or info.get("server_name") == "valkey":
        return "valkey", str(info.get("valkey_version"))
    return "redis", str(info["redis_version"])


@pytest.mark.skipif(
    not CORNER
    and bool(
        os.environ.get("DEBOUNCE_TEST_REDIS_URL") or os.environ.get("CELERY_DEBOUNCE_TEST_SERVER")
    ),
    reason="the main run's row names the server scripts/test.sh starts; this one was chosen",
)
def test_this_run_has_its_rows_versions(redis_server: str) -> None:
    row = row_named(CORNER or "main")
    python = "{}.{}".format(*sys.version_info[:2])
    found = {
        "python": python,
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "redis-py": redis.__version__,
    }
    if "psycopg" in row:
        import psycopg
        import psycopg_pool

        found.update({"psycopg": psycopg.__version__, "psycopg-pool": psycopg_pool.__version__})
    for name, version in found.items():
        assert series(version, row[name]), (
            f"{row['name']}: {name} {version} is not the row's {row[name]}.x"
        )
    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE == row["hiredis"], f"{row['name']}: hiredis {HIREDIS_AVAILABLE}"
    server, version = server_info(redis_server)
    assert (server, series(version, row["server-version"])) == (row["server"], True), (
        f"{row['name']}: the tests' server is {server} {version}, the row says "
        f"{row['server']} {row['server-version']}"
    )
    if CORNER:
        # the corner tests the built wheel: no checkout on the path
        site = Path(celery_debounce.__file__).resolve()
        assert "site-packages" in site.parts, site
    if CORNER == "lowest":
        # exactly the lowest versions pyproject.toml admits, on the oldest server admitted
        for name, bound in lower_bounds().items():
            assert series(found[name], bound), (
                f"lowest corner: {name} {found[name]} is not {bound}.x, the declared lower bound"
            )
        assert series(version, ".".join(map(str, MIN_REDIS))), (server, version, MIN_REDIS)


@in_checkout
def test_the_lowest_corner_is_the_declared_lower_bounds() -> None:
    lowest = row_named("lowest")
    for name, bound in lower_bounds().items():
        assert lowest[name] == bound, (
            f"pyproject.toml admits {name} {bound}; the lowest corner tests {lowest[name]}"
        )
    # the oldest server the package accepts (celery_debounce.store.MIN_REDIS)
    assert (lowest["server"], lowest["server-version"]) == ("redis", ".".join(map(str, MIN_REDIS)))
    # kombu is not declared: the lowest corner pairs it with its Celery minor
    assert lowest["kombu"] == lowest["celery"]
    assert lowest["hiredis"] is False  # hiredis is an extra: the lowest install has none


@in_checkout
def test_every_corner_is_a_declared_combination() -> None:
    bounds = lower_bounds()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classifiers = set(project["classifiers"])
    for row in [row_named("main"), *matrix()["corner"]]:
        for name in ("python", "celery", "redis-py"):
            assert tuple(map(int, row[name].split("."))) >= tuple(
                map(int, bounds[name].split("."))
            ), (row["name"], name)
        assert f"Programming Language :: Python :: {row['python']}" in classifiers, row["name"]


def corners_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("corners", ROOT / "scripts" / "corners.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@in_checkout
def test_the_docs_matrix_table_is_the_corners_file() -> None:
    docs = (ROOT / "docs" / "development.md").read_text()
    found = re.search(
        r"<!-- matrix: scripts/corners.py table -->\n(.*?)\n<!-- end matrix -->", docs, re.S
    )
    assert found, "docs/development.md: the matrix table between its markers is missing"
    assert found.group(1) + "\n" == corners_module().table(), (
        "docs/development.md's matrix differs from scripts/corners.toml: paste the output of "
        "`python scripts/corners.py table`"
    )


@in_checkout
def test_every_contract_and_valkey_test_exists() -> None:
    data = matrix()
    pg = [data["postgres"]["contract"], *data["postgres"]["tests"]]
    ids = data["contract"]["tests"] + data["valkey"]["tests"] + pg
    out = collect_only(ids)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    collected = out.stdout
    for test_id in data["contract"]["tests"] + data["postgres"]["tests"]:
        assert test_id in collected, test_id
    # the PostgreSQL selection's `-k postgres` keeps the contract suite's PostgreSQL cases
    assert f"{data['postgres']['contract']}::" in collected and "[postgres]" in collected
    # the contract subset and the Valkey run are Redis's: most corners have no psycopg, so
    # a test over both stores is named there by its [redis] case
    on_redis = collect_only(data["contract"]["tests"] + data["valkey"]["tests"]).stdout.splitlines()
    assert [line for line in on_redis if "postgres" in line] == []


@in_checkout
def test_ci_runs_the_corners_and_tox_claims_no_other_matrix() -> None:
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    assert "scripts/test-corners.sh" in test_sh
    tox = (ROOT / "tox.ini").read_text()
    # tox keeps only the checks CI runs too (scripts/checks.sh); the versions are the corners'
    envs = re.search(r"env_list\s*=\s*\n((?:[ \t]+\S.*\n)+)", tox).group(1).split()
    assert envs == ["lint", "type", "docs"], envs
    assert not re.search(r"^\[testenv:py", tox, re.M)


@in_checkout
def test_a_missing_interpreter_or_a_server_of_another_version_fails_the_corner(
    tmp_path: Path,
) -> None:
    corners = corners_module()
    with pytest.raises(corners.CornerError, match=r"no Python 3\.99"):
        corners.find_python("3.99")
    from celery_debounce.testing.servers import find_redis_server

    binary = find_redis_server()
    name, version = corners.server_version(binary)
    row = {
        "name": "test",
        "server": name,
        "server-version": "1.0",
        "server-path": binary,
        "server-from": "the tests' server",
    }
    with pytest.raises(corners.CornerError, match=f"is {name} {re.escape(version)}"):
        corners.server_binary(row, tmp_path, tmp_path)
    row["server-version"] = ".".join(version.split(".")[:2])
    assert corners.server_binary(row, tmp_path, tmp_path) == binary


@in_checkout
def test_the_pypi_description_names_the_corners_ci_runs() -> None:
    text = " ".join((ROOT / "docs" / "pypi.md").read_text().split())
    for index, row in enumerate(matrix()["corner"]):
        server = f"{row['server'].capitalize()} {row['server-version']}"
        if index == 0:
            phrase = (
                f"Python {row['python']}, Celery {row['celery']}, "
                f"redis-py {row['redis-py']}, {server}"
            )
        else:
            phrase = f"{row['python']}, {row['celery']}, {row['redis-py']}, {server}"
        assert phrase in text, f"docs/pypi.md does not name the {row['name']} corner: {phrase}"


@in_checkout
def test_a_corner_home_is_reused_only_for_the_wheel_it_was_prepared_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run --prepared`` (scripts/test.sh) tests a home ``prepare`` set up during the main
    run only if it was set up for this very wheel; a missing, unreadable or older home is
    set up again."""
    corners = corners_module()
    monkeypatch.setattr(corners, "WORK", tmp_path)
    wheel = tmp_path / "celery_debounced.whl"
    wheel.write_bytes(b"the wheel of this run")
    row = {"name": "lowest"}
    assert corners._prepared(row, wheel) is None  # never prepared
    (tmp_path / "lowest").mkdir()
    ready = {"wheel": corners._digest(wheel), "binary": "/bin/true", "set_up": 1.0}
    (tmp_path / "lowest" / "prepared.json").write_text(json.dumps(ready))
    assert corners._prepared(row, wheel) == ready
    wheel.write_bytes(b"a wheel built again from other code")
    assert corners._prepared(row, wheel) is None
    (tmp_path / "lowest" / "prepared.json").write_text('{"wheel": ')  # cut short
    assert corners._prepared(row, wheel) is None

    def set_up_again(*args: object) -> dict[str, object]:
        raise RuntimeError("set up again")

    monkeypatch.setattr(corners, "prepare_corner", set_up_again)
    with pytest.raises(RuntimeError, match="set up again"):
        corners.run_corner(row, wheel, {}, reuse=True)
