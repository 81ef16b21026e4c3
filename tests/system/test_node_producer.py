"""The Node producer (clients/node, npm ``celery-debounced``) against a real redis-server
and a real Celery worker with the embedded dispatcher: one contract, two languages."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced, make_app, running_worker, wait_until
from node_producer import NODE, node_calls

from celery_debounce.ops.read_view import list_windows
from celery_debounce.store.redis.scripts import script_source
from celery_debounce.testing.redis_cluster import LocalCluster

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed (the Node producer's tests need node >= 20 on PATH)"
)


def test_the_node_package_ships_the_python_package_s_gate_script(node_package: Path) -> None:
    assert NODE is not None
    shipped = subprocess.run(
        [
            NODE,
            "--input-type=module",
            "-e",
            "import { GATE_SCRIPT } from 'celery-debounced'; process.stdout.write(GATE_SCRIPT)",
        ],
        cwd=node_package,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert shipped == script_source("gate")


OPTIONS = {"debounce": "400ms", "maxWait": "10s", "key": "report:{0}"}


def report_task(app: Celery, runs: list[Any]) -> Any:
    @debounced(
        app,
        name="proj.build_report",
        shared=False,
        debounce="400ms",
        debounce_key="report:{0}",
        debounce_max_wait="10s",
    )
    def build_report(user_id: str, n: int = 0) -> str:
        runs.append((user_id, n))
        return f"built {user_id}@{n}"

    return build_report


def test_a_node_burst_is_one_python_run_with_the_openers_arguments(
    app: Celery, redis_server: str, node_package: Path
) -> None:
    runs: list[Any] = []
    report_task(app, runs)
    calls = [
        ["proj.build_report", {"args": ["u1"], "kwargs": {"n": i}}, OPTIONS] for i in range(10)
    ]
    calls.append(["proj.build_report", {"args": ["u2"], "kwargs": {"n": 7}}, OPTIONS])
    with running_worker(app):
        ids = node_calls(node_package, f"{redis_server}/0", calls)
        assert all(isinstance(i, str) for i in ids), ids
        assert len(set(ids[:10])) == 1 and ids[10] != ids[0]
        assert app.AsyncResult(ids[0]).get(timeout=15) == "built u1@0"
        assert app.AsyncResult(ids[10]).get(timeout=15) == "built u2@7"
        wait_until(lambda: not list_windows(app), timeout=15)
    assert sorted(runs) == [("u1", 0), ("u2", 7)]


def test_node_and_python_producers_of_one_key_share_one_window(
    app: Celery, redis_server: str, node_package: Path
) -> None:
    runs: list[Any] = []
    build_report = report_task(app, runs)
    # a quiet period longer than starting a Node process on a loaded machine: the three
    # calls must land in one window
    options = {**OPTIONS, "debounce": "4s"}
    with running_worker(app):
        first = node_calls(
            node_package,
            f"{redis_server}/0",
            [["proj.build_report", {"args": ["u1"], "kwargs": {"n": 1}}, options]],
        )
        python = build_report.apply_async(("u1",), {"n": 2}, debounce="4s")
        last = node_calls(
            node_package,
            f"{redis_server}/0",
            [["proj.build_report", {"args": ["u1"], "kwargs": {"n": 3}}, options]],
        )
        assert first[0] == python.id == last[0]
        assert python.get(timeout=15) == "built u1@1"
        wait_until(lambda: not list_windows(app), timeout=15)
    assert runs == [("u1", 1)]


def test_replace_payload_and_the_ceiling_hold_across_producers(
    app: Celery, redis_server: str, redis_client: redis.Redis, node_package: Path
) -> None:
    runs: list[Any] = []
    build_report = report_task(app, runs)
    ident = "17:proj.build_report:report:u1"
    opener = node_calls(
        node_package,
        f"{redis_server}/0",
        [
            [
                "proj.build_report",
                {"args": ["u1"], "kwargs": {"n": 1}},
                {**OPTIONS, "debounce": "5s", "maxWait": "6s"},
            ]
        ],
    )[0]
    first_seen = int(redis_client.hget(f"debounce:{{0}}:open:{ident}", "fs") or 0)
    joined = build_report.apply_async(
        ("u1",), {"n": 2}, debounce="30s", debounce_max_wait="1h", debounce_replace_payload=True
    )
    assert joined.id == opener
    # the ceiling is the Node opener's (fs + 6 s), whatever the Python joiner asked
    assert redis_client.zscore("debounce:{0}:due", ident) == first_seen + 6000
    last = node_calls(
        node_package,
        f"{redis_server}/0",
        [
            [
                "proj.build_report",
                {"args": ["u1"], "kwargs": {"n": 3}},
                {**OPTIONS, "debounce": "300ms", "maxWait": "6s", "replacePayload": True},
            ]
        ],
    )[0]
    assert last == opener
    assert redis_client.hget(f"debounce:{{0}}:open:{ident}", "p") == b'[["u1"], {"n": 3}, {}]'
    with running_worker(app):
        assert joined.get(timeout=15) == "built u1@3"
    assert runs == [("u1", 3)]


@pytest.mark.cluster
def test_on_a_redis_cluster_node_and_python_share_one_window_and_it_runs(
    redis_server: str, redis_cluster: LocalCluster, node_package: Path
) -> None:
    redis.Redis.from_url(f"{redis_server}/0").flushall()
    redis_cluster.flushall()
    app = make_app(
        redis_server,
        debounce_redis_url=f"{redis_cluster.url}/0",
        debounce_redis_cluster=True,
        debounce_shards=6,
    )
    runs: list[Any] = []
    build_report = report_task(app, runs)
    host, port = redis_cluster.url.rsplit("/", 1)[-1].rsplit(":", 1)
    node = {"host": host, "port": int(port)}
    options = {**OPTIONS, "shards": 6}
    calls = [
        ["proj.build_report", {"args": [user], "kwargs": {"n": 1}}, options]
        for user in ("u1", "u2", "u3")
    ]
    with running_worker(app):
        ids = node_calls(node_package, "", calls, cluster=node)
        assert all(isinstance(i, str) for i in ids), ids
        assert [build_report.delay(u, n=2).id for u in ("u1", "u2", "u3")] == ids
        assert [app.AsyncResult(i).get(timeout=20) for i in ids] == [
            "built u1@1",
            "built u2@1",
            "built u3@1",
        ]
    assert sorted(runs) == [("u1", 1), ("u2", 1), ("u3", 1)]


def test_the_packed_tarball_installs_in_an_empty_folder_and_runs_the_readme_quickstart(
    tmp_path: Path, redis_server: str, redis_client: redis.Redis, node_package: Path
) -> None:
    npm = shutil.which("npm")
    assert NODE is not None and npm is not None, "npm comes with node"
    packed = (
        subprocess.run(
            [npm, "pack", "--pack-destination", str(tmp_path)],
            cwd=node_package,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "package.json").write_text('{"private": true, "type": "module"}\n')
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefer-offline", str(tmp_path / packed)],
        cwd=folder,
        check=True,
        capture_output=True,
        timeout=300,
    )
    readme = (node_package / "README.md").read_text("utf-8")
    assert readme.startswith("# celery-debounced\n\n```sh\nnpm install celery-debounced")
    example = readme.split("```ts\n", 1)[1].split("```", 1)[0]
    assert len(example.strip().splitlines()) <= 10
    (folder / "quickstart.mjs").write_text(
        example.replace("redis://localhost:6379/0", f"{redis_server}/0"), "utf-8"
    )
    out = subprocess.run(
        [NODE, "quickstart.mjs"], cwd=folder, capture_output=True, text=True, timeout=60, check=True
    ).stdout.strip()
    assert redis_client.hget("debounce:{0}:open:17:proj.build_report:report:u1", "id") == (
        out.encode()
    )
    typed = folder / "node_modules" / "celery-debounced" / "dist"
    assert (typed / "esm" / "index.d.ts").is_file() and (typed / "cjs" / "index.d.ts").is_file()
    required = subprocess.run(
        [NODE, "-e", "const m = require('celery-debounced'); console.log(typeof m.debounce)"],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert required == "function"


def test_a_node_call_s_own_task_id_gets_the_run_s_outcome(
    app: Celery, redis_server: str, node_package: Path
) -> None:
    """A Node call with ``taskId`` opens the window under it or is recorded as its alias;
    the worker stores the run's outcome under each (as for Python's ``task_id=``)."""
    runs: list[Any] = []
    report_task(app, runs)
    calls = [
        ["proj.build_report", {"args": ["u1"], "taskId": f"node-own-{i}"}, OPTIONS]
        for i in range(3)
    ]
    with running_worker(app):
        ids = node_calls(node_package, f"{redis_server}/0", calls)
        assert ids == ["node-own-0"] * 3, ids
        for i in range(3):
            assert app.AsyncResult(f"node-own-{i}").get(timeout=15) == "built u1@0"
    assert runs == [("u1", 0)]
