"""The store seam (docs/design.md, "The store contract"): outside ``celery_debounce/store/``
no module imports redis-py, names a Lua script or builds a window's keys.

Read with ``ast`` (the scanned modules are not imported): every module of
``celery_debounce`` but ``store/`` (the Redis store itself), ``testing/`` (which starts
servers and inspects them as a test does). A leak planted in a module of a temporary
package shows the scan finds each kind.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_debounce.store.redis.scripts import SCRIPT_NAMES

PACKAGE = Path(__file__).resolve().parents[2] / "celery_debounce"

#: Parts of the package the rule does not cover: the store (its key builders are in
#: ``store/keys.py``) and the servers tests start.
EXEMPT = ("store/", "testing/")

#: Calls that run a script by name (its first argument).
SCRIPT_RUNNERS = frozenset({"run", "run_once", "evalsha", "pipeline_once", "keep"})

#: Builders of a window's KEYS and ARGV (``store/keys.py``'s key names, the store's own
#: builders): only the store calls them.
KEY_BUILDERS = frozenset(
    {
        "record_keys",
        "claim_args",
        "finish_args",
        "claims_key",
        "gate_keys",
        "gate_args",
        "open_key",
        "win_key",
        "due_key",
        "leased_key",
        "active_key",
        "run_key",
        "held_key",
        "expiring_key",
        "quarantine_key",
        "stats_key",
        "stats_reset_key",
        "quiet_key",
        "hot_key",
        "calls_key",
        "dispatchers_key",
        "alive_key",
        "stopped_key",
        "cancel_marker_key",
        "taken_set_key",
        "layouts_key",
    }
)

#: Fragments of a window's key names (``<prefix>:{<shard>}:win:<id>``, ...).
KEY_FRAGMENTS = (":win:", ":open:", ":run:")

#: What still leaks, by module and kind (docs/design.md lists each under "The rule");
#: an entry the scan no longer finds fails too, so this list only shrinks.
#: worker/receivers.py and worker/retry_queue.py (the worker's KEYS/ARGV, ``store.run("renew")``,
#: a kept mark's script call) were here until their move to ``WorkerStore`` (finish_run,
#: renew_claims, end_claim, typed marks), and worker/ceiling.py (it read the record with
#: ``store.client.hmget``) until ``WorkerStore.ceiling_lateness_ms``; they scan clean
#: now, so they are not listed.
ALLOWED: dict[str, set[str]] = {
    # the one exception by design: doctor's findings name the Redis keys they found,
    # Redis-only, outside the contract (docs/design.md; ops/doctor.py's docstring)
    "ops/doctor.py": {
        "spells key fragment ':open:'",
        "spells key fragment ':run:'",
        "spells key fragment ':win:'",
    },
}


def _modules(root: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if not name.startswith(EXEMPT):
            yield name, path


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def leaks(source: str) -> set[str]:
    """Each way ``source`` reaches past the store, as a short phrase."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(
                "imports redis" for alias in node.names if alias.name.split(".")[0] == "redis"
            )
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.split(".")[0] == "redis":
                found.add("imports redis")
        elif isinstance(node, ast.Call):
            name = _called_name(node)
            if name in KEY_BUILDERS or (name and name.lstrip("_") in KEY_BUILDERS):
                found.add(f"calls {name.lstrip('_')}")
            first = node.args[0] if node.args else None
            if (
                name in SCRIPT_RUNNERS
                and isinstance(first, ast.Constant)
                and first.value in SCRIPT_NAMES
            ):
                found.add(f"runs script {first.value!r}")
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if (
                isinstance(node.value, ast.Attribute)
                and node.value.attr == "scripts"
                and isinstance(key, ast.Constant)
                and key.value in SCRIPT_NAMES
            ):
                found.add(f"names script {key.value!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.endswith(".lua"):
                found.add(f"names script {node.value!r}")
            found.update(
                f"spells key fragment {fragment!r}"
                for fragment in KEY_FRAGMENTS
                if fragment in node.value
            )
    return found


def scan(root: Path) -> dict[str, set[str]]:
    """Every module of ``root`` outside the exempt parts, with its leaks (if any)."""
    found = {}
    for name, path in _modules(root):
        kinds = leaks(path.read_text("utf-8"))
        if kinds:
            found[name] = kinds
    return found


def test_no_module_outside_the_store_reaches_past_it() -> None:
    found = scan(PACKAGE)
    unexpected = {name: kinds - ALLOWED.get(name, set()) for name, kinds in found.items()}
    assert {name: kinds for name, kinds in unexpected.items() if kinds} == {}


def test_the_allow_list_names_only_what_still_leaks() -> None:
    """Once a leak is gone, its entry goes: the allow-list never hides a new one."""
    found = scan(PACKAGE)
    stale = {name: kinds - found.get(name, set()) for name, kinds in ALLOWED.items()}
    assert {name: kinds for name, kinds in stale.items() if kinds} == {}


PLANTED = {
    "import redis\n": {"imports redis"},
    "from redis.exceptions import ResponseError\n": {"imports redis"},
    "import redis.asyncio as r\n": {"imports redis"},
    "store.run('gate', [], [])\n": {"runs script 'gate'"},
    "store.run_once('claim', keys, args)\n": {"runs script 'claim'"},
    "client.evalsha('finish', 1)\n": {"runs script 'finish'"},
    "sha = store.scripts['take'].sha\n": {"names script 'take'"},
    "path = 'gate.lua'\n": {"names script 'gate.lua'"},
    "keys = store.record_keys(shard, task_id)\n": {"calls record_keys"},
    "keys = store._record_keys(shard, task_id)\n": {"calls record_keys"},
    "args = store.claim_args(task_id, name, False)\n": {"calls claim_args"},
    "args = finish_args(task_id, state)\n": {"calls finish_args"},
    "key = claims_key(tag)\n": {"calls claims_key"},
    "keys = gate_keys(store, call)\n": {"calls gate_keys"},
    "key = f'{prefix}:{{{shard}}}:win:{task_id}'\n": {"spells key fragment ':win:'"},
    "key = prefix + ':open:' + ident\n": {"spells key fragment ':open:'"},
    "key = '%s:run:%s' % (tag, ident)\n": {"spells key fragment ':run:'"},
}


@pytest.mark.parametrize("line", list(PLANTED))
def test_a_planted_leak_is_found(line: str, tmp_path: Path) -> None:
    """Each kind, planted in a module of a package laid out as this one: found there,
    and not in the same line planted in the exempt parts."""
    for part in ("", "store/", "testing/"):
        (tmp_path / part).mkdir(exist_ok=True)
        (tmp_path / part / "__init__.py").write_text("")
    body = textwrap.dedent(f"""\
        def leak(store, client, shard, task_id, tag, ident, prefix, call, keys, args,
                 name, state, r=None):
            {line.strip()}
    """)
    (tmp_path / "planted.py").write_text(body)
    (tmp_path / "store" / "inside.py").write_text(body)
    (tmp_path / "testing" / "servers.py").write_text(body)
    assert scan(tmp_path) == {"planted.py": PLANTED[line]}


def test_harmless_lookalikes_are_not_leaks() -> None:
    """An operation's name, a key template's own colon, a method named like a script
    runner on other arguments: none is a leak."""
    assert (
        leaks(
            textwrap.dedent("""\
        with translate_errors("gate"):
            pass
        signal.send(sender="gate", key="report:u1")
        store.run(name, keys, args)
        window = store.pending(shard, ident)
    """)
        )
        == set()
    )
