"""debounce_exclusive through every way in: the window's stored options carry the header
take.lua looks for, and the combinations that cannot wait are refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import group
from helpers import make_app

from celery_debounce import DebounceConfigError, DebouncedTask, enqueue_many, send_task
from celery_debounce.layout import window_ident


def _exclusive(client: redis.Redis, task: str, key: str) -> bool:
    options = client.hget(f"debounce:{{0}}:open:{window_ident(task, key)}", "o") or b""
    return b'"debounce_exclusive"' in options


def test_every_way_in_marks_an_exclusive_window(redis_server: str,
                                                redis_client: redis.Redis) -> None:
    app = make_app(redis_server)

    @app.task(base=DebouncedTask, shared=False, name="ex.plain", debounce="1h",
              debounce_max_wait="2h", debounce_key="k:{0}", debounce_exclusive=True)
    def plain(x: Any) -> Any:
        return x

    @app.task(base=DebouncedTask, shared=False, name="ex.collect", debounce="1h",
              debounce_max_wait="2h", debounce_key="k:{0}", debounce_collect=True,
              debounce_exclusive=True)
    def collect(calls: Any) -> Any:
        return calls

    @app.task(base=DebouncedTask, shared=False, name="ex.off", debounce="1h",
              debounce_max_wait="2h", debounce_key="k:{0}")
    def off(x: Any) -> Any:
        return x

    plain.delay("delay")
    plain.apply_async(("replace",), debounce_replace_payload=True)
    collect.delay("collect")
    enqueue_many(plain, [(("bulk",), {}), (("bulk",), {})])
    group(plain.s("canvas"), plain.s("canvas-2")).apply_async()
    send_task(app, "ex.byname", args=("n",), debounce="1h", debounce_max_wait="2h",
              debounce_key="k:{0}", debounce_exclusive=True)
    off.apply_async(("per-call",), debounce_exclusive=True)
    off.delay("not")
    off.apply_async(("joined",))
    off.apply_async(("joined",), debounce_exclusive=True)  # a joiner cannot change it
    for task, key in [("ex.plain", "k:delay"), ("ex.plain", "k:replace"),
                      ("ex.collect", "k:collect"), ("ex.plain", "k:bulk"),
                      ("ex.plain", "k:canvas"), ("ex.plain", "k:canvas-2"),
                      ("ex.byname", "k:n"), ("ex.off", "k:per-call")]:
        assert _exclusive(redis_client, task, key), (task, key)
    assert not _exclusive(redis_client, "ex.off", "k:not")
    assert not _exclusive(redis_client, "ex.off", "k:joined")


@pytest.mark.parametrize("options", [
    {"debounce_leading": True}, {"debounce_max_calls": 5},
])
def test_exclusive_windows_that_cannot_wait_are_refused_by_name(
        redis_server: str, options: dict[str, Any]) -> None:
    app = make_app(redis_server)
    with pytest.raises(DebounceConfigError, match="debounce_exclusive=True with"):
        @app.task(base=DebouncedTask, shared=False, name="ex.refused", debounce="1h",
                  debounce_max_wait="2h", debounce_exclusive=True, lazy=False, **options)
        def refused(x: Any) -> Any:
            return x

    @app.task(base=DebouncedTask, shared=False, name="ex.ok", debounce="1h",
              debounce_max_wait="2h")
    def ok(x: Any) -> Any:
        return x

    with pytest.raises(DebounceConfigError, match="debounce_exclusive=True with"):
        ok.apply_async((1,), debounce_exclusive=True, **options)
    with pytest.raises(DebounceConfigError, match="debounce_exclusive='yes'"):
        ok.apply_async((1,), debounce_exclusive="yes")
