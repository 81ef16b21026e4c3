"""``celery debounce doctor``: find, and with ``--repair`` fix, keys that break the
store's invariants (docs/operations.md, "Doctor").

Each check is one ``doctor_*.lua`` script per batch of keys that decides from the
state it reads, atomically: a window opening, taken, claimed or finishing meanwhile is
never a finding, and a repair applied twice changes nothing more.

Redis-only by design: its findings are Redis keys and the invariants of the Redis
layout (docs/design.md, "The store contract"), outside the role Protocols of
:mod:`celery_debounce.store.api`, so it takes the concrete
:class:`~celery_debounce.store.WindowStore` (and spells the layout's key fragments).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from ..store import WindowStore
from ..store.idents import split_ident
from ..store.records import as_text

#: Each check's name and what a finding of it means.
CHECKS: dict[str, str] = {
    "open_without_due": "open window with no due entry: no dispatcher would take it "
    "(repair: due now)",
    "claim_expired": "claim past its lease and the grace, not released: no dispatcher "
    "releases claims (repair: released as a dispatcher would)",
    "run_without_window": "run marker names a window that is gone or not running: the "
    "key's next window would be held (repair: marker deleted, a "
    "held window due now)",
    "claim_without_lease": "run marker names a claimed window without a claim lease: it "
    "could never lapse (repair: window stale, key freed)",
    "held_without_run": "held window with no run marker (repair: due now)",
    "held_without_window": "held entry with no open window (repair: entry removed)",
    "held_too_long": "window held longer than --held-after behind a run still queued or "
    "running: a run that long, or its message lost (never repaired: "
    "flush the held window once you know the run is gone)",
    "calls_without_window": "collect call list whose window is gone (repair: deleted)",
    "no_ttl": "record without a TTL that should expire (repair: TTL set)",
}

#: Claims whose lease passed this long ago are findings (a dispatcher releases 20 per
#: pass, so only a store no dispatcher serves keeps them longer).
DEFAULT_GRACE_MS = 30_000
#: A window held longer than this behind a live run is reported (an hour: longer than
#: the runs of most exclusive tasks; a lost message holds it for debounce_record_ttl).
DEFAULT_HELD_AFTER_MS = 3_600_000


@dataclass(frozen=True)
class Finding:
    check: str
    key: str
    task: str | None
    detail: str
    repaired: bool

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _task(ident: str) -> str | None:
    try:
        return split_ident(ident)[0] if ident else None
    except ValueError:
        return None


def diagnose(
    store: WindowStore,
    *,
    repair: bool = False,
    grace_ms: int = DEFAULT_GRACE_MS,
    held_after_ms: int = DEFAULT_HELD_AFTER_MS,
) -> list[Finding]:
    """Every finding on the store (one SCAN of its keys, then the checks per tag)."""
    kinds: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for key in store.doctor_keys():
        head, brace, rest = key.partition("}")
        if not brace or not rest.startswith(":"):
            continue
        kind, _, name = rest[1:].partition(":")
        kinds[head + brace][kind].append(name)
    found: list[Finding] = []
    calls: dict[str, list[str]] = {}
    for tag, by_kind in kinds.items():
        found += _check_tag(store, tag, by_kind, repair, grace_ms, held_after_ms)
        if by_kind.get("calls"):
            calls[tag] = by_kind["calls"]
    if calls:
        found += _check_calls(store, calls, repair)
    return found


def _check_tag(
    store: WindowStore,
    tag: str,
    by_kind: dict[str, list[str]],
    repair: bool,
    grace_ms: int,
    held_after_ms: int,
) -> list[Finding]:
    found: list[Finding] = []
    for raw in (
        store.doctor_step("open", tag, "due", by_kind.get("open", []), repair)
        if by_kind.get("open")
        else []
    ):
        ident = as_text(raw)
        found.append(Finding("open_without_due", f"{tag}:open:{ident}", _task(ident), "", repair))
    if "claims" in by_kind:
        for raw_id, state, raw_ident, expiry in store.doctor_step(
            "claims", tag, "claims", [], repair, grace_ms, 1000
        ):
            ident = as_text(raw_ident)
            found.append(
                Finding(
                    "claim_expired",
                    f"{tag}:win:{as_text(raw_id)}",
                    _task(ident),
                    f"state {as_text(state) or 'gone'}, lease ended at {int(expiry)} ms",
                    repair,
                )
            )
    idents = sorted(
        set(by_kind.get("run", [])) | (set(store.held_members(tag)) if "held" in by_kind else set())
    )
    if idents:
        for raw_ident, problem, runner in store.doctor_step(
            "runs", tag, "held", idents, repair, held_after_ms
        ):
            ident, check = as_text(raw_ident), as_text(problem)
            key = f"{tag}:run:{ident}" if check.startswith(("run", "claim")) else f"{tag}:held"
            found.append(
                Finding(
                    check,
                    key,
                    _task(ident),
                    f"runner {as_text(runner)}" if runner else f"ident {ident}",
                    repair and check != "held_too_long",
                )
            )
    pairs = [
        part
        for kind in ("win", "run", "quiet")
        for name in by_kind.get(kind, [])
        for part in (kind, name)
    ]
    if pairs:
        for kind, name, state, ident in store.doctor_step(
            "ttl", tag, "leased", pairs, repair, store.settings.record_ttl_ms
        ):
            detail = f"state {as_text(state)}" if state else ""
            found.append(
                Finding(
                    "no_ttl",
                    f"{tag}:{as_text(kind)}:{as_text(name)}",
                    _task(as_text(ident)),
                    detail,
                    repair,
                )
            )
    return found


def _check_calls(store: WindowStore, calls: dict[str, list[str]], repair: bool) -> list[Finding]:
    """Lists no open window names, in a scan that began after the lists were listed:
    a list whose window was open throughout it is named; one whose window was taken
    or cancelled meanwhile is gone (the same script deletes it), one flushed names it
    in ``win:<id>`` (checked by the script)."""
    named = store.collect_lists_named(list(store.doctor_keys("open")))
    found: list[Finding] = []
    for tag, lists in calls.items():
        suspects = [cl for cl in lists if cl not in named]
        if suspects:
            for raw in store.doctor_step("calls", tag, "due", suspects, repair):
                found.append(
                    Finding("calls_without_window", f"{tag}:calls:{as_text(raw)}", None, "", repair)
                )
    return found


def render(findings: list[Finding], repair: bool) -> str:
    if not findings:
        return "No findings: the store's invariants hold."
    lines = [
        f"{f.check}: {f.key}"
        + (f" (task {f.task})" if f.task else "")
        + (f": {f.detail}" if f.detail else "")
        + (" [repaired]" if f.repaired else " [not repaired]" if repair else "")
        for f in findings
    ]
    fixed = sum(f.repaired for f in findings)
    lines.append(
        f"{len(findings)} finding(s), {fixed} repaired."
        if repair
        else f"{len(findings)} finding(s) (run with --repair to fix them)."
    )
    return "\n".join(lines)
