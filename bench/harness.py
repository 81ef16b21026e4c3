"""Rounds, results and the table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Row:
    """One line of the table: a measured figure, its baseline and target."""

    bench: str
    operation: str
    unit: str
    samples: list[float]
    baseline: str = ""
    baseline_value: float | None = None
    ratio: float | None = None
    target: str = ""
    passed: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["median"] = self.median
        data["min"] = min(self.samples) if self.samples else None
        data["max"] = max(self.samples) if self.samples else None
        return data


def rate(n: int, fn: Callable[[int], object]) -> float:
    """Calls per second of ``fn(n)``, which performs n operations."""
    start = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - start)


def interleaved(
    rounds: int,
    n: int,
    subjects: dict[str, Callable[[int], object]],
    before: Callable[[], object] | None = None,
) -> dict[str, list[float]]:
    """Rates of each subject, rounds interleaved so drift hits all of them alike."""
    out: dict[str, list[float]] = {name: [] for name in subjects}
    for _ in range(rounds):
        for name, fn in subjects.items():
            if before is not None:
                before()
            out[name].append(rate(n, fn))
    return out


def compare(
    bench: str,
    operation: str,
    samples: list[float],
    baseline: str,
    base: list[float],
    target_ratio: float | None,
    unit: str = "calls/s",
    note: str = "",
) -> Row:
    row = Row(bench, operation, unit, samples, baseline, statistics.median(base))
    row.ratio = row.median / row.baseline_value if row.baseline_value else None
    if target_ratio is not None:
        row.target = f">= {target_ratio:g}x"
        row.passed = row.ratio is not None and row.ratio >= target_ratio
    row.note = note
    row.extra["baseline_samples"] = list(base)
    return row


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    if value != value:  # nan
        return "nan"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(rows: list[Row]) -> str:
    header = [
        "#",
        "operation",
        "median",
        "min",
        "max",
        "unit",
        "baseline (same run)",
        "ratio",
        "target",
        "result",
    ]
    lines = [header]
    for r in rows:
        lines.append(
            [
                r.bench,
                r.operation,
                _fmt(r.median),
                _fmt(min(r.samples) if r.samples else None),
                _fmt(max(r.samples) if r.samples else None),
                r.unit,
                f"{r.baseline}: {_fmt(r.baseline_value)}" if r.baseline else "",
                f"{r.ratio:.2f}x" if r.ratio is not None else "",
                r.target,
                "" if r.passed is None else ("PASS" if r.passed else "MISS"),
            ]
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = []
    for i, line in enumerate(lines):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    notes = [f"  [{r.bench}] {r.operation}: {r.note}" for r in rows if r.note]
    if notes:
        out.append("")
        out.append("notes:")
        out.extend(notes)
    return "\n".join(out)
