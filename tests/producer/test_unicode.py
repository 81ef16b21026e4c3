"""Unicode task names and keys: Python and the Lua scripts agree on every length,
globs match characters, and a key that cannot be encoded is refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from helpers import debounced, make_app

from celery_debounce import DebounceKeyError
from celery_debounce.dispatch.dispatcher import Dispatcher
from celery_debounce.ops.admin import DebounceAdmin
from celery_debounce.ops.read_view import list_windows

# Latin with accents, CJK, emoji (4 UTF-8 bytes), right-to-left Arabic and Hebrew.
NAMES = ["tâche.é", "日本.タスク", "emoji.🚀🔥", "عربي.مهمة", "עברית"]
KEYS = ["é", "日本", "🙂", "مرحبا", "a\u200fb"]


@pytest.fixture
def uapp(redis_server: str, redis_client: redis.Redis) -> Iterator[Celery]:
    app = make_app(redis_server)

    def echo(k: str) -> str:
        return k

    for name in NAMES:
        debounced(
            app,
            name=name,
            debounce="1h",
            debounce_max_wait="2h",
            debounce_key="{0}",
        )(echo)
    yield app


def test_unicode_task_names_and_keys_agree_between_python_and_lua(uapp: Celery) -> None:
    admin = DebounceAdmin(uapp)
    ids = {}
    for name in NAMES:
        for key in KEYS:
            ids[name, key] = uapp.tasks[name].delay(key).id
    # inspect --task finds each task's windows, keys intact
    for name in NAMES:
        found = admin.windows(task=name)
        assert sorted(w.key for w in found) == sorted(KEYS), name
        assert {w.task for w in found} == {name}
    stats = admin.stats()  # must not raise UnicodeDecodeError
    assert {t: s.open for t, s in stats.tasks.items()} == {n: len(KEYS) for n in NAMES}
    # cancel files its counter under the whole name
    admin.cancel(NAMES[0], KEYS[0])
    # flush + take: counters under the whole name, every name
    assert admin.flush_all() == len(NAMES) * len(KEYS) - 1
    Dispatcher(uapp).dispatch_once()
    stats = admin.stats()
    assert {t: s.runs for t, s in stats.tasks.items() if s.runs} == {
        n: len(KEYS) - (n == NAMES[0]) for n in NAMES
    }
    assert stats.tasks[NAMES[0]].cancelled == 1
    assert {w.task_id for w in admin.windows(states=["queued"])} == set(ids.values()) - {
        ids[NAMES[0], KEYS[0]]
    }


@pytest.mark.parametrize(
    "glob, matches",
    [
        ("?", {"é", "🙂"}),
        ("??", {"日本"}),
        ("?????", {"مرحبا"}),
        ("*", set(KEYS)),
        ("a?b", {"a\u200fb"}),
        ("日*", {"日本"}),
        ("*本", {"日本"}),
    ],
)
def test_key_globs_match_characters_not_bytes(uapp: Celery, glob: str, matches: set[str]) -> None:
    for key in KEYS:
        uapp.tasks[NAMES[1]].delay(key)
    assert {w.key for w in list_windows(uapp, key_glob=glob)} == matches
    assert {w.key for w in list_windows(uapp, task=NAMES[1], key_glob=glob)} == matches


def test_a_key_with_a_lone_surrogate_is_a_key_error_and_writes_nothing(
    uapp: Celery, redis_client: redis.Redis
) -> None:
    with pytest.raises(DebounceKeyError, match="debounce_key"):
        uapp.tasks[NAMES[0]].delay("bad\ud800key")
    # Redis only: no key of any kind
    assert redis_client.keys("debounce:*") == []


def test_split_ident_reads_byte_lengths_and_idents_written_before_them() -> None:
    from celery_debounce.store.idents import split_ident, window_ident

    for name in NAMES:
        for key in [*KEYS, "a:b", ""]:
            ident = window_ident(name, key)
            assert ident.startswith(f"{len(name.encode())}:")
            assert split_ident(ident) == (name, key)
            assert split_ident(f"{len(name)}:{name}:{key}") == (name, key)  # older format
    with pytest.raises(ValueError):
        split_ident("3:ab")
