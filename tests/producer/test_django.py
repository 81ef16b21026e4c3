"""Django: ``delay_on_commit`` / ``apply_async_on_commit`` and CELERY_-namespaced settings.

A real (small) Django project in tests/django_project, sqlite, a real worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import silent_listener, stop_process

pytest.importorskip("django")

PROJECT = Path(__file__).resolve().parents[1] / "django_project"


def _scenario_with_worker(
    script: str, tmp_path: Path, redis_server: str, **extra_env: str
) -> tuple[dict[str, Any], str]:
    """Run ``script`` of the Django project beside a real solo worker of it: the JSON
    object its last line prints, and the worker's log."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "djproj.settings",
        "DJPROJ_REDIS_URL": redis_server,
        "DJPROJ_DB": str(tmp_path / "db.sqlite3"),
        "PYTHONPATH": _path(),
        **extra_env,
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "djproj",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "info",
        ],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run = subprocess.run(
            [sys.executable, script],
            cwd=PROJECT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    finally:
        log = stop_process(worker, timeout=20)
    assert run.returncode == 0, run.stdout + run.stderr + log
    out: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return out, log


@pytest.mark.slow
def test_on_commit_calls_gate_at_commit_and_never_after_rollback(
    tmp_path: Path, redis_server: str, redis_client: object
) -> None:
    out, log = _scenario_with_worker("scenario.py", tmp_path, redis_server)
    assert out["settings_prefix"] == "djdebounce"  # CELERY_DEBOUNCE_KEY_PREFIX was read
    assert out["plain_has_on_commit"] is True  # Celery's DjangoTask, for comparison
    assert out["keys_inside_transaction"] == 0  # nothing written before the commit
    assert out["window_after_commit"] == 2  # both on-commit calls joined one window
    assert out["window_after_rollback"] is None  # the rolled-back call wrote nothing
    assert out["windows_after_rollback"] == 1  # only the committed one
    assert out["result"] == "final text"  # the run read the committed row
    assert log.count("debounce: dispatched notes.tasks.index_note") == 1, log


def _path() -> str:
    """The project first, then the caller's path (a tree under test comes first there)."""
    return os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.parametrize("bad", [False, True, "broken"])
def test_manage_py_check_refuses_a_bad_debounced_task(tmp_path: Path, bad: bool | str) -> None:
    """celery_debounce.contrib.django in INSTALLED_APPS: `check` (run by migrate and
    runserver too) fails with the worker's message, before any save reaches the gate."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "djproj.settings",
        "DJPROJ_REDIS_URL": "redis://127.0.0.1:9",  # never connected
        "DJPROJ_DB": str(tmp_path / "db.sqlite3"),
        "PYTHONPATH": _path(),
    }
    if bad:
        env["DJPROJ_BROKEN" if bad == "broken" else "DJPROJ_BAD"] = "1"
    run = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = run.stdout + run.stderr
    if not bad:
        assert run.returncode == 0 and "no issues" in out, out
        return
    assert run.returncode == 1, out
    if bad == "broken":  # a tasks module that raises while imported: an error, no traceback
        assert "Traceback" not in out, out
        assert (
            "imports: (celery_debounce.E001) NameError: name 'settings_module_typo' is not defined"
        ) in out and "notes/tasks.py, line" in out, out
        return
    assert (
        "notes.tasks.misspelt: (celery_debounce.E001) debounce_colect=True: unknown task "
        "option of misspelt"
    ) in out, out


def test_manage_py_check_deploy_reaches_the_store(tmp_path: Path) -> None:
    """`check --deploy` also reaches the windows' store, as `debounce check --connect`
    does: a server that does not answer is celery_debounce.E002; a live one passes (a
    server of its own: another test's prefix on a shared one is another deployment)."""
    from celery_debounce.testing.servers import LocalRedis, free_port

    def deploy_check(url: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "djproj.settings",
            "DJPROJ_REDIS_URL": url,
            "DJPROJ_DB": str(tmp_path / "db.sqlite3"),
            "PYTHONPATH": _path(),
        }
        return subprocess.run(
            [sys.executable, "-m", "django", "check", "--deploy"],
            cwd=PROJECT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    down = deploy_check(f"redis://127.0.0.1:{free_port()}")
    out = down.stdout + down.stderr
    assert down.returncode == 1 and "store/unreachable: (celery_debounce.E002)" in out, out
    with LocalRedis() as server:
        up = deploy_check(server.url)
    out = up.stdout + up.stderr
    assert up.returncode == 0 and "celery_debounce.E00" not in out, out


@pytest.mark.slow
def test_on_commit_with_redis_down_publishes_the_run_under_the_outage_policy(
    tmp_path: Path, redis_server: str, redis_client: object
) -> None:
    """The recipe of docs/production.md ("must not lose a run"): the windows' Redis
    down, the broker up, CELERY_DEBOUNCE_ON_OUTAGE = "publish": the row commits and
    the on-commit hook publishes the run plainly (a real worker runs it, reading the
    committed row); under "raise" the hook raises after the commit, as before."""
    from celery_debounce.testing.servers import free_port

    out, _ = _scenario_with_worker(
        "outage_scenario.py",
        tmp_path,
        redis_server,
        DJPROJ_DEAD_URL=f"redis://127.0.0.1:{free_port()}/0",
    )
    assert out["policy"] == "publish"  # CELERY_DEBOUNCE_ON_OUTAGE was read
    assert out["fallbacks"] == 1
    assert out["result"] == "saved while Redis was down"  # ran, on the committed row
    assert "DebounceBackendError" in out["raise_raised"]  # the store's error, as before
    assert "DebounceBreakerOpen" not in out["raise_raised"]
    assert out["raise_row_saved"] is True and out["raise_fallbacks"] == 1


@pytest.mark.slow
def test_on_commit_with_a_redis_that_never_answers_waits_once_then_publishes_at_once(
    tmp_path: Path, redis_server: str, redis_client: object
) -> None:
    """The windows' Redis accepts connections and never answers, the broker is up,
    CELERY_DEBOUNCE_ON_OUTAGE = "publish": the first commit's hook waits the call
    timeout once and publishes its run; the commits after it skip Redis (the breaker)
    and publish theirs at once; a real worker runs every one on its committed row.
    Under "raise" the hook fails fast with the breaker's error, after the commit."""
    timeout = 1.0
    with silent_listener() as (port, held):
        out, _ = _scenario_with_worker(
            "silent_scenario.py",
            tmp_path,
            redis_server,
            DJPROJ_SILENT_URL=f"redis://127.0.0.1:{port}/0",
            DJPROJ_TIMEOUT=str(timeout),
        )
        assert held  # the scenario did connect to the silent server
    assert out["timeout"] == timeout  # CELERY_DEBOUNCE_REDIS_TIMEOUT was read
    assert timeout * 0.9 <= out["first"] < timeout * 5, out
    assert max(out["burst"]) < timeout / 2, out  # no call after the first waits
    assert (
        out["reasons"][0] in ("unknown", "unreachable") and out["reasons"][1:] == ["breaker"] * 5
    ), out
    assert out["results"] == [f"save {i}" for i in range(6)]  # every run, none lost
    assert out["raise_took"] < timeout / 2, out
    assert "DebounceBreakerOpen" in out["raise_raised"], out
    assert out["raise_row_saved"] is True and out["raise_fallbacks"] == 6
