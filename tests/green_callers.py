"""Debounced calls from greenlets under gevent or eventlet, patched after celery_debounce
was imported and had made a call (its connection kept), as gunicorn ``--preload`` does.

``python green_callers.py <gevent|eventlet|none> <warm|cold|first> <redis url>
[greenlets] [calls] [--store=<postgresql url>]`` (``warm``: one call before patching,
so a connection with a stdlib socket is kept; ``cold``: the package imported only;
``first``: patched before any import; ``--store``: the windows in PostgreSQL) prints
one JSON list, ``[key, window id or null, error or null]`` per call.
:func:`assert_each_call_got_its_window` checks such a list against the store
(tests/worker/test_gevent.py, tests/worker/test_concurrency_models.py).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

if "--no-hiredis" in sys.argv:  # redis-py's parser then reads without select.poll
    sys.modules["hiredis"] = None  # type: ignore[assignment]
if __name__ == "__main__" and sys.argv[2:3] == ["first"]:  # as ``celery -P gevent`` does
    if sys.argv[1] == "gevent":
        from gevent import monkey

        monkey.patch_all()
    elif sys.argv[1] == "eventlet":
        import eventlet

        eventlet.monkey_patch()

from celery import Celery

from celery_debounce import DebouncedTask
from celery_debounce.ops.read_view import list_windows


def build(url: str, **conf: Any) -> Celery:
    """The callers' app on the Redis at ``url`` (``conf``: other settings, such as a
    store's, ``StoreCase.conf``)."""
    app = Celery("green", set_as_current=False)
    app.conf.update(broker_url=f"{url}/1", debounce_redis_url=f"{url}/0", task_ignore_result=True)
    app.conf.update(conf)

    @app.task(
        name="green.debounced",
        base=DebouncedTask,
        shared=False,
        debounce="1h",
        debounce_max_wait="2h",
        debounce_key="{key}",
    )
    def debounced(key: str) -> None:
        return None

    return app


def assert_each_call_got_its_window(
    redis_server: str,
    results: list[list[Any]],
    others: tuple[str, ...] = (),
    conf: dict[str, Any] | None = None,
) -> None:
    """No call failed; each returned its own key's open window id; each window counts
    exactly the calls that returned it (``others``: keys called outside ``results``;
    ``conf``: the app's other settings, as given to :func:`build`)."""
    failed = Counter(error.split(":")[0] for _, _, error in results if error)
    assert not failed, f"{sum(failed.values())} of {len(results)} calls raised: {failed}"
    windows = {
        w.key: w for w in list_windows(build(redis_server, **(conf or {}))) if w.key not in others
    }
    returned = Counter(key for key, _, _ in results)
    wrong = [
        (key, wid) for key, wid, _ in results if key not in windows or windows[key].task_id != wid
    ]
    assert not wrong, f"{len(wrong)} calls got another window's id: {wrong[:5]}"
    stored = {key: w.calls for key, w in windows.items()}
    assert stored == dict(returned), "the store holds other calls than those that returned"


def key_of(i: int, j: int) -> str:
    """Half the calls on a greenlet's own key, half on one of three shared keys."""
    return f"own{i}" if j % 2 else f"shared{(i + j) % 3}"


def main(argv: list[str]) -> int:
    # --store=<postgresql url>: the windows in PostgreSQL (Redis stays the broker)
    stores = [a.split("=", 1)[1] for a in argv if a.startswith("--store=")]
    argv = [a for a in argv if a != "--no-hiredis" and not a.startswith("--store=")]
    model, warm, patch, url = argv[0], argv[1] == "warm", argv[1] != "first", argv[2]
    greenlets = int(argv[3]) if len(argv) > 3 else 30
    calls = int(argv[4]) if len(argv) > 4 else 20
    conf = {"debounce_store_url": stores[0], "debounce_redis_url": None} if stores else {}
    task = build(url, **conf).tasks["green.debounced"]
    results: list[list[Any]] = [["warm", task.delay("warm").id, None]] if warm else []

    def caller(i: int) -> None:
        for j in range(calls):
            key = key_of(i, j)
            try:
                results.append([key, task.delay(key).id, None])
            except Exception as exc:  # every failure is reported
                results.append([key, None, f"{type(exc).__module__}.{type(exc).__name__}: {exc}"])

    if model == "gevent":
        from gevent import monkey

        if patch:
            monkey.patch_all()
        import gevent

        def run() -> None:
            gevent.joinall([gevent.spawn(caller, i) for i in range(greenlets)])
    elif model == "eventlet":
        import eventlet

        if patch:
            eventlet.monkey_patch()
        pool = eventlet.GreenPool(greenlets)

        def run() -> None:
            for i in range(greenlets):
                pool.spawn(caller, i)
            pool.waitall()
    else:

        def run() -> None:
            for i in range(greenlets):
                caller(i)

    if warm:  # the kept connection (a stdlib socket) reconnects, now on a patched one
        import redis

        redis.Redis.from_url(f"{url}/0").client_kill_filter(_type="normal", skipme=True)
    run()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
