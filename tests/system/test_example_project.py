"""The README's demo runs and shows a burst becoming one run per key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_demo_starts_its_own_redis_and_collapses_the_burst() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    out = subprocess.run(
        [sys.executable, "-m", "example_project.demo"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "started a local redis-server" in out.stdout
    assert "-> 8 runs" in out.stdout
    assert out.stdout.count("notify_collaborators(") == 3  # leading edge: once per document
    assert out.stdout.count("reindex_document(") == 3
    assert out.stdout.count("rebuild_report(") == 2
