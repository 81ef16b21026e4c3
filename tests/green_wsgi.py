"""A WSGI app whose handler makes debounced calls, for ``gunicorn --preload -k gevent``:
the master imports it (and makes a call: a kept connection) before its workers fork and
patch. ``GET /<key>`` makes three calls of ``<key>`` and answers their window ids, one a
line (500 and the error when a call raises). tests/worker/test_gevent.py runs it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from green_callers import build

#: GREEN_STORE (a postgresql:// URL): the windows in PostgreSQL; Redis stays the broker
_store = os.environ.get("GREEN_STORE") or None
_conf = {"debounce_store_url": _store, "debounce_redis_url": None} if _store else {}
task = build(os.environ["GREEN_REDIS"], **_conf).tasks["green.debounced"]
task.delay("warm")


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    key = environ["PATH_INFO"].strip("/")
    try:
        body, status = "\n".join(task.delay(key).id for _ in range(3)), "200 OK"
    except Exception as exc:  # the test reports it
        body, status = f"{type(exc).__module__}.{type(exc).__name__}: {exc}", "500 Error"
    data = body.encode()
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(data)))])
    return [data]
