"""The throwaway servers of the tests never outlive them: a test process that ends
without its cleanup (pytest-timeout's ``os._exit``, a kill) leaves no server running or
stopped behind, and a frozen server is stopped without being thawed first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import wait_until
from rabbitmq_node import SKIP_ENV, rabbitmq_server_path

from celery_debounce.testing.postgres import LocalPostgres, find_postgres_bindir

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    """``pid`` runs (or is stopped), and is no zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _needs_postgres() -> None:
    if find_postgres_bindir() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL server binaries not installed: in CI they must be")
        pytest.skip("PostgreSQL server binaries not installed (scripts/ensure-postgres.sh)")


def _start_freeze_and_vanish(body: str) -> dict[str, object]:
    """Run ``body`` (it starts servers, freezes them and prints their pids and
    directories as JSON) in a process that then ends with ``os._exit``, as
    pytest-timeout's thread method ends a test process: no cleanup runs."""
    script = textwrap.dedent(body) + "\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_frozen_postgres_whose_test_process_vanished_is_stopped_and_removed() -> None:
    _needs_postgres()
    left = _start_freeze_and_vanish(
        """
        import json
        from celery_debounce.testing.postgres import LocalPostgres
        server = LocalPostgres().start()
        pids = server.freeze()
        print(json.dumps({"pids": pids, "dir": str(server.dir)}))
        """
    )
    pids = [int(pid) for pid in left["pids"]]  # type: ignore[attr-defined]
    assert len(pids) > 1  # the postmaster and its children, all stopped
    assert wait_until(lambda: not any(_alive(pid) for pid in pids), 30), [
        pid for pid in pids if _alive(pid)
    ]
    assert wait_until(lambda: not Path(str(left["dir"])).exists(), 10)


def test_a_stopped_redis_server_whose_test_process_vanished_is_stopped_and_removed() -> None:
    left = _start_freeze_and_vanish(
        """
        import json, os, signal
        from celery_debounce.testing.servers import LocalRedis
        server = LocalRedis().start()
        os.kill(server.process.pid, signal.SIGSTOP)
        print(json.dumps({"pids": [server.process.pid], "dir": server.dir}))
        """
    )
    (pid,) = left["pids"]  # type: ignore[misc]
    assert wait_until(lambda: not _alive(int(pid)), 30)
    assert wait_until(lambda: not Path(str(left["dir"])).exists(), 10)


def test_a_rabbitmq_node_whose_test_process_vanished_is_stopped_and_removed() -> None:
    """The node's script and its Erlang VM (one process group) are stopped, its directory
    removed (a killed CI run left a VM running for hours)."""
    if rabbitmq_server_path() is None:
        if os.environ.get("CI") or not os.environ.get(SKIP_ENV):
            pytest.fail("rabbitmq-server is not installed (scripts/ensure-rabbitmq.sh)")
        pytest.skip("rabbitmq-server is not installed")
    left = _start_freeze_and_vanish(
        """
        import json, subprocess, sys
        sys.path.insert(0, "tests")
        from rabbitmq_node import RabbitNode
        node = RabbitNode().start()
        group = subprocess.run(
            ["pgrep", "-g", str(node.process.pid)], capture_output=True, text=True
        ).stdout.split()
        print(json.dumps({"pids": [int(pid) for pid in group], "dir": str(node.dir)}))
        """
    )
    pids = [int(pid) for pid in left["pids"]]  # type: ignore[attr-defined]
    assert len(pids) > 1  # the script and the VM, at least
    assert wait_until(lambda: not any(_alive(pid) for pid in pids), 30), [
        pid for pid in pids if _alive(pid)
    ]
    assert wait_until(lambda: not Path(str(left["dir"])).exists(), 10)


def test_a_frozen_postgres_is_stopped_by_its_cleanup_without_a_thaw() -> None:
    """``cleanup`` of a frozen server (a test that failed between ``freeze`` and
    ``thaw``) ends every process of it, with no 15 s wait for a stopped postmaster."""
    _needs_postgres()
    server = LocalPostgres().start()
    pids = server.freeze()
    server.cleanup()
    assert wait_until(lambda: not any(_alive(pid) for pid in pids), 10)
    assert not server.dir.exists()


def test_a_server_stopped_by_its_owner_is_not_signalled_again_by_its_watcher() -> None:
    """Once ``cleanup`` ran, the watcher is gone: a later exit of the process that
    started the server signals nothing (a reused pid is left alone)."""
    _needs_postgres()
    server = LocalPostgres().start()
    reaper = server._reaper
    assert reaper is not None and reaper.process.poll() is None
    server.cleanup()
    assert reaper.process.poll() == -signal.SIGKILL  # dismissed, not acted
