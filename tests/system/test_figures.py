"""scripts/figures.py draws the docs' figures from real runs; run it in quick mode.

The committed figures must be what the script draws today (same titles, labels and
legends, numbers aside) and every one must be shown in the docs, so a change to
the plots or to the behaviour they show cannot leave stale pictures unnoticed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "figures.py"
IMG = ROOT / "docs" / "img"

sys.path.insert(0, str(SCRIPT.parent))
from figures import FIGURES  # noqa: E402


def words(svg: Path) -> set[str]:
    """The figure's text with the numbers masked (tick labels dropped)."""
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg.read_text())
    return {re.sub(r"[\d.,]+", "#", t) for t in texts if re.search(r"[A-Za-z]", t)}


@pytest.mark.slow
def test_figures_script_draws_every_figure_from_a_real_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="pip install 'celery-debounced[figures]'")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split(":")[0]: line for line in done.stdout.splitlines() if ":" in line}

    # a burst becomes one run, a window after the last call
    burst = re.search(
        r"(\d+) calls -> (\d+) run\(s\), started ([\d.]+)s after the first "
        r"call, ([\d.]+)s after the last",
        lines["burst"],
    )
    assert burst, lines
    assert int(burst.group(1)) > 1 and int(burst.group(2)) == 1
    assert 0.95 <= float(burst.group(4)) <= 3.0  # the 1 s window, then dispatch
    # a stream that never pauses runs every max wait (2 s), not once at the end
    stream = re.search(r"calls in ([\d.]+)s -> (\d+) runs, started at (.*)", lines["max-wait"])
    assert stream, lines
    starts = [float(s) for s in re.findall(r"\+([\d.]+)s", stream.group(3))]
    assert len(starts) >= 2 and 1.95 <= starts[0] <= 3.5
    # the lateness distribution covers every window of the small benchmark
    late = re.search(r"(\d+) windows, taken p50 ([\d.]+)ms p99 ([\d.]+)ms", lines["lateness"])
    assert late and int(late.group(1)) == 200
    assert float(late.group(2)) <= float(late.group(3)) < 2000
    # a burst during a run of an exclusive task: one follow-up, after the run, held
    held = re.search(
        r"(\d+) calls during the run -> (\d+) follow-up\(s\), started "
        r"(-?[\d.]+)s after the run ended, held ([\d.]+)s",
        lines["exclusive"],
    )
    assert held, lines
    assert int(held.group(1)) == 10 and int(held.group(2)) == 1
    assert 0 <= float(held.group(3)) < 1.5 and float(held.group(4)) > 0
    # every dashboard panel drawn from a real Prometheus (when it is installed)
    drawn = set(FIGURES)
    if shutil.which("prometheus"):
        board = re.search(r"(\d+) panels, (\d+) series drawn", lines["dashboard"])
        assert board and int(board.group(1)) == 11 and int(board.group(2)) >= 11, lines
    else:
        drawn.discard("dashboard.svg")

    for name in drawn:
        fresh, committed = tmp_path / name, IMG / name
        assert ET.parse(fresh).getroot().tag.endswith("svg")
        assert committed.exists(), f"{committed} missing: run python scripts/figures.py"
        assert words(fresh) == words(committed), (
            f"{committed} is stale: run python scripts/figures.py"
        )


def test_every_figure_is_shown_in_the_docs() -> None:
    docs = "\n".join(page.read_text() for page in (ROOT / "docs").glob("*.md"))
    for name in FIGURES:
        assert f"img/{name}" in docs, name
    assert "monitoring.md" in (ROOT / "docs" / "operations.md").read_text()
