"""The dispatcher's outcome -> action table (celery_debounce/dispatch/outcomes.py),
no server needed."""

from __future__ import annotations

from pathlib import Path

from celery_debounce.dispatch.outcomes import (
    ACTIONS,
    FAILURE_KINDS,
    Action,
    Outcome,
    Outcomes,
    release_after,
)
from celery_debounce.store import TakenWindow
from celery_debounce.store.records import Record

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def _window(task_id: str, tries: int = 1, failures: int = 0) -> TakenWindow:
    record = Record(
        task_id=task_id,
        ident="1:t:k",
        first_seen_ms=0,
        deadline_ms=0,
        max_wait_ms=0,
        calls=1,
        content_type="application/json",
        payload=b"[[], {}, {}]",
        options_json="{}",
        tries=tries,
    )
    return TakenWindow(shard=0, record=record, taken_ms=0, failures=failures)


def test_every_outcome_has_one_action_but_the_suspect_which_is_settled_first() -> None:
    assert set(ACTIONS) == set(Outcome) - {Outcome.SUSPECT}
    assert set(FAILURE_KINDS) <= set(ACTIONS)
    assert ACTIONS[Outcome.SENT] is Action.ACK
    assert ACTIONS[Outcome.BAD] is Action.QUARANTINE


def test_release_delays() -> None:
    lease, soon = 10_000, 1000
    assert release_after(Action.SOON, _window("a"), lease, soon) == 1000
    assert release_after(Action.LEASE, _window("a"), lease, soon) == lease
    assert release_after(Action.RETRY, _window("a", failures=2), lease, soon) == 2000
    assert release_after(Action.RETRY, _window("a", failures=9), lease, soon) == lease
    assert release_after(Action.BACK_OFF, _window("a", tries=3), lease, soon) == 2000


def test_a_suspect_is_failed_only_when_another_window_of_the_take_was_sent() -> None:
    alone = Outcomes()
    alone.add(_window("s"), Outcome.SUSPECT, "NOPERM")
    alone.settle()
    assert alone.windows(Outcome.HELD) == [_window("s")] and not alone.has(Outcome.FAILED)
    beside = Outcomes()
    beside.add(_window("f"), Outcome.FAILED, "x")
    beside.add(_window("s"), Outcome.SUSPECT, "NOPERM")
    beside.add(_window("ok"), Outcome.SENT)
    beside.settle()
    assert beside.reasons(Outcome.FAILED) == [(_window("f"), "x"), (_window("s"), "NOPERM")]
    assert not beside.has(Outcome.SUSPECT) and not beside.has(Outcome.HELD)


def test_the_design_page_lists_every_outcome() -> None:
    text = DESIGN.read_text("utf-8")
    table = text[text.index("### Dispatcher outcomes") : text.index("### Maxmemory")]
    assert sorted(o.name for o in Outcome if f"| `{o.name}` |" not in table) == []
