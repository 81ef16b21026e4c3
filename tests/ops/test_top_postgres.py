"""`celery debounce top` on the PostgreSQL store through an outage, read as a person
would under tmux: the view says the store is unreachable and keeps its screen (the
connection pool's warnings never print over it), comes back with the server, and prints
the lines it held once it ends."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_until
from test_top import CELERY, Tmux

PG_APP = """
import os
from celery import Celery
from celery_debounce import DebouncedTask
app = Celery("pgtop", broker="memory://")
app.conf.update(debounce_store_url=os.environ["PGTOP_STORE"], debounce_postgres_timeout=1.0,
                worker_hijack_root_logger=False)
@app.task(base=DebouncedTask, debounce="1h", debounce_max_wait="2h", debounce_key="{0}")
def nightly(name):
    return name
"""


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("tmux") is None,
    reason="tmux is not installed (scripts/ensure-observability.sh installs it)",
)
def test_top_on_postgres_keeps_its_screen_through_an_outage(tmp_path: Path) -> None:
    pytest.importorskip("psycopg")
    from celery_debounce.store.postgres import PostgresStore
    from celery_debounce.testing.postgres import LocalPostgres, find_postgres_bindir

    if find_postgres_bindir() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries not installed: in CI they must be")
        pytest.skip("PostgreSQL server binaries not installed (scripts/ensure-postgres.sh)")
    (tmp_path / "pgtop.py").write_text(PG_APP)
    with LocalPostgres() as server:
        url = server.url()
        with PostgresStore(url) as store:
            store.migrate()
        path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PGTOP_STORE": url, "PYTHONPATH": path}
        opener = "import pgtop\nfor name in 'abc': pgtop.nightly.delay(name)\n"
        subprocess.run([sys.executable, "-c", opener], cwd=tmp_path, env=env, check=True)
        tmux = Tmux(tmp_path, env)
        try:
            # its stderr to a file: what would have printed over the view shows there
            errors = tmp_path / "stderr.log"
            tmux.start("q", f"{CELERY} -A pgtop debounce top -i 0.5 2> {errors}")
            wait_until(lambda: "open windows 3" in tmux.screen("q"), timeout=30, interval=0.3)

            server.stop()  # refused from now on: each refresh fails at once
            wait_until(
                lambda: "!! PostgreSQL store unreachable" in tmux.screen("q"),
                timeout=20,
                interval=0.3,
            )
            # a few refreshes later: the view is whole, and the pool's warnings never
            # printed over it (the last held line shows in its own "log:" row)
            for _ in range(6):
                lines = tmux.screen("q").splitlines()
                assert lines[0].startswith("celery debounce top"), "\n".join(lines)
                assert "open windows 3" in "\n".join(lines), "\n".join(lines)
                stray = [x for x in lines if "error con" in x and not x.startswith("log: ")]
                assert stray == [], "\n".join(lines)
                subprocess.run(["sleep", "0.5"], check=True)
            assert any(x.startswith("log: WARNING celery_debounce.store.postgres") for x in lines)
            assert errors.read_text() == ""  # nothing printed while the view is live

            server._launch(30)  # the same data and port
            wait_until(
                lambda: (
                    "open windows 3" in tmux.screen("q") and "unreachable" not in tmux.screen("q")
                ),
                timeout=30,
                interval=0.3,
            )
            assert tmux.quits("q", "q") == "0"
            after = wait_until(
                lambda: "[exited with status" in tmux.screen("q") and tmux.screen("q"),
                timeout=10,
                interval=0.2,
            )
            held = after + errors.read_text()
            assert "celery_debounce.store.postgres" in held, held  # held, then printed
        finally:
            tmux.kill()
