"""What ``celery events`` and Flower read of a debounced run: real Celery events
(``task-sent`` from the dispatcher, ``task-received`` from the worker) carry the
run's own arguments, truncated as Celery truncates a plain call's, and the worker
gets the calls absorbed in the ``debounce_calls`` header."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery
from helpers import debounced, running_worker, wait_until

pytestmark = pytest.mark.usefixtures("store")


def _listen(
    app: Celery, seen: list[dict[str, Any]], ready: threading.Event, stop: threading.Event
) -> None:
    """An ``app.events.Receiver``, as ``celery events --dump`` and Flower use."""

    def handle(event: dict[str, Any]) -> None:
        seen.append(event)
        if stop.is_set():
            recv.should_stop = True

    with app.connection_for_read() as conn:
        recv = app.events.Receiver(conn, handlers={"*": handle})
        ready.set()
        recv.capture(limit=None, timeout=None, wakeup=False)


def test_celery_events_show_a_debounced_runs_real_arguments(
    app_factory: Callable[..., Celery],
) -> None:
    app = app_factory(worker_send_task_events=True, task_send_sent_event=True)
    calls: list[Any] = []

    @debounced(
        app,
        name="ev.report",
        bind=True,
        debounce="300ms",
        debounce_max_wait="5s",
        debounce_key="{user}",
    )
    def report(self: Any, user: str, note: str = "", blob: str = "") -> str:
        calls.append(self.request.debounce_calls)
        return user

    seen: list[dict[str, Any]] = []
    ready, stop = threading.Event(), threading.Event()
    listener = threading.Thread(target=_listen, args=(app, seen, ready, stop), daemon=True)
    listener.start()
    assert ready.wait(10)
    try:
        first = report.delay("u42", note="first", blob="x" * 5000)
        for i in range(4):
            report.delay("u42", note=f"later {i}")
        with running_worker(app):
            assert first.get(timeout=20) == "u42"
            wait_until(
                lambda: any(e["type"] == "task-succeeded" and e["uuid"] == first.id for e in seen),
                timeout=20,
            )
    finally:
        stop.set()
        with app.events.default_dispatcher() as dispatcher:  # wakes the receiver
            dispatcher.send("worker-heartbeat")
        listener.join(10)

    by_type = {e["type"]: e for e in seen if e.get("uuid") == first.id}
    received, sent = by_type["task-received"], by_type["task-sent"]
    # The opener's arguments, as a plain call's would read (not "<debounced: 5 calls>")
    assert received["args"] == "['u42']" == sent["args"]
    assert received["kwargs"].startswith("{'note': 'first', 'blob': 'xxxx")
    assert len(received["kwargs"]) <= app.amqp.kwargsrepr_maxsize + 10  # truncated
    assert received["name"] == sent["name"] == "ev.report"
    assert calls == [5]  # the worker is told how many calls the run stands for
