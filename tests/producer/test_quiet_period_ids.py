"""Every id resolves: a leading-only quiet period never outlasts ``result_expires``
(issue 19, item 5).

A call a leading-only quiet period suppresses returns the leading run's id. The
quiet period lasts up to ``debounce_max_wait``; the leading run's result expires
``result_expires`` after it is stored. Decision: the quiet period's ceiling is
``min(debounce_max_wait, result_expires)`` (the producer's ``result_expires``), so
every id a suppressed call returns names a result that is still stored when the
call returns; the next call after that ceiling leads again.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from helpers import debounced, make_app, running_worker

from celery_debounce.store.idents import window_ident

TAG = "debounce:{0}"


def test_a_suppressed_call_never_gets_the_id_of_an_expired_result(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    """result_expires=2 s, a leading-only task with a 20 s window and a 1 min max
    wait, a call every 0.25 s for 5 s: every call's id resolves right after the call
    (before: after 2 s the suppressed calls got the first run's id, whose result
    had expired: .get() waited forever); a new leading run about every 2 s."""
    app = make_app(redis_server, result_expires=2)
    runs: list[int] = []

    @debounced(
        app,
        name="quiet.digest",
        debounce="20s",
        debounce_max_wait="1m",
        debounce_key="{0}",
        debounce_leading=True,
        debounce_trailing=False,
    )
    def digest(user: str, i: int) -> int:
        runs.append(i)
        return i

    with running_worker(app):
        ids = set()
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < 5:
            result = digest.delay("u1", i)
            ids.add(result.id)
            assert result.get(timeout=5) in runs  # resolves, to the run that carries it
            i += 1
            time.sleep(0.25)
        assert 2 <= len(ids) <= 4 and len(runs) == len(ids)
        digest.delay("u1", i)  # in a quiet period now (a loaded machine may have let it end)
        # read before the worker stops: its shutdown may outlast the 2 s quiet period
        # Redis only: no store read returns a quiet period\'s max wait
        quiet = redis_client.hgetall(f"{TAG}:quiet:{window_ident(digest.name, 'u1')}")
    assert int(quiet[b"mw"]) == 2000  # the ceiling: result_expires, not max wait


def test_result_expires_above_max_wait_or_never_leaves_the_quiet_period_alone(
    redis_server: str,
    redis_client: redis.Redis,
) -> None:
    for expires in (None, 0, 3600):
        # Redis only: set-up
        redis_client.flushall()
        app = make_app(redis_server, result_expires=expires)

        @debounced(
            app,
            name="quiet.t",
            debounce="20s",
            debounce_max_wait="1m",
            debounce_key="{0}",
            debounce_leading=True,
            debounce_trailing=False,
        )
        def t(user: str) -> None: ...

        @debounced(
            app,
            name="quiet.both",
            debounce="20s",
            debounce_max_wait="2h",
            debounce_key="{0}",
            debounce_leading=True,
            debounce_trailing=True,
        )
        def both(user: str) -> None: ...

        t.delay("u")
        both.delay("u")  # both edges: suppressed calls join a trailing window, no cap
        for task, mw in ((t, 60_000), (both, 7_200_000)):
            # Redis only: no store read returns a quiet period\'s max wait
            quiet: Any = redis_client.hgetall(f"{TAG}:quiet:{window_ident(task.name, 'u')}")
            assert int(quiet[b"mw"]) == mw, (expires, task.name)


def test_every_way_in_gets_the_ceiling(redis_server: str, redis_client: redis.Redis) -> None:
    """Per-call options on a trailing task, send_task by name, enqueue_many: a
    leading-only quiet period's max wait is min(max wait, result_expires) for each."""
    from celery_debounce import enqueue_many, send_task

    app = make_app(redis_server, result_expires=60)

    @debounced(
        app,
        name="quiet.plain",
        debounce="20s",
        debounce_max_wait="1h",
        debounce_key="{0}",
    )
    def plain(user: str) -> None: ...

    def mw(name: str, key: str) -> int:
        # Redis only: no store read returns a quiet period\'s max wait
        quiet: Any = redis_client.hgetall(f"{TAG}:quiet:{window_ident(name, key)}")
        return int(quiet[b"mw"])

    plain.apply_async(("a",), debounce_leading=True, debounce_trailing=False)
    assert mw(plain.name, "a") == 60_000
    send_task(
        app,
        "quiet.byname",
        args=("b",),
        debounce="20s",
        debounce_max_wait="2h",
        debounce_key="{0}",
        debounce_leading=True,
        debounce_trailing=False,
    )
    assert mw("quiet.byname", "b") == 60_000
    enqueue_many(
        plain, [(("c",), {}), (("c",), {})], debounce_leading=True, debounce_trailing=False
    )
    assert mw(plain.name, "c") == 60_000
