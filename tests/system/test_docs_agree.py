"""The user pages tell one story: what they advise about an option agrees across pages,
they describe the current release (history is the CHANGELOG's), and the internals sit in
the Development section of the site, not among the user pages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import celery_debounce

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MKDOCS = (ROOT / "mkdocs.yml").read_text("utf-8")


def nav() -> tuple[list[str], list[str]]:
    """The user pages (top level of the nav) and the Development section's pages."""
    nav_text = MKDOCS[MKDOCS.index("\nnav:\n") :]
    user = re.findall(r"^  - [^:\n]+: (\S+\.md)$", nav_text, re.M)
    section = nav_text[nav_text.index("\n  - Development:\n") :]
    development = re.findall(r"^      - [^\n]+: (\S+\.md)$", section, re.M)
    return user, development


USER, DEVELOPMENT = nav()
USER_TEXT = {name: (DOCS / name).read_text("utf-8") for name in USER}
USER_TEXT["README.md"] = (ROOT / "README.md").read_text("utf-8")

#: Advice to guard overlapping runs with a lock: the package's answer is
#: ``debounce_exclusive`` (a lock would fail or block the follow-up and lose its calls).
LOCK_ADVICE = re.compile(
    r"\b(keep|use|add|take|acquire|hold)s? a lock\b|\bwith a lock\b|\block if it must not", re.I
)
OVERLAP = re.compile(r"\b(can|may|could) (therefore )?overlap\b", re.I)


def paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def test_the_nav_lists_the_pages_and_keeps_the_internals_in_development() -> None:
    assert {"development.md", "design.md", "due-index.md", "benchmark-log.md"} == set(DEVELOPMENT)
    assert not set(USER) & set(DEVELOPMENT)
    assert "performance.md" in USER and "django.md" in USER
    for page in USER + DEVELOPMENT:
        assert (DOCS / page).is_file(), page
    assert "not merged" not in MKDOCS


@pytest.mark.parametrize("page", sorted(USER_TEXT))
def test_no_page_advises_a_lock_against_overlapping_runs(page: str) -> None:
    for paragraph in paragraphs(USER_TEXT[page]):
        assert not LOCK_ADVICE.search(paragraph), f"{page}: {paragraph.strip()[:200]}"
        if OVERLAP.search(paragraph):
            assert "debounce_exclusive" in paragraph, (
                f"{page}: says runs can overlap without naming debounce_exclusive: "
                f"{paragraph.strip()[:200]}"
            )


def test_the_checks_catch_lock_advice_and_an_overlap_without_the_option() -> None:
    assert LOCK_ADVICE.search("Guard the body with a lock if it must not overlap.")
    assert LOCK_ADVICE.search("if it must never run twice at once, keep a lock.")
    assert not LOCK_ADVICE.search("Keep no lock inside the task: it would block.")
    assert OVERLAP.search("Two runs for the same key can overlap if a run is long.")


def test_the_django_page_names_debounce_exclusive() -> None:
    assert "debounce_exclusive=True" in USER_TEXT["django.md"]


#: An earlier release's behaviour told on a user page ("0.2.0 refused every string.",
#: "before, ..."): the CHANGELOG holds it. migrating.md's upgrade notes are the exception.
HISTORY = re.compile(
    r"\b\d\.\d+(?:\.\d+)? (?:refused|accepted|did|was|were|had|left|reported|ignored|let|"
    r"sent|returned)\b|\(before, "
)


@pytest.mark.parametrize("page", sorted(set(USER_TEXT) - {"migrating.md"}))
def test_user_pages_describe_the_current_release(page: str) -> None:
    found = [m.group(0) for m in HISTORY.finditer(USER_TEXT[page])]
    assert not found, f"{page}: {found}"


def test_the_history_check_catches_a_release_note() -> None:
    assert HISTORY.search("as are floats and bools. (0.2.0 refused every string.)")
    assert HISTORY.search("A retry lets it through (before, the window was acked).")
    assert HISTORY.search("0.2 reported a suppressed bulk call as `call_absorbed`")
    assert not HISTORY.search("(0.1 s doubling to 5 s)")


#: A sentence that tells what an earlier release did ("Before, take.lua failed ...";
#: "...; before, it was quarantined"): the page says what happens now.
BEFORE = re.compile(r"(?:^|[.;:(]\s*)Before, |[.;:(]\s*before, ", re.M)


def test_guarantees_tells_no_history() -> None:
    found = [m.group(0) for m in BEFORE.finditer(USER_TEXT["guarantees.md"])]
    assert not found, f"guarantees.md: {found}"
    assert BEFORE.search("blocked the shard. Before, take.lua failed on every pass")
    assert BEFORE.search("first own failure; before, it was quarantined")
    assert not BEFORE.search("But what the kernel took before, any number of commands")


#: The most words a table cell of a user page holds: a longer one reads better as prose
#: below its table.
CELL_WORDS = 80


def table_cells(text: str) -> list[tuple[int, str]]:
    """Every cell of every Markdown table outside code blocks: ``(line, text)``."""
    cells: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|"):
            row = re.split(r"(?<!\\)\|", line.strip().strip("|"))
            cells += [(number, cell.strip()) for cell in row]
    return cells


@pytest.mark.parametrize("page", sorted(USER_TEXT))
def test_no_table_cell_of_a_user_page_runs_long(page: str) -> None:
    long = [
        f"line {number}: {len(cell.split())} words: {cell[:60]}"
        for number, cell in table_cells(USER_TEXT[page])
        if len(cell.split()) > CELL_WORDS
    ]
    assert not long, f"{page}: {long}"


def test_the_cell_check_reads_table_rows_only() -> None:
    text = "| a | b |\n|---|---|\n| one `x \\| y` | " + "w " * 90 + "|\n```\n| " + "w " * 90
    cells = table_cells(text + "|\n```\n")
    assert [len(cell.split()) for _, cell in cells] == [1, 1, 1, 1, 4, 90]


def test_no_internal_issue_numbers_in_the_docs_or_the_changelog() -> None:
    texts = {p.name: p.read_text("utf-8") for p in DOCS.glob("*.md")}
    texts["README.md"] = USER_TEXT["README.md"]
    texts["CHANGELOG.md"] = (ROOT / "CHANGELOG.md").read_text("utf-8")
    for name, text in texts.items():
        found = re.findall(r"\bissues? \d+\b", text, re.I)
        assert not found, f"{name}: {found}"


def test_the_changelog_ships_nothing_unreleased_and_has_a_section_per_release() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text("utf-8")
    releases = re.findall(r"^## (\S+) \((\d{4}-\d\d-\d\d)\)$", changelog, re.M)
    assert releases[0][0] == celery_debounce.__version__
    assert [r[0] for r in releases] == ["0.3.0", "0.2.0", "0.1.0"]
    assert not re.search(r"^## Unreleased", changelog, re.M | re.I)
    migrating = USER_TEXT["migrating.md"]
    major_minor = ".".join(celery_debounce.__version__.split(".")[:2])
    assert f"## Upgrading from 0.2 to {major_minor}" in migrating


def test_performance_opens_with_a_summary_table() -> None:
    text = USER_TEXT["performance.md"]
    first_section = text.split("\n## ", 1)[0]
    assert re.search(r"^\| # \| what \| figure \|", first_section, re.M)
    assert "PASS" not in text and "MISS" not in text


def test_the_dashboard_and_alerts_are_found_through_the_cli() -> None:
    for page in ("production.md", "monitoring.md"):
        text = USER_TEXT[page]
        assert "debounce dashboard" in text and "debounce alerts" in text, page
        assert "dashboards/" not in text, page
    extra = re.search(
        r"^(\w+) = \[\"prometheus-client", (ROOT / "pyproject.toml").read_text(), re.M
    )
    assert extra is not None
    assert f"pip install 'celery-debounced[{extra.group(1)}]'" in USER_TEXT["monitoring.md"]


#: page -> the code blocks checked (a fence's opening pattern): every block of the
#: first two pages, the Python of the Django page (its tool output is as printed)
FIRST_PAGES = {
    "index.md": r"```[^\n]*",
    "quickstart.md": r"```[^\n]*",
    "django.md": r"```python[^\n]*",
}


@pytest.mark.parametrize("page", sorted(FIRST_PAGES))
def test_the_first_pages_code_blocks_fit_88_columns(page: str) -> None:
    fence = FIRST_PAGES[page]
    for block in re.findall(fence + r"\n(.*?)```", USER_TEXT[page], re.S):
        for line in block.splitlines():
            assert len(line) <= 88, f"{page}: {len(line)} columns: {line}"


@pytest.mark.parametrize("page", sorted(USER_TEXT))
def test_no_digit_outside_ascii_that_the_sites_font_may_lack(page: str) -> None:
    """The site loads no web font: a full-width or Arabic-Indic digit can show as an empty
    box, so the pages write such characters as escapes (``"\\uff11"``)."""
    import unicodedata

    found = {c for c in USER_TEXT[page] if unicodedata.category(c) == "Nd" and not c.isascii()}
    assert not found, f"{page}: {sorted(found)}"


#: A sentence saying something is required or needed ...
_REQUIRED = re.compile(
    r"\brequired\b|\bneeds? (?:only )?Redis\b|\brequires? Redis\b|\bmust (?:set|name|give)\b",
    re.IGNORECASE,
)
#: ... of Redis or its URL ...
_OF_REDIS = re.compile(r"redis_url|REDIS_URL|\bRedis\b")
#: ... reads as true of every deployment unless it names the other store or a context that
#: only Redis has (a Redis broker, Sentinel, Cluster, its server, its ACLs and memory).
_REDIS_ONLY_CONTEXT = re.compile(
    r"debounce_store_url|STORE_URL|PostgreSQL|[Ss]entinel|Redis store|[Cc]luster|"
    r"redis-server|ACL|TLS|maxmemory|Valkey|Redis broker"
)


def _sentences(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    parts = re.split(r"(?<=[.!?])\s+|\n\s*\n|\n[-*] ", prose)
    return [" ".join(part.split()) for part in parts]


def redis_required_everywhere(text: str) -> list[str]:
    """The sentences of ``text`` that call Redis (or its URL) required without saying
    that only a Redis deployment needs it."""
    return [
        sentence
        for sentence in _sentences(text)
        if _REQUIRED.search(sentence)
        and not sentence.endswith("?")  # a question ("Do I need Redis?") asserts nothing
        and _OF_REDIS.search(sentence)
        and not _REDIS_ONLY_CONTEXT.search(sentence)
    ]


def test_no_page_calls_redis_required_where_the_postgresql_store_makes_it_unnecessary() -> None:
    """The windows live in Redis or PostgreSQL: a page that says ``debounce_redis_url``
    (or Redis) is required must say for which store, as docs/stores.md does."""
    wrong = {
        page.relative_to(ROOT).as_posix(): found
        for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
        if (found := redis_required_everywhere(page.read_text(encoding="utf-8")))
    }
    assert wrong == {}
    # what the check is for: the sentence production.md had before it named both stores
    assert redis_required_everywhere(
        "- **`debounce_redis_url` is required with a RabbitMQ (or any non-Redis) broker**:\n"
        "  the windows default to the broker's Redis only when the broker is one."
    )
