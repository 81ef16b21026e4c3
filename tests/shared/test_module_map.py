"""docs/design.md's module map lists every module once, and the imports go one way.

The map ("## Module map") is the one list of the package's modules: a module missing
from it, listed twice, or listed but gone fails here. The import checks read each
module's top-level imports (not those under ``if TYPE_CHECKING:`` nor inside
functions): no cycle among the package's modules; ``celery_debounce.store`` reaches
no call-encoding module; nothing outside ``store/`` imports redis-py or reads the
store's topology.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_debounce"
PAGE = ROOT / "docs" / "design.md"

#: The call encoding, which the store must not need.
CALL_ENCODING = (
    "producer.call",
    "producer.message",
    "producer.options",
    "producer.key_templates",
    "producer.gate",
    "producer.task",
)
#: Nor the producer's other modules (nor, through the package's ``__init__``, anything).
PRODUCER = (
    *CALL_ENCODING,
    "producer.canvas",
    "producer.result",
    "producer.bulk",
    "dispatch.dispatcher",
    "worker.signals",
)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + len(heading) + 2)
    return text[start:] if end < 0 else text[start:end]


def listed_modules(text: str) -> list[str]:
    """Every ``.py`` path named in the first column of the map's table, as written."""
    names = []
    for line in _section(text, "## Module map").splitlines():
        cells = line.split("|")
        if len(cells) < 3 or not line.startswith("|"):
            continue
        names += [n for n in re.findall(r"`([^`]+)`", cells[1]) if n.endswith(".py")]
    return names


def package_modules() -> list[str]:
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_the_module_map_lists_every_module_once() -> None:
    listed = listed_modules(PAGE.read_text("utf-8"))
    real = package_modules()
    assert sorted(set(n for n in listed if listed.count(n) > 1)) == []
    assert sorted(set(real) - set(listed)) == [], "add them to docs/design.md, Module map"
    assert sorted(set(listed) - set(real)) == [], "listed in docs/design.md but gone"


def test_the_map_check_sees_a_missing_and_a_doubled_module() -> None:
    text = (
        "x\n## Module map\n\n| module | owns |\n|---|---|\n| `a.py`, `b.py` | x |\n"
        "| `a.py` | y |\n| `lua/*.lua` | z |\n\n## Next\n| `c.py` | w |\n"
    )
    assert listed_modules(text) == ["a.py", "b.py", "a.py"]


def test_the_readme_links_to_the_module_map() -> None:
    assert "docs/design.md#module-map" in (ROOT / "README.md").read_text("utf-8")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports at its top level."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found: set[str] = set()

        def walk(body: list[ast.stmt], found: set[str] = found, package: str = package) -> None:
            for node in body:
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    walk(node.orelse)
                elif isinstance(node, (ast.If, ast.Try)):
                    walk(node.body)
                    walk(node.orelse)
                    for handler in getattr(node, "handlers", []):
                        walk(handler.body)
                    walk(getattr(node, "finalbody", []))
                elif isinstance(node, ast.Import):
                    found.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = package.split(".")
                        base = base[: len(base) - node.level + 1]
                        target = ".".join([*base, *([node.module] if node.module else [])])
                    else:
                        target = node.module or ""
                    for alias in node.names:
                        sub = f"{target}.{alias.name}"
                        found.add(sub if sub in paths else target)

        walk(ast.parse(path.read_text("utf-8")).body)
        graph[name] = {m for m in found if m in paths and m != name}
    return graph


def _reached(start: str) -> set[str]:
    graph, seen, todo = import_graph(), set(), [start]
    while todo:
        for other in graph[todo.pop()]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def test_no_import_cycle() -> None:
    cycles = sorted(m for m in import_graph() if m in _reached(m))
    assert cycles == []


def test_the_store_needs_no_call_encoding() -> None:
    reached = _reached("celery_debounce.store")
    for sub in [m for m in import_graph() if m.startswith("celery_debounce.store.")]:
        reached |= _reached(sub)
    assert sorted(m for m in reached if m.removeprefix("celery_debounce.") in CALL_ENCODING) == []


def _run(code: str, *flags: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done


def test_importing_the_store_loads_no_producer_module() -> None:
    """``python -X importtime -c "import celery_debounce.store"``: the package's
    ``__init__`` loads its public names lazily, so nothing of the call encoding runs."""
    err = _run("import celery_debounce.store", "-X", "importtime").stderr
    loaded = {
        line.rsplit("|", 1)[1].strip()
        for line in err.splitlines()
        if line.startswith("import time:") and "celery_debounce" in line
    }
    assert "celery_debounce.store" in loaded
    assert sorted(m for m in loaded if m.removeprefix("celery_debounce.") in PRODUCER) == []


#: Prints which of the package's receivers are connected: the claim (worker_signals)
#: and the embedded dispatcher's bootstep.
_CONNECTED = """
from celery.signals import task_prerun, worker_init
import celery_debounce.worker.signals as w, sys
print(w._claim in [r[1] for r in task_prerun.receivers],
      "celery_debounce.dispatch.bootstep" in sys.modules
      and sys.modules["celery_debounce.dispatch.bootstep"]._add_dispatcher_step
      in [r[1] for r in worker_init.receivers])
"""


@pytest.mark.parametrize(
    ("way_in", "connected"),
    [
        ("from celery_debounce import DebouncedTask", "True True"),
        ("from celery_debounce.producer.task import DebouncedTask", "True True"),
        ("from celery_debounce import send_task", "True True"),
        ("from celery_debounce import install", "True True"),
        ("from celery_debounce import DebounceError", "True True"),
        ("import celery_debounce; celery_debounce.signals", "True True"),
        # every `celery` command (worker included) loads the CLI plugin
        ("import celery_debounce.ops.cli", "True False"),
    ],
)
def test_every_way_in_connects_the_worker_signals(way_in: str, connected: str) -> None:
    assert _run(f"{way_in}\n{_CONNECTED}").stdout.split() == connected.split()


def test_every_public_name_imports() -> None:
    import celery_debounce

    for name in celery_debounce.__all__:
        assert getattr(celery_debounce, name) is not None, name
    assert set(celery_debounce.__all__) == set(celery_debounce._OWNERS)
    with pytest.raises(AttributeError):
        celery_debounce.nothing_of_that_name


def test_only_the_store_talks_to_redis_or_knows_its_topology() -> None:
    servers = ("testing/servers.py", "testing/cluster.py")
    outside = [
        p
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] != "store"
        and p.relative_to(PACKAGE).as_posix() not in servers
    ]
    redis_py = sorted(
        p.name for p in outside if {"redis"} & {m.split(".")[0] for m in _top_imports(p)}
    )
    assert redis_py == []
    flags = re.compile(r"store\.(sharded_wake|direct|transport)\b|\.cluster\b|RedisCluster")
    assert sorted(p.name for p in outside if flags.search(p.read_text("utf-8"))) == []
    # the key layout's one cluster fact (its hash tags) is the settings' and layout's
    layout_owners = ("settings.py", "layout.py")
    assert (
        sorted(
            p.name
            for p in outside
            if p.name not in layout_owners and "redis_cluster" in p.read_text("utf-8")
        )
        == []
    )


def _top_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


#: The size bounds of issue 20: a module over ~700 lines or a class over ~400 is cut.
MAX_MODULE_LINES, MAX_CLASS_LINES = 700, 400


def test_no_module_or_class_is_over_the_size_bounds() -> None:
    big: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text("utf-8")
        name = path.relative_to(PACKAGE).as_posix()
        if text.count("\n") > MAX_MODULE_LINES:
            big.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    big.append(f"{name}: class {node.name}: {lines} lines")
    assert big == []
