"""Registration errors at deploy time: ``celery debounce check``, the worker's refusal,
and one refused definition that names itself without breaking the app's other tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import debounce_command, debounced

TESTS = Path(__file__).parents[1]
MISSPELT = (
    "check.misspelt: debounce_colect=True: unknown task option of misspelt (every "
    "name starting with 'debounce_' must be one of celery_debounce's); did you mean "
    "'debounce_collect'?"
)
BAD_KEY = (
    "check.bad_key: debounce_key='user:{user}': {user} names no parameter of the "
    "task (parameters: x)"
)


def _env(redis_server: str, bad: bool) -> dict[str, str]:
    env = {
        **os.environ,
        "DEBOUNCE_TEST_REDIS_URL": redis_server,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("CHECK_APP_BAD", None)
    if bad:
        env["CHECK_APP_BAD"] = "1"
    return env


def _celery(
    redis_server: str, bad: bool, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "check_app", *args],
        cwd=TESTS,
        env=_env(redis_server, bad),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_check_lists_each_refused_definition_with_its_own_message(redis_server: str) -> None:
    bad = _celery(redis_server, True, "debounce", "check")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.splitlines() == [BAD_KEY, MISSPELT, "2 problem(s) found."], bad.stdout
    as_json = json.loads(_celery(redis_server, True, "debounce", "check", "-j").stdout)
    assert as_json["ok"] is False
    assert [p["message"] for p in as_json["problems"]] == [BAD_KEY, MISSPELT]
    good = _celery(redis_server, False, "debounce", "check", "-j")
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads(good.stdout) == {"ok": True, "problems": []}


def test_a_task_module_that_fails_to_import_is_a_problem_not_a_traceback(
    redis_server: str,
) -> None:
    """A NameError while importing a task module: exit 1, the error and its file and
    line as the ``imports`` problem, and ``-j`` still prints its JSON object."""
    env = {**_env(redis_server, False), "CHECK_APP_BROKEN": "1"}
    for args in ((), ("-j",)):
        run = debounce_command("check_app", env, "check", *args)
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stdout + run.stderr
        if args:
            [problem] = json.loads(run.stdout)["problems"]
            assert problem["where"] == "imports"
            message = problem["message"]
        else:
            message, summary = run.stdout.splitlines()
            assert summary == "1 problem(s) found."
        assert "NameError: name 'settings_module_typo' is not defined" in message, message
        assert "check_tasks_broken.py, line 15" in message, message


def test_a_definition_refused_at_once_names_its_task() -> None:
    """A class statement, ``lazy=False`` or an already finalized app raise at once,
    from the task module's import: the message says which task (as check's do)."""
    import pytest
    from celery import Celery

    from celery_debounce import DebounceConfigError, DebouncedTask

    app = Celery("named", set_as_current=False)
    with pytest.raises(DebounceConfigError, match=r"^check\.classbad: debounce_leading=3"):

        class Bad(DebouncedTask):  # type: ignore[misc]
            name = "check.classbad"
            debounce, debounce_max_wait, debounce_leading = "1s", "2s", 3

    with pytest.raises(
        DebounceConfigError, match=r"^test_check_command\.[\w.<>]*Unnamed: debounce_max_wait"
    ):

        class Unnamed(DebouncedTask):  # type: ignore[misc]
            debounce, debounce_max_wait = "2s", "1s"

    def job(x: int) -> int:
        return x

    with pytest.raises(DebounceConfigError, match=r"^check\.eager: debounce_leading='yes'"):
        debounced(
            app,
            lazy=False,
            name="check.eager",
            debounce="1s",
            debounce_max_wait="2s",
            debounce_leading="yes",
        )(job)
    with pytest.raises(
        DebounceConfigError, match=r"^check\.eager: debounce_key='\{nope\}'"
    ):  # named already
        debounced(
            app,
            lazy=False,
            name="check.eager",
            debounce="1s",
            debounce_max_wait="2s",
            debounce_key="{nope}",
        )(job)


def test_check_reports_a_refused_setting(redis_server: str) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import check_app, sys\n"
            "from celery_debounce.ops.validation import check_app as check\n"
            "check_app.app.conf.debounce_shardz = 2\n"
            "print(check(check_app.app))",
        ],
        cwd=TESTS,
        env=_env(redis_server, False),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Problem(where='settings'" in run.stdout and "debounce_shardz" in run.stdout, (
        run.stdout + run.stderr
    )


def test_the_worker_refuses_to_start_with_the_same_messages(redis_server: str) -> None:
    # a worker that started would run until the timeout: a failure in 20 s, not 60
    run = _celery(
        redis_server, True, "worker", "--pool", "solo", "--loglevel", "warning", timeout=20
    )
    assert run.returncode != 0
    out = run.stdout + run.stderr
    assert "2 debounced task definition(s) refused:" in out, out
    assert f"  {BAD_KEY}" in out and f"  {MISSPELT}" in out, out


SCRIPT = """
import json
import check_app, check_tasks
from celery import Celery
from celery_debounce import DebounceConfigError
app = check_app.app
out = {"tasks": sorted(n for n in app.tasks if n.startswith("check."))}
try:
    check_tasks.misspelt.delay(1)
except DebounceConfigError as exc:
    out["misspelt"] = str(exc)
try:
    app.tasks["check.bad_key"].apply_async((1,))
except DebounceConfigError as exc:
    out["bad_key"] = str(exc)
out["good"] = app.tasks["check.good"].name  # another task's path is untouched
other = Celery("other", set_as_current=False)  # a later app of the process finalizes too
out["other"] = "check.misspelt" in other.tasks
print(json.dumps(out))
"""


def test_one_refused_definition_does_not_break_the_apps_other_tasks(redis_server: str) -> None:
    # shared=True (the default): Celery builds the task for every app it finalizes
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=TESTS,
        env=_env(redis_server, True),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["tasks"] == ["check.bad_key", "check.good", "check.misspelt"]
    assert out["misspelt"] == MISSPELT and out["bad_key"] == BAD_KEY
    assert out["good"] == "check.good" and out["other"] is True
