"""What ships for operators: ``celery debounce dashboard`` / ``alerts`` write the files
in the package, and the exporter without its extra says how to install it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "celery_debounce" / "dashboards"
CELERY = str(Path(sys.executable).with_name("celery"))
APP = """
from celery import Celery

app = Celery("shipapp", broker="redis://127.0.0.1:1/0")
app.conf.debounce_redis_url = "redis://127.0.0.1:1/0"
"""


def run_cli(
    tmp_path: Path, *args: str, pythonpath: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "shipapp.py").write_text(APP)
    path = os.pathsep.join([*map(str, pythonpath), str(tmp_path)])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [CELERY, "-A", "shipapp", "debounce", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_dashboard_and_alerts_write_the_shipped_files(tmp_path: Path) -> None:
    for command, name in (("dashboard", "celery-debounce.json"), ("alerts", "alerts.yml")):
        shipped = (SHIPPED / name).read_text()
        out = run_cli(tmp_path, command)
        assert out.returncode == 0, out.stderr
        assert out.stdout == shipped
        target = tmp_path / f"out-{name}"
        out = run_cli(tmp_path, command, "-o", str(target))
        assert out.returncode == 0, out.stderr
        assert out.stdout == ""
        assert target.read_text() == shipped


def test_an_unwritable_output_is_one_line_and_exit_1(tmp_path: Path) -> None:
    out = run_cli(tmp_path, "alerts", "-o", str(tmp_path / "missing" / "alerts.yml"))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"Error: cannot write {tmp_path / 'missing' / 'alerts.yml'}: No such file or directory"
    ]


def test_the_exporter_without_its_extra_names_the_install_command(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "prometheus_client.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'prometheus_client'\")\n"
    )
    extra = re.search(
        r"^(\w+) = \[\"prometheus-client", (ROOT / "pyproject.toml").read_text(), re.M
    )
    assert extra is not None
    out = run_cli(tmp_path, "exporter", "--port", "0", pythonpath=(blocker,))
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().splitlines() == [
        "Error: the exporter needs prometheus_client: "
        f"pip install 'celery-debounced[{extra.group(1)}]'"
    ], out.stderr
    assert "Traceback" not in out.stderr + out.stdout
