"""Installs as users install it: a fresh venv, ``pip install <the built wheel>``, the quickstart.

Nothing but the package (and what it declares) is installed, so this fails if a
dependency the Redis broker needs is missing (kombu's Redis transport needs
``packaging``, which only ``celery[redis]`` brings). The wheel is $CELERY_DEBOUNCE_WHEEL
(scripts/test.sh and scripts/corners.py build it once with ``python -m build``), or one
built here. In a corner, $CELERY_DEBOUNCE_CONSTRAINTS holds the corner's versions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import stop_process

ROOT = Path(__file__).resolve().parents[2]

PROJ = """
from celery import Celery
from celery_debounce import DebouncedTask

app = Celery("proj", broker="{url}/1", backend="{url}/2")
app.conf.debounce_poll_interval = 0.2

@app.task(base=DebouncedTask, debounce="300ms", debounce_max_wait="10s",
          debounce_key="report:{{user_id}}")
def rebuild_report(user_id, reason):
    return [user_id, reason]
"""


CALLER = """
import sys
from proj import rebuild_report

results = [rebuild_report.delay(42, reason=f"edit {{i}}") for i in range(20)]
assert len({{r.id for r in results}}) == 1, results
print("RESULT", results[0].get(timeout=60))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fresh_venv_with_only_the_package_runs_the_quickstart(
    tmp_path: Path, redis_server: str, built_wheel: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    constraints = os.environ.get("CELERY_DEBOUNCE_CONSTRAINTS")
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            str(built_wheel),
            *(["-c", constraints] if constraints else []),
        ],
        check=True,
        timeout=540,
    )
    freeze = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.lower()
    assert "celery-debounced==" in freeze
    editable = subprocess.run(
        [str(py), "-m", "pip", "list", "--editable"], check=True, capture_output=True, text=True
    ).stdout
    assert "celery" not in editable  # from the wheel, not an editable checkout
    assert "pytest" not in freeze  # nothing from the test extra leaked in
    if constraints:  # a corner: the user's install has the corner's versions
        import celery
        import kombu
        import redis

        for name, version in (
            ("celery", celery.__version__),
            ("kombu", kombu.__version__),
            ("redis", redis.__version__),
        ):
            assert f"\n{name}=={version}\n" in f"\n{freeze}", (name, version, freeze)

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "proj.py").write_text(textwrap.dedent(PROJ.format(url=redis_server)))
    (proj / "caller.py").write_text(textwrap.dedent(CALLER.format()))
    worker = subprocess.Popen(
        [
            str(venv / "bin" / "celery"),
            "-A",
            "proj",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            "info",
        ],
        cwd=proj,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out = subprocess.run(
            [str(py), "caller.py"], cwd=proj, capture_output=True, text=True, timeout=90
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "RESULT [42, 'edit 0']" in out.stdout
    finally:
        log = stop_process(worker, timeout=20)
    # one window, one run: the dispatcher published it once with all 20 calls
    assert log.count("debounce: dispatched proj.rebuild_report") == 1, log
    assert "calls=20" in log


def test_import_warns_when_the_2022_package_shares_the_folder(tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "celery_debounce"
    shutil.copytree(ROOT / "celery_debounce", copy)
    clean = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", "import celery_debounce"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert clean.returncode == 0, clean.stderr
    (copy / "celery_debounce.py").write_text("class DebouncedTask: pass\n")
    out = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", "import celery_debounce"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "pip uninstall celery-debounce" in out.stderr
