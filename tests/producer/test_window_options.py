"""The opener's options are the window's (issue 19, item 4).

With ``debounce_replace_payload=True`` a joiner replaces the arguments, nothing
else: the window's link/link_error/chain/chord (the protocol-2 embed) and its
serializer stay the opener's. ``gate.lua`` splices a replacing JSON call's
``[args, kwargs`` before the window's embed; another content type is replaced
whole only when the call's embed is the window's, else the call is refused with
nothing written.
"""

from __future__ import annotations

import json
import pickle
import time
from typing import Any

import pytest
import redis
from celery import Celery
from helpers import StoreCase, debounced, running_worker, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reads import open_payload

from celery_debounce.errors import DebounceConfigError
from celery_debounce.store.idents import window_ident
from celery_debounce.testing import clear_windows

pytestmark = pytest.mark.usefixtures("store")

TAG = "debounce:{0}"


def _record(client: redis.Redis, task: Any, key: str) -> dict[bytes, bytes]:
    """Redis only: the whole hash, each field (an embed too) or its absence."""
    return client.hgetall(f"{TAG}:open:{window_ident(task.name, key)}")  # type: ignore[return-value]


def _body(app: Celery, task: Any, key: str) -> bytes:
    """The payload of the open window of (task, key), read through the store."""
    record = open_payload(app, task.name, key)
    assert record is not None and record.payload is not None
    return record.payload


def _tasks(app: Celery, seen: dict[str, Any], **opts: Any) -> tuple[Any, Any, Any]:
    @debounced(
        app,
        name="wo.t",
        debounce="300ms",
        debounce_max_wait="5s",
        debounce_key="k",
        debounce_replace_payload=True,
        **opts,
    )
    def t(x: Any) -> Any:
        return x

    @app.task(shared=False, name="wo.opener_cb")
    def opener_cb(x: Any) -> Any:
        seen.setdefault("opener_cb", []).append(x)

    @app.task(shared=False, name="wo.joiner_cb")
    def joiner_cb(x: Any) -> Any:
        seen.setdefault("joiner_cb", []).append(x)

    return t, opener_cb, joiner_cb


def test_a_replacing_joiner_replaces_the_arguments_not_the_openers_link(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """On a real worker: the run gets the newest arguments and the opener's link runs;
    the joiners' link and link_error do not (before: the last joiner's replaced them)."""
    app = app_factory()
    seen: dict[str, Any] = {}
    t, opener_cb, joiner_cb = _tasks(app, seen)
    first = t.apply_async(("a",), link=opener_cb.s())
    t.apply_async(("b",), link=joiner_cb.s(), link_error=joiner_cb.si("err"))
    t.apply_async(({'}]"\\': ", {}]"},), link=joiner_cb.s())
    body = json.loads(_body(app, t, "k"))
    assert body[0] == [{'}]"\\': ", {}]"}] and body[1] == {}
    assert body[2] == {"callbacks": [json.loads(json.dumps(dict(opener_cb.s())))]}
    with running_worker(app):
        assert first.get(timeout=10) == {'}]"\\': ", {}]"}
        wait_until(lambda: "opener_cb" in seen)
    assert seen == {"opener_cb": [{'}]"\\': ", {}]"}]}


@pytest.mark.parametrize(
    "args",
    [
        ("plain",),
        ("}", "{", "]", "["),
        ('"', "\\", '\\"', '\\\\"}'),
        ({"callbacks": [1], "x": {"errbacks": {}}},),
        ([[[{}]]], {}, "{}]"),
        ("é ü 中 \u2028",),
    ],
)
@pytest.mark.parametrize("opener_embed", ["none", "link", "both"])
@pytest.mark.parametrize("joiner_embed", ["none", "link", "both"])
def test_the_spliced_body_is_the_joiners_arguments_and_the_openers_embed(
    app_factory: Any,
    redis_client: redis.Redis,
    args: tuple[Any, ...],
    opener_embed: str,
    joiner_embed: str,
) -> None:
    """Strings full of brackets, quotes and backslashes, in the opener's and the
    joiner's arguments, around every embed shape: the stored body parses to exactly
    ``[joiner's args, joiner's kwargs, opener's embed]``."""
    app = app_factory()
    seen: dict[str, Any] = {}

    @debounced(
        app,
        name="wo.v",
        debounce="5s",
        debounce_max_wait="10s",
        debounce_key="k",
        debounce_replace_payload=True,
    )
    def v(*a: Any, **kw: Any) -> Any:
        return a

    _, opener_cb, joiner_cb = _tasks(app, seen)

    def links(kind: str, cb: Any) -> dict[str, Any]:
        return {
            "none": {},
            "link": {"link": cb.s()},
            "both": {"link": cb.s(), "link_error": [cb.si(1), cb.si('"}]')]},
        }[kind]

    v.apply_async(("}]", {"a": '"'}), {"o": "]"}, **links(opener_embed, opener_cb))
    opener = json.loads(_body(app, v, "k"))
    v.apply_async(args, {"k": "}\\"}, **links(joiner_embed, joiner_cb))
    body = json.loads(_body(app, v, "k"))
    assert body == [list(args), {"k": "}\\"}, opener[2]]


def test_a_joiner_of_another_serializer_is_refused_and_writes_nothing(
    app_factory: Any,
    redis_client: redis.Redis,
    store: StoreCase,
) -> None:
    """A window's content type is its opener's: a replacing joiner with serializer=
    of another type is refused (DebounceConfigError naming both), nothing written,
    and the window runs with the opener's message."""
    app = app_factory(accept_content=["json", "pickle"])
    seen: dict[str, Any] = {}
    t, _, _ = _tasks(app, seen)
    first = t.delay("a")
    before = open_payload(app, t.name, "k")
    with pytest.raises(DebounceConfigError, match=r"application/json.*x-python-serialize"):
        t.apply_async(("b",), serializer="pickle")
    assert open_payload(app, t.name, "k") == before
    t.delay("c")  # a joiner of the window's serializer still replaces
    assert json.loads(_body(app, t, "k"))[0] == ["c"]
    if store.name == "redis":
        assert b"ct" not in _record(redis_client, t, "k")  # Redis only: the field left out
    with running_worker(app):
        assert first.get(timeout=10) == "c"


def test_a_pickle_window_keeps_its_embed_or_refuses_a_joiner_that_would_change_it(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """A body Lua cannot read: replaced whole when the joiner's embed is the window's
    (stored as e by the opener), refused with nothing written when it is not."""
    app = app_factory(task_serializer="pickle", accept_content=["json", "pickle"])
    seen: dict[str, Any] = {}
    t, opener_cb, joiner_cb = _tasks(app, seen)
    first = t.apply_async(("a",), link=opener_cb.s())
    t.apply_async(("b",), link=opener_cb.s())  # the same link: replaced
    assert pickle.loads(_body(app, t, "k"))[0] == ("b",)
    before = open_payload(app, t.name, "k")
    with pytest.raises(DebounceConfigError, match=r"link/link_error/chain/chord"):
        t.apply_async(("c",), link=joiner_cb.s())
    with pytest.raises(DebounceConfigError, match=r"link/link_error/chain/chord"):
        t.delay("d")  # no link: the opener's would be lost
    assert open_payload(app, t.name, "k") == before
    with running_worker(app):
        assert first.get(timeout=10) == "b"
        wait_until(lambda: "opener_cb" in seen)
    assert seen == {"opener_cb": ["b"]}


@pytest.mark.redis_only("plants records as an older release wrote them in Redis")
def test_windows_written_by_0_2_still_dispatch_and_keep_their_embed(
    app_factory: Any,
    redis_client: redis.Redis,
) -> None:
    """Rolling upgrade: a record as 0.2 wrote it (JSON: no new field, the embed inside
    p; pickle: no e) still runs; a replacing join keeps a JSON record's embed, and
    replaces a pickle record's body whole, as 0.2 did (its embed was never stored)."""
    app = app_factory(accept_content=["json", "pickle"])
    seen: dict[str, Any] = {}
    t, opener_cb, joiner_cb = _tasks(app, seen)
    cb = json.loads(json.dumps(dict(opener_cb.s())))
    now = int(time.time() * 1000)
    legacy = {
        "id": "legacy-json",
        "fs": now,
        "mw": 60_000,
        "n": 1,
        "p": json.dumps([["a"], {}, {"callbacks": [cb]}]),
    }
    ident = window_ident(t.name, "k")
    # Redis only: records as an older release wrote them
    redis_client.hset(f"{TAG}:open:{ident}", mapping=legacy)  # type: ignore[arg-type]
    redis_client.zadd(f"{TAG}:due", {ident: now + 300})
    t.apply_async(("b",), link=joiner_cb.s())
    body = json.loads(_body(app, t, "k"))
    assert body == [["b"], {}, {"callbacks": [cb]}]
    with running_worker(app):
        assert app.AsyncResult("legacy-json").get(timeout=10) == "b"
        wait_until(lambda: "opener_cb" in seen)
    assert seen == {"opener_cb": ["b"]}
    # Redis only: records as an older release wrote them
    redis_client.hset(
        f"{TAG}:open:{ident}",
        mapping={  # type: ignore[arg-type]
            "id": "legacy-pickle",
            "fs": now,
            "mw": 60_000,
            "n": 1,
            "ct": "application/x-python-serialize",
            "p": pickle.dumps((("a",), {}, {})),
        },
    )
    redis_client.zadd(f"{TAG}:due", {ident: now + 60_000})
    t.apply_async(("c",), serializer="pickle")
    assert pickle.loads(_body(app, t, "k"))[0] == ("c",)
    redis_client.hset(
        f"{TAG}:open:{ident}",
        mapping={  # type: ignore[arg-type]
            "id": "legacy-ct",
            "fs": now,
            "mw": 60_000,
            "n": 1,
            "ct": "application/json",
            "p": json.dumps([["a"], {}, {"callbacks": [cb]}]),
        },
    )
    t.apply_async(("d",), link=joiner_cb.s())  # the default type spelt out is the same
    assert json.loads(_body(app, t, "k")) == [["d"], {}, {"callbacks": [cb]}]


@pytest.mark.redis_only("the windows go to fakeredis whatever the app's store")
def test_the_splice_runs_on_fakeredis_too(app_factory: Any) -> None:
    """Users' tests run gate.lua on fakeredis (celery_debounce.testing): same bodies."""
    from celery_debounce.testing import use_fakeredis

    app = app_factory(accept_content=["json", "pickle"])
    seen: dict[str, Any] = {}
    t, opener_cb, joiner_cb = _tasks(app, seen)
    fake = use_fakeredis(app)
    t.apply_async(("a",), link=opener_cb.s())
    t.apply_async(({'}"\\': "]"},), link=joiner_cb.s())
    body = json.loads(fake.hget(f"{TAG}:open:{window_ident(t.name, 'k')}", "p"))
    assert body == [
        [{'}"\\': "]"}],
        {},
        {"callbacks": [json.loads(json.dumps(dict(opener_cb.s())))]},
    ]
    with pytest.raises(DebounceConfigError, match="content type"):
        t.apply_async(("b",), serializer="pickle")


_TEXT = st.text(alphabet=st.sampled_from(list('{}[]",:\\ ab\u00e9\u4e2d\n')), max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(opener=_JSON, joiner=_JSON, opener_links=st.integers(0, 2), joiner_links=st.integers(0, 2))
def test_any_json_arguments_splice_before_the_openers_embed(
    app_factory: Any,
    redis_client: redis.Redis,
    opener: Any,
    joiner: Any,
    opener_links: int,
    joiner_links: int,
) -> None:
    """Hypothesis: any JSON arguments (strings of brackets, quotes, backslashes,
    escapes) of the opener and a replacing joiner, each with 0 to 2 links: the body
    is the joiner's arguments and the opener's embed."""
    app = app_factory()
    clear_windows(app)  # each example from empty windows

    @debounced(
        app,
        name="wo.h",
        debounce="1m",
        debounce_max_wait="2m",
        debounce_key="k",
        debounce_replace_payload=True,
    )
    def h(x: Any) -> Any:
        return x

    def links(n: int, tag: Any) -> dict[str, Any]:
        return {"link": [h.si(tag)] * n} if n else {}

    h.apply_async((opener,), **links(opener_links, opener))
    want = json.loads(_body(app, h, "k"))[2]
    h.apply_async((joiner,), **links(joiner_links, joiner))
    assert json.loads(_body(app, h, "k")) == [[joiner], {}, want]
