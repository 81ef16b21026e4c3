"""celery_debounce.testing and its pytest plugin: no window lost or crossed, no state leaked,
nothing imported until used. Against a real redis-server unless the fixture is the subject."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import debounced

from celery_debounce.ops.read_view import list_windows
from celery_debounce.testing import (
    PLACEHOLDER_URL,
    debounce_windows,
    fakeredis_fixture,
    run_windows,
)


def _tasks(app: Celery, ran: list[str]) -> tuple[Any, Any]:
    @debounced(app, debounce="1h", debounce_max_wait="2h", debounce_key="{0}")
    def sync(key: str) -> str:
        ran.append(f"sync:{key}")
        if key == "boom":
            raise RuntimeError("boom")
        return key

    @debounced(app, debounce="1h", debounce_max_wait="2h", debounce_key="{0}")
    def other(key: str) -> str:
        ran.append(f"other:{key}")
        return key

    return sync, other


def _states(redis_client: redis.Redis) -> dict[str, str]:
    out = {}
    for key in redis_client.scan_iter("debounce:{0}:win:*"):
        out[key.decode().rsplit(":", 1)[1]] = redis_client.hget(key, "st").decode()
    return out


@pytest.mark.parametrize("how", ["throw", "eager_propagates"])
def test_a_raising_run_loses_no_window(
    app_factory: Any, redis_client: redis.Redis, how: str
) -> None:
    app = app_factory(task_eager_propagates=how == "eager_propagates")
    ran: list[str] = []
    sync, _ = _tasks(app, ran)
    ids = {key: sync.delay(key).id for key in ("a", "boom", "c", "d")}
    with pytest.raises(RuntimeError, match="boom"):
        run_windows(app, sync, throw=True if how == "throw" else None)
    assert sorted(ran) == ["sync:a", "sync:boom", "sync:c", "sync:d"]  # the rest still ran
    states = _states(redis_client)
    assert {states[i] for i in ids.values()} == {"finished"}
    assert redis_client.hget(f"debounce:{{0}}:win:{ids['boom']}", "rs") == b"FAILURE"
    assert redis_client.zcard("debounce:{0}:active") == 0
    assert redis_client.zcard("debounce:{0}:leased") == 0
    assert run_windows(app) == []  # nothing left behind


def test_run_windows_of_one_task_runs_only_that_task(
    app: Celery, redis_client: redis.Redis
) -> None:
    ran: list[str] = []
    sync, other = _tasks(app, ran)
    sync.delay("s1")
    due_other = other.apply_async(("o-due",), debounce="1ms", debounce_max_wait="1ms")
    pending_other = other.delay("o-pending")
    import time

    time.sleep(0.01)  # o-due's deadline (1 ms) passes
    [result] = run_windows(app, sync)
    assert result.get() == "s1"
    assert ran == ["sync:s1"]
    # the other task's windows did not run: the due one is left due for a dispatcher,
    # the pending one stays pending
    assert [w.task_id for w in debounce_windows(app, other)] == [pending_other.id]
    left = {w.task_id: w.state for w in list_windows(app)}
    assert left[due_other.id] == "dispatching" and _states(redis_client)[due_other.id] != "finished"
    assert [r.get() for r in run_windows(app, other)] == ["o-due", "o-pending"]
    assert sorted(ran) == ["other:o-due", "other:o-pending", "sync:s1"]


def test_the_fakeredis_fixture_leaves_the_app_as_it_found_it() -> None:
    bare = Celery("bare", set_as_current=False)
    bare.conf.broker_url = "memory://"
    configured = Celery("configured", set_as_current=False)
    configured.conf.update(broker_url="memory://", debounce_redis_url="redis://h:1/0")
    before = {"url": configured.conf.debounce_redis_url}
    from celery_debounce.settings import settings_for

    settings = settings_for(configured)  # cached before the test
    fixture = fakeredis_fixture()
    use = next(fixture)
    use(bare)
    use(configured)
    use(bare)  # twice: still restored to what the test found
    assert bare.conf.debounce_redis_url == PLACEHOLDER_URL
    assert bare._debounce_store is not None
    with pytest.raises(StopIteration):
        next(fixture)
    assert bare.conf.get("debounce_redis_url") is None
    assert "debounce_redis_url" not in bare.conf.changes
    assert not hasattr(bare, "_debounce_settings") and not hasattr(bare, "_debounce_store")
    assert configured.conf.debounce_redis_url == before["url"]
    assert configured._debounce_settings is settings
    assert not hasattr(configured, "_debounce_store")


PROBE = """
import sys

def test_nothing_imported(debounce_probe_modules):
    assert debounce_probe_modules == []

def test_fixture_works(debounce_fakeredis):
    from celery import Celery
    app = Celery("probe", set_as_current=False)
    app.conf.broker_url = "memory://"
    debounce_fakeredis(app)
"""

CONFTEST = """
import sys
import pytest

@pytest.fixture
def debounce_probe_modules():
    return [m for m in ("celery", "celery_debounce", "kombu", "redis") if m in sys.modules]
"""


def test_the_plugin_imports_nothing_until_its_fixture_is_used(tmp_path: Path) -> None:
    code = (
        "import sys, celery_debounce_pytest; "
        "print(sorted(m for m in ('celery', 'kombu', 'redis', 'celery_debounce') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    # in a real pytest run that loads the plugin from its entry point
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE))
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            "/dev/null",
            "--rootdir",
            str(tmp_path),
            "-k",
            "nothing_imported",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "1 passed" in run.stdout, run.stdout + run.stderr
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            "/dev/null",
            "--rootdir",
            str(tmp_path),
            "-k",
            "fixture_works",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "1 passed" in run.stdout, run.stdout + run.stderr


def test_helpers_find_windows_of_a_non_ascii_task_name(app_factory: Any) -> None:
    """An ident's length prefix counts UTF-8 bytes (owner: store/keys.py's ident_prefix);
    the helpers filter by task with the same prefix, so a non-ASCII name is found."""
    app = app_factory()
    ran: list[str] = []

    @debounced(
        app,
        name="tâches.résumé",
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{0}",
    )
    def resume(key: str) -> str:
        ran.append(key)
        return key

    resume.delay("k")
    windows = debounce_windows(app, resume)
    assert [(w.task, w.key, w.calls) for w in windows] == [("tâches.résumé", "k", 1)]
    run_windows(app, "tâches.résumé")
    assert ran == ["k"]


def test_use_fakeredis_takes_an_app_whose_windows_are_in_postgresql() -> None:
    """Finding 10: nothing connects to the configured PostgreSQL server."""
    from celery import Celery

    from celery_debounce.testing import debounce_windows, use_fakeredis

    app = Celery("pg_fake", broker="memory://", set_as_current=False)
    app.conf.debounce_store_url = "postgresql://u@127.0.0.1:1/db"

    @debounced(app, debounce=1, debounce_max_wait=5, shared=False, name="pg.t")
    def t(a: int) -> None: ...

    use_fakeredis(app)
    first = t.delay(1)
    assert t.delay(1).id == first.id
    (window,) = debounce_windows(app)
    assert (window.task_id, window.calls) == (first.id, 2)
