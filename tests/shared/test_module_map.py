"""docs/design.md's module map lists every module once, and the imports go one way.

The map ("## Module map") is the one list of the package's modules: a module missing
from it, listed twice, or listed but gone fails here. The import checks read each
module's top-level imports (not those under ``if TYPE_CHECKING:`` nor inside
functions): no cycle among the package's modules; ``celery_debounce.store`` reaches
no call-encoding module; nothing outside ``store/`` imports redis-py or reads the
store's topology. The stage checks read the imports inside functions too: the stages
import one way (:data:`MAY_IMPORT` at import time, :data:`CALLED_INTO` when called),
with no circle among them.
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
    "producer.many",
    "dispatch.dispatcher",
    "worker.receivers",
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


def repeated_names(paths: list[str]) -> dict[str, list[str]]:
    """File names (``__init__.py`` aside) found at two levels of the package: the same
    name beside itself in parallel folders (``store/redis/runs.py`` and
    ``store/postgres/runs.py``, one job per store) is one level."""
    levels: dict[str, dict[int, list[str]]] = {}
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if name != "__init__.py":
            levels.setdefault(name, {}).setdefault(path.count("/"), []).append(path)
    return {
        name: sorted(p for found in by_level.values() for p in found)
        for name, by_level in levels.items()
        if len(by_level) > 1
    }


def test_no_file_name_is_repeated_at_two_levels() -> None:
    assert repeated_names(package_modules()) == {}


def test_the_name_check_sees_a_name_at_two_levels_only() -> None:
    assert repeated_names(
        ["a/x.py", "b/x.py", "c/d/y.py", "y.py", "__init__.py", "a/__init__.py"]
    ) == {"y.py": ["c/d/y.py", "y.py"]}


def test_the_map_check_sees_a_missing_and_a_doubled_module() -> None:
    text = (
        "x\n## Module map\n\n| module | owns |\n|---|---|\n| `a.py`, `b.py` | x |\n"
        "| `a.py` | y |\n| `lua/*.lua` | z |\n\n## Next\n| `c.py` | w |\n"
    )
    assert listed_modules(text) == ["a.py", "b.py", "a.py"]


def test_the_readme_links_to_the_module_map() -> None:
    assert "docs/design.md#module-map" in (ROOT / "README.md").read_text("utf-8")


def _module_name(path: Path, top: Path = ROOT) -> str:
    parts = list(path.relative_to(top).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_of(
    root: Path, name: str, path: Path, paths: set[str], *, in_functions: bool
) -> set[str]:
    """The package's modules ``name`` imports: at its top level, or (``in_functions``)
    only those inside its functions and methods; never those under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def add(node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
            return
        if node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            found.add(sub if sub in paths else target)

    def walk(body: list[ast.stmt], nested: bool) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                walk(node.orelse, nested)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(node.body, True)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                if nested == in_functions:
                    add(node)
            else:
                for field in ("body", "orelse", "finalbody"):
                    walk(getattr(node, field, None) or [], nested)
                for handler in getattr(node, "handlers", None) or []:
                    walk(handler.body, nested)

    walk(ast.parse(path.read_text("utf-8")).body, False)
    return {m for m in found if m in paths and m != name}


def _graph(root: Path, *, in_functions: bool) -> dict[str, set[str]]:
    top = root.parent
    paths = {_module_name(p, top): p for p in root.rglob("*.py")}
    return {
        name: _imports_of(root, name, path, set(paths), in_functions=in_functions)
        for name, path in paths.items()
    }


@cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports at its top level."""
    return _graph(PACKAGE, in_functions=False)


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


#: The stages, by the first folder of a module's path (docs/design.md, "Module map");
#: the package's top-level modules (settings, errors, signals, headers, tags, calls,
#: ...) are ``shared``, ``testing/`` and ``contrib/`` are ``ops``' peers.
STAGE_FOLDERS = ("producer", "dispatch", "worker", "ops", "store", "testing", "contrib")

#: What each stage may import when it is imported (besides its own modules). ``ops``,
#: ``testing`` and ``contrib`` may import anything, and nothing else imports them.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "shared": frozenset(),
    "store": frozenset({"shared"}),
    "producer": frozenset({"shared", "store"}),
    "dispatch": frozenset({"shared", "store"}),
    "worker": frozenset({"shared", "store"}),
}

#: The imports a stage makes inside a function, across the stages, beyond
#: :data:`MAY_IMPORT`: where one stage brings in another when called, each with its
#: reason. An entry the scan no longer finds fails too, so this list only shrinks.
CALLED_INTO: dict[tuple[str, str], str] = {
    ("producer.worker_steps", "worker"): "install(): a DebouncedTask bound to an app, or a "
    "public name used, connects the worker's receivers (worker.install)",
    ("producer.worker_steps", "dispatch.bootstep"): "at worker_init, an app that uses "
    "debounce gets the embedded dispatcher's DispatcherStep",
    ("producer.task", "worker.receivers"): "DebouncedTask.on_replace, in the worker's run: "
    "the window gets the replacement's outcome (forward_replacement)",
    ("dispatch.bootstep", "worker"): "install(app) for an app without a DebouncedTask: its "
    "windows' runs are claimed and finished (worker.install)",
}


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGE_FOLDERS else "shared"


def stage_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], set[tuple[str, str]]]:
    """(stage, stage) -> the (module, module) imports behind it, across stages only."""
    edges: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for module, imported in graph.items():
        for other in imported:
            pair = (stage_of(module), stage_of(other))
            if pair[0] != pair[1]:
                short = (module.split(".", 1)[1], other.split(".", 1)[1])
                edges.setdefault(pair, set()).add(short)
    return edges


def forbidden(edges: dict[tuple[str, str], set[tuple[str, str]]]) -> list[tuple[str, str]]:
    """The module imports behind a stage edge :data:`MAY_IMPORT` does not allow."""
    return sorted(
        pair
        for (src, dst), pairs in edges.items()
        if src in MAY_IMPORT and dst not in MAY_IMPORT[src]
        for pair in pairs
    )


def stage_circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """Each circle among the stages (as the stages on it, from its smallest), once."""
    found: set[tuple[str, ...]] = set()

    def follow(path: list[str]) -> None:
        for src, dst in sorted(edges):
            if src != path[-1]:
                continue
            if dst == path[0]:
                at = path.index(min(path))
                found.add(tuple(path[at:] + path[:at]))
            elif dst not in path and dst > path[0]:
                follow([*path, dst])

    for start in sorted({s for s, _ in edges}):
        follow([start])
    return [list(circle) for circle in sorted(found)]


def test_the_stages_import_one_way() -> None:
    """At import time each stage imports only what :data:`MAY_IMPORT` gives it: the
    producer, the dispatcher and the worker import the store and the shared modules,
    never each other nor ``ops/``. Inside functions, a stage reaches another only
    where :data:`CALLED_INTO` says why; and counting those, no circle."""
    at_import = stage_edges(import_graph())
    assert forbidden(at_import) == [], "a stage imports another one it must not"
    when_called = stage_edges(_graph(PACKAGE, in_functions=True))
    listed = {pair for pair in forbidden(when_called) if pair not in at_import}
    assert sorted(listed - set(CALLED_INTO)) == [], "add it to CALLED_INTO, with why"
    assert sorted(set(CALLED_INTO) - listed) == [], "gone: drop it from CALLED_INTO"
    lower = set(MAY_IMPORT)
    edges = {pair for pair in (*at_import, *when_called) if set(pair) <= lower}
    assert stage_circles(edges) == []


def test_the_stage_check_finds_a_planted_circle(tmp_path: Path) -> None:
    """A producer module importing the worker at import time, the worker importing the
    producer back: both imports are refused and the circle is found."""
    root = tmp_path / "celery_debounce"
    for folder in ("", "producer", "worker", "store"):
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    (root / "tags.py").write_text("")
    (root / "producer" / "task.py").write_text("from ..worker import receivers\n")
    (root / "worker" / "receivers.py").write_text(
        "from ..tags import *\n\ndef run():\n    from ..producer import task\n"
    )
    at_import = stage_edges(_graph(root, in_functions=False))
    when_called = stage_edges(_graph(root, in_functions=True))
    assert forbidden(at_import) == [("producer.task", "worker.receivers")]
    assert forbidden(when_called) == [("worker.receivers", "producer.task")]
    assert stage_circles({*at_import, *when_called}) == [["producer", "worker"]]
    assert stage_circles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]


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


def test_the_contract_loads_without_redis_py() -> None:
    """The contract (``store/api.py``), its types and the store package load in a
    process where redis-py cannot be imported; the Redis store's names come on first
    use, and then need it."""
    code = (
        "import sys; sys.modules['redis'] = None\n"
        "import celery_debounce.store.api, celery_debounce.store.domain\n"
        "from celery_debounce.store import GateResult, Outcome, store_for, NotReplicated\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('redis') and sys.modules[m])\n"
        "print(loaded)\n"
        "try:\n"
        "    from celery_debounce.store import WindowStore\n"
        "except ImportError:\n"
        "    print('WindowStore needs redis-py')\n"
    )
    out = _run(code).stdout.split("\n")
    assert out[:2] == ["[]", "WindowStore needs redis-py"]


#: Prints which of the package's receivers are connected: the claim (worker/receivers.py)
#: and the hook that adds the embedded dispatcher's bootstep (producer/worker_steps.py).
_CONNECTED = """
from celery.signals import task_prerun, worker_init
import celery_debounce.worker.receivers as w, sys
steps = sys.modules.get("celery_debounce.producer.worker_steps")
print(w._claim in [r[1] for r in task_prerun.receivers],
      steps is not None and steps._add_dispatcher_step in [r[1] for r in worker_init.receivers])
"""

#: A DebouncedTask bound to an app (as a worker binds its app's tasks).
_BOUND = """
from celery import Celery
app = Celery("t", set_as_current=False)
@app.task(base=DebouncedTask, debounce="1s", debounce_max_wait="2s", shared=False)
def work() -> None:
    pass
app.finalize()
"""


@pytest.mark.parametrize(
    ("way_in", "connected"),
    [
        ("from celery_debounce import DebouncedTask", "True True"),
        ("from celery_debounce.producer.task import DebouncedTask" + _BOUND, "True True"),
        ("from celery_debounce import send_task", "True True"),
        ("from celery_debounce import install", "True True"),
        ("from celery_debounce import DebounceError", "True True"),
        ("import celery_debounce; celery_debounce.signals", "True True"),
        # every `celery` command (worker included) loads the CLI plugin
        ("import celery_debounce.ops.cli", "True False"),
        (
            "from celery import Celery\n"
            "from celery_debounce.dispatch.bootstep import install\n"
            "install(Celery('t', set_as_current=False))",
            "True False",
        ),
        # an import connects nothing: each connection is an explicit install
        (
            "import celery_debounce.producer.task, celery_debounce.dispatch.bootstep, "
            "celery_debounce.worker.receivers, celery_debounce.testing",
            "False False",
        ),
    ],
)
def test_every_way_in_connects_the_worker_signals(way_in: str, connected: str) -> None:
    assert _run(f"{way_in}\n{_CONNECTED}").stdout.split() == connected.split()


def test_installing_twice_connects_each_receiver_once() -> None:
    code = (
        "from celery.signals import task_prerun\n"
        "from celery_debounce.producer import worker_steps\n"
        "from celery_debounce import worker\n"
        "for _ in range(3):\n"
        "    worker_steps.install(); worker.install()\n"
        "import celery_debounce.worker.receivers as w\n"
        "print(sum(r[1] in (w._claim, w._reshape) for r in task_prerun.receivers))\n"
    )
    assert _run(code).stdout.split() == ["2"]


def test_every_public_name_imports() -> None:
    import celery_debounce

    for name in celery_debounce.__all__:
        assert getattr(celery_debounce, name) is not None, name
    assert set(celery_debounce.__all__) == set(celery_debounce._OWNERS)
    with pytest.raises(AttributeError):
        celery_debounce.nothing_of_that_name


def test_only_the_store_talks_to_redis_or_knows_its_topology() -> None:
    servers = ("testing/servers.py", "testing/redis_cluster.py")
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
    # the key layout's one cluster fact (its hash tags) is the settings' and tags.py's
    layout_owners = ("settings.py", "tags.py")
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


#: The size bounds: a module over ~700 lines, a class over ~400 or a function (or
#: method) over 80 is cut.
MAX_MODULE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 700, 400, 80


def test_no_module_or_class_is_over_the_size_bounds() -> None:
    big: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text("utf-8")
        name = path.relative_to(PACKAGE).as_posix()
        if text.count("\n") > MAX_MODULE_LINES:
            big.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            end = getattr(node, "end_lineno", None)
            if end is None:
                continue
            lines = end - node.lineno + 1
            if isinstance(node, ast.ClassDef) and lines > MAX_CLASS_LINES:
                big.append(f"{name}: class {node.name}: {lines} lines")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if lines > MAX_FUNCTION_LINES:
                    big.append(f"{name}: {node.name}(): {lines} lines")
    assert big == []


#: The modules that may import each store's driver (any import: at the top, in a
#: function or under TYPE_CHECKING). ruff's banned-api (TID251, pyproject.toml) keeps
#: them out of every stage; this list says which store modules hold them, exactly.
DRIVER_IMPORTERS: dict[str, frozenset[str]] = {
    "redis": frozenset(
        {
            "store/redis/store.py",
            "store/redis/bulk.py",
            "store/redis/cluster.py",
            "store/redis/connect.py",
            "store/redis/translate.py",
            "store/redis/node.py",
            "store/redis/operators.py",
            "store/redis/sentinel.py",
            "store/redis/server.py",
            "store/redis/transport.py",
        }
    ),
    "hiredis": frozenset({"store/redis/node.py"}),
    "fakeredis": frozenset({"testing/__init__.py"}),
    "psycopg": frozenset(
        {
            "store/postgres/app.py",
            "store/postgres/link.py",
            "store/postgres/sending.py",
            "store/postgres/simple_query.py",
            "store/postgres/store.py",
            "store/postgres/wake.py",
            "store/postgres/watchdog.py",
            "testing/pgbouncer.py",
        }
    ),
    "psycopg_pool": frozenset(
        {"store/postgres/reuse.py", "store/postgres/sending.py", "store/postgres/store.py"}
    ),
}


def _driver_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                root = name.partition(".")[0]
                if root in DRIVER_IMPORTERS:
                    found.setdefault(root, set()).add(path.relative_to(PACKAGE).as_posix())
    return found


def test_each_store_driver_is_imported_only_where_listed() -> None:
    """redis-py only by the Redis store, psycopg only by the PostgreSQL store (and the
    test servers), lazy and TYPE_CHECKING imports included: the list is exact, so a new
    importer or one that stopped importing is a change of it."""
    found = _driver_imports()
    assert {name: frozenset(found.get(name, ())) for name in DRIVER_IMPORTERS} == (DRIVER_IMPORTERS)
    postgres = found["psycopg"] | found["psycopg_pool"]
    assert all(m.startswith(("store/postgres/", "testing/")) for m in postgres), postgres
    assert not any(m.startswith("store/postgres/") for m in found["redis"])


def test_the_linter_bans_the_store_drivers_outside_the_stores() -> None:
    """pyproject.toml's banned-api covers every driver and is ignored only under the
    two backends (store/redis/, store/postgres/) and testing/ (and outside the package):
    the contract beside them imports no driver."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    assert "TID251" in lint["select"]
    banned = lint["flake8-tidy-imports"]["banned-api"]
    assert {"redis", "psycopg", "psycopg_pool"} <= set(banned)
    allowed = {glob for glob, codes in lint["per-file-ignores"].items() if "TID251" in codes}
    assert allowed == {
        "!celery_debounce/**",
        "celery_debounce/store/redis/**",
        "celery_debounce/store/postgres/**",
        "celery_debounce/testing/**",
    }
