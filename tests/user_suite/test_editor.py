"""A user's tests of their debounced tasks, written with celery_debounce.testing.

Each test runs twice: windows in fakeredis, and in a real redis-server.
No test sleeps: windows are read from Redis and flushed on demand.
"""

from __future__ import annotations

from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_debounce.ops.read_view import list_windows
from celery_debounce.testing import (
    clear_windows,
    debounce_windows,
    flush_windows,
    run_windows,
)


def test_saves_of_one_document_coalesce_into_one_window(editor: Celery) -> None:
    reindex = editor.tasks["editor_app.reindex_document"]
    results = [reindex.delay("d1", revision=rev) for rev in range(5)]
    other = reindex.delay("d2", revision=9)

    windows = sorted(debounce_windows(editor, reindex), key=lambda w: w.key)
    assert [(w.key, w.calls) for w in windows] == [("doc:d1", 5), ("doc:d2", 1)]
    d1 = windows[0]
    assert (d1.args, d1.kwargs) == (("d1",), {"revision": 0})  # the opener's payload
    assert {r.id for r in results} == {d1.task_id}
    assert other.id == windows[1].task_id
    # each call pushed the deadline to its own time + 2s, under the 30s ceiling
    assert round(d1.deadline - d1.first_seen, 3) >= 2.0
    assert d1.deadline <= d1.max_wait_at
    assert round(d1.max_wait_at - d1.first_seen, 3) == 30.0


def test_replace_payload_keeps_the_latest_call(editor: Celery) -> None:
    report = editor.tasks["editor_app.rebuild_report"]
    for reason in ("comment", "edit", "rename"):
        report.delay(7, reason=reason)
    [window] = debounce_windows(editor, "editor_app.rebuild_report")
    assert window.kwargs == {"reason": "rename"} and window.args == (7,)
    assert window.calls == 3


def test_run_windows_runs_each_window_once_inline(editor: Celery) -> None:
    reindex = editor.tasks["editor_app.reindex_document"]
    report = editor.tasks["editor_app.rebuild_report"]
    ids = {reindex.delay("d1", revision=r).id for r in range(3)}
    report.delay(1, "edit")

    results = run_windows(editor, reindex)  # only this task's windows
    assert [(r.id, r.get()) for r in results] == [(ids.pop(), "indexed d1@0")]
    assert editor.indexed == [("d1", 0)]  # type: ignore[attr-defined]
    assert [w.task for w in debounce_windows(editor)] == ["editor_app.rebuild_report"]

    run_windows(editor)
    assert editor.reports == [(1, "edit")]  # type: ignore[attr-defined]
    assert debounce_windows(editor) == []
    assert list_windows(editor) == []  # claimed and finished, as a worker would
    assert run_windows(editor) == []  # nothing left to run


def test_flush_windows_publishes_now_to_a_worker(editor: Celery) -> None:
    report = editor.tasks["editor_app.rebuild_report"]  # a one-hour window
    with start_worker(editor, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        first = report.delay(3, "edit")
        assert report.delay(3, "rename").id == first.id
        assert flush_windows(editor) == [first.id]
        assert first.get(timeout=10) == "report 3 (rename)"
    assert editor.reports == [(3, "rename")]  # type: ignore[attr-defined]
    assert debounce_windows(editor) == []


def test_clear_windows_forgets_everything(editor: Celery) -> None:
    editor.tasks["editor_app.reindex_document"].delay("d1")
    assert clear_windows(editor) > 0
    assert debounce_windows(editor) == []
    assert run_windows(editor) == []
