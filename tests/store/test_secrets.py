"""No secret in any error or log (issue 19, item 12).

A canary password, raw (with ``;``, ``/``, ``@`` and ``:`` in it, as people paste
them) and percent-encoded, goes through every settings error and every connection
failure: a Redis URL, a Sentinel URL, the broker's URL used as a fallback (Redis,
Sentinel, and an AMQP broker that is not a fallback at all), a Redis Cluster. Each
exception's text (and every exception it chains to, and its traceback) and every
log record captured must hold no part of it.
"""

from __future__ import annotations

import logging
import socket
import traceback
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from celery import Celery
from helpers import debounced, make_app

from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.redact import redact
from celery_debounce.settings import settings_for
from celery_debounce.store import store_for

#: Each part is checked on its own, so a password cut at ';', '/', '@' or ':' is caught.
PARTS = ("canaryA", "canaryB", "canaryC", "canaryD", "canaryE")
RAW = "AAcanaryA;BBcanaryB/CCcanaryC@DDcanaryD:EEcanaryE"
SECRETS = {
    "raw": RAW,
    "encoded": quote(RAW, safe=""),
    "semicolon": "AAcanaryA;BBcanaryB",
    "slash": "AAcanaryA/BBcanaryB",
    "at": "AAcanaryA@BBcanaryB",
}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _texts(exc: BaseException) -> list[str]:
    texts = ["".join(traceback.format_exception(exc))]
    seen: BaseException | None = exc
    while seen is not None:
        texts += [str(seen), repr(seen)]
        # what a traceback shows: the cause, or the context unless `from None` hid it
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return texts


def _leaks(texts: list[str]) -> list[str]:
    return [t for t in texts if any(p in t for p in PARTS)]


#: Every app here (make_app, results on the session's server): a short timeout, no
#: broker retry at start, and no debounce_redis_url unless the case sets one (a None
#: setting is an unset one: the windows' Redis is then the broker's, the fallback).
SECRETS_CONF = {
    "debounce_redis_url": None,
    "debounce_redis_timeout": 0.5,
    "broker_connection_retry_on_startup": False,
}


def _with_task(app: Celery) -> Celery:
    """``app`` with the task the steps call, ``secrets.t``."""

    @debounced(app, name="secrets.t", debounce="1s", debounce_max_wait="2s")
    def t(x: int) -> int:
        return x

    return app


def _use(app: Celery) -> None:
    """Everything that reads the settings or reaches the windows' Redis."""
    settings_for(app)
    store_for(app)
    app.tasks["secrets.t"].delay(1)


def _dispatch(app: Celery) -> None:
    Dispatcher(app).dispatch_once()


CASES: dict[str, Callable[[str, str, int], dict[str, Any]]] = {
    # -- settings errors
    "bad scheme": lambda pw, server, port: dict(debounce_redis_url=f"http://u:{pw}@h:1/0"),
    "bytes url": lambda pw, server, port: dict(debounce_redis_url=f"redis://:{pw}@h".encode()),
    "amqp broker, no debounce_redis_url": lambda pw, server, port: dict(
        broker_url=f"amqp://guest:{pw}@127.0.0.1:{port}//"
    ),
    "amqp failover broker list": lambda pw, server, port: dict(
        broker_url=f"amqp://u:{pw}@h1//;amqp://u:{pw}@h2//"
    ),
    "cluster on a unix url": lambda pw, server, port: dict(
        debounce_redis_url=f"unix://:{pw}@/tmp/none.sock", debounce_redis_cluster=True
    ),
    "sentinel without a master": lambda pw, server, port: dict(
        debounce_redis_url=f"sentinel://:{pw}@127.0.0.1:{port};sentinel://127.0.0.1:{port}"
    ),
    "sentinel with a query": lambda pw, server, port: dict(
        debounce_redis_url=f"sentinel://:{pw}@127.0.0.1:{port}?ssl=1",
        debounce_redis_sentinel_master="m",
    ),
    "sentinel bad port": lambda pw, server, port: dict(
        debounce_redis_url=f"sentinel://:{pw}@127.0.0.1:port", debounce_redis_sentinel_master="m"
    ),
    "sentinel bad db": lambda pw, server, port: dict(
        debounce_redis_url=f"sentinel://:{pw}@127.0.0.1:{port}/x",
        debounce_redis_sentinel_master="m",
    ),
    "sentinel master on a redis url": lambda pw, server, port: dict(
        debounce_redis_url=f"redis://:{pw}@127.0.0.1:{port}/0", debounce_redis_sentinel_master="m"
    ),
    "sentinel broker fallback without a master": lambda pw, server, port: dict(
        broker_url=f"sentinel://:{pw}@127.0.0.1:{port}"
    ),
    # -- connection failures
    "redis url, nothing listening": lambda pw, server, port: dict(
        debounce_redis_url=f"redis://:{pw}@127.0.0.1:{port}/0"
    ),
    "redis url, user and password": lambda pw, server, port: dict(
        debounce_redis_url=f"redis://user:{pw}@127.0.0.1:{port}/0"
    ),
    "redis url, wrong password": lambda pw, server, port: dict(
        debounce_redis_url=f"redis://nobody:{pw}@{server.split('://', 1)[1]}/0"
    ),
    "rediss url, nothing listening": lambda pw, server, port: dict(
        debounce_redis_url=f"rediss://:{pw}@127.0.0.1:{port}/0"
    ),
    "redis broker fallback, nothing listening": lambda pw, server, port: dict(
        broker_url=f"redis://:{pw}@127.0.0.1:{port}/1"
    ),
    "sentinel, nothing listening": lambda pw, server, port: dict(
        debounce_redis_url=f"sentinel://:{pw}@127.0.0.1:{port}", debounce_redis_sentinel_master="m"
    ),
    "sentinel broker fallback, nothing listening": lambda pw, server, port: dict(
        broker_url=f"sentinel://:{pw}@127.0.0.1:{port}",
        broker_transport_options={"master_name": "m"},
    ),
    "cluster, nothing listening": lambda pw, server, port: dict(
        debounce_redis_url=f"redis://:{pw}@127.0.0.1:{port}/0", debounce_redis_cluster=True
    ),
}


@pytest.mark.parametrize("secret", sorted(SECRETS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_password_in_any_error_or_log(
    redis_server: str,
    caplog: pytest.LogCaptureFixture,
    case: str,
    secret: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    conf = CASES[case](SECRETS[secret], redis_server, _closed_port())
    conf.setdefault("broker_url", f"redis://127.0.0.1:{_closed_port()}/1")
    texts: list[str] = []
    for step in (_use, _dispatch):
        app = _with_task(make_app(redis_server, "secrets", **{**SECRETS_CONF, **conf}))
        try:
            step(app)
        except Exception as exc:  # each step must fail: a bad setting or no server
            texts += _texts(exc)
        else:
            pytest.fail(f"{case}: {step.__name__} did not fail")
    texts += [r.getMessage() for r in caplog.records]
    texts += [logging.Formatter().format(r) for r in caplog.records]
    assert not _leaks(texts), _leaks(texts)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{RAW}@h:6379/0",
        f"redis://user:{RAW}@h:6379/0",
        f"rediss://{RAW}@h",
        f"sentinel://:{RAW}@h1:26379;sentinel://h2:26379;sentinel://:{RAW}@h3",
        f"amqp://guest:{RAW}@rabbit:5672//",
        f"'redis://:{RAW}@h:1/0' and \"amqp://u:{RAW}@r//\" in one text",
        f"postgresql://u:{RAW}@h:5432/db",
        f"postgresql://h/db?sslmode=require&password={RAW}",
        f"postgres://h/db?sslpassword={quote(RAW, safe='')}&application_name=x",
    ],
)
def test_redact_hides_every_password_whole(url: str) -> None:
    shown = redact(url)
    assert not any(p in shown for p in PARTS), shown
    assert "***" in shown and ("h" in shown or "rabbit" in shown)


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_no_password_when_the_broker_refuses_the_dispatcher(
    redis_server: str,
    redis_client: Any,
    caplog: pytest.LogCaptureFixture,
    secret: str,
) -> None:
    """The windows' Redis is up, the broker (AMQP with confirms, or Redis) is not: the
    dispatcher's publish fails and logs; no part of the broker's password in any of it."""
    import time

    caplog.set_level(logging.DEBUG)
    pw = SECRETS[secret]
    texts: list[str] = []
    for broker in (
        f"amqp://guest:{pw}@127.0.0.1:{_closed_port()}//",
        f"redis://:{pw}@127.0.0.1:{_closed_port()}/1",
    ):
        redis_client.flushall()
        conf = dict(
            broker_url=broker,
            debounce_redis_url=f"{redis_server}/0",
            broker_connection_timeout=0.5,
            broker_connection_max_retries=0,
        )
        app = _with_task(make_app(redis_server, "secrets", **{**SECRETS_CONF, **conf}))
        app.tasks["secrets.t"].apply_async((1,), debounce="1ms", debounce_max_wait="1ms")
        time.sleep(0.05)
        try:
            Dispatcher(app).dispatch_once()
        except Exception as exc:
            texts += _texts(exc)
    assert caplog.records  # the failed publish was logged
    texts += [logging.Formatter().format(r) for r in caplog.records]
    assert not _leaks(texts), _leaks(texts)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{quote(RAW, safe='')}@127.0.0.1:1/db",
        f"postgresql://127.0.0.1:1/db?password={quote(RAW, safe='')}",
    ],
)
def test_no_password_when_a_postgresql_store_url_is_refused(url: str) -> None:
    """The errors that quote ``debounce_store_url`` (a Redis-only setting beside it, a
    second store) hide its password, in the user info or as a query parameter."""
    from celery import Celery

    from celery_debounce.errors import DebounceConfigError
    from celery_debounce.settings import Settings

    texts: list[str] = []
    for conf in ({"debounce_shards": 2}, {"debounce_redis_url": "redis://h:6379/0"}):
        app = Celery("secrets-pg", set_as_current=False)
        app.conf.update(broker_url="memory://", debounce_store_url=url, **conf)
        with pytest.raises(DebounceConfigError) as refused:
            Settings.from_app(app)
        texts += _texts(refused.value)
    assert all("127.0.0.1" in t for t in texts[:2]), texts
    assert not _leaks(texts), _leaks(texts)
