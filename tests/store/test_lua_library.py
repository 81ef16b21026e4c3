"""The Lua library (celery_debounce/lua/lib/): the loader's ``--@include`` lines, what each
script includes, and the one owner of gate.lua's ARGV positions."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import redis

from celery_debounce.store import scripts
from celery_debounce.store.scripts import (
    SCRIPT_NAMES,
    SHARDED_WAKE_OFF,
    SHARDED_WAKE_ON,
    inline_includes,
    library_names,
    script_source,
)

LUA = Path(scripts.__file__).resolve().parent.parent / "lua"


def pieces(**texts: str):  # type: ignore[no-untyped-def]
    return lambda name: texts.get(name)


def test_an_include_line_is_replaced_by_the_piece() -> None:
    source = "-- s.lua\n--@include a\nlocal x = a()\n"
    flat = inline_includes(source, "s.lua", pieces(a="local function a() return 1 end\n"))
    assert flat == "-- s.lua\nlocal function a() return 1 end\nlocal x = a()\n"


def test_nested_includes_resolve_and_a_piece_is_inlined_once() -> None:
    read = pieces(
        a="--@include b\nlocal function a() return b() end\n", b="local function b() return 2 end\n"
    )
    flat = inline_includes("--@include b\n--@include a\nreturn a()\n", "s.lua", read)
    assert flat == (
        "local function b() return 2 end\n\nlocal function a() return b() end\nreturn a()\n"
    )
    assert flat.count("local function b()") == 1


def test_only_a_whole_include_line_counts() -> None:
    source = "local s = '--@include a'\n  --@include a\n-- --@include a\n"
    assert inline_includes(source, "s.lua", pieces()) == source


def test_an_unknown_include_is_a_clear_error() -> None:
    with pytest.raises(ValueError) as info:
        inline_includes("--@include nope\n", "s.lua", pieces())
    message = str(info.value)
    assert message.startswith("s.lua: --@include nope: no celery_debounce/lua/lib/nope.lua")
    for name in library_names():
        assert name in message
    with pytest.raises(ValueError, match=r"^lib/a.lua: --@include gone"):
        inline_includes("--@include a\n", "s.lua", pieces(a="--@include gone\n"))


def test_the_package_library_raises_for_an_unknown_piece() -> None:
    with pytest.raises(ValueError, match=r"gate\.lua: --@include missing_piece: no "):
        inline_includes("--@include missing_piece\n", "gate.lua")


def defined(piece: str) -> str:
    text = (LUA / "lib" / f"{piece}.lua").read_text("utf-8")
    names = re.findall(r"^local function ([a-z_]+)\(", text, re.MULTILINE)
    assert len(names) == 1, f"lib/{piece}.lua must define one function, defines {names}"
    return names[0]


@pytest.mark.parametrize("piece", library_names())
def test_each_piece_opens_with_what_it_defines_and_touches(piece: str) -> None:
    text = (LUA / "lib" / f"{piece}.lua").read_text("utf-8")
    assert text.startswith(f"-- lib/{piece}.lua: defines {defined(piece)}(")
    header = text.split("\nlocal function", 1)[0]
    assert "Touches" in header


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_script_includes_only_what_it_uses(name: str) -> None:
    raw = (LUA / f"{name}.lua").read_text("utf-8")
    flat = script_source(name)
    assert "--@include" not in flat
    for piece in re.findall(r"^--@include (\S+)$", raw, re.MULTILINE):
        function = defined(piece)
        uses = re.findall(rf"\b{function}\(", raw)
        assert uses, f"{name}.lua includes {piece} but never calls {function}"
        assert flat.count(f"local function {function}(") == 1


def test_every_piece_is_used() -> None:
    used = set()
    for name in SCRIPT_NAMES:
        used.update(
            re.findall(
                r"^--@include (\S+)$", (LUA / f"{name}.lua").read_text("utf-8"), re.MULTILINE
            )
        )
    assert used == set(library_names())


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_the_loaded_text_is_stable_and_only_the_wake_line_differs_on_a_cluster(name: str) -> None:
    flat = script_source(name)
    assert script_source(name) == flat
    sharded = script_source(name, sharded_wake=True)
    assert sharded == flat.replace(SHARDED_WAKE_OFF, SHARDED_WAKE_ON, 1)


def test_every_script_loads_under_the_sha_of_its_flat_text(redis_client: redis.Redis) -> None:
    for name in SCRIPT_NAMES:
        for sharded in (False, True):
            text = script_source(name, sharded)
            assert redis_client.script_load(text) == hashlib.sha1(text.encode()).hexdigest()


# -- gate.lua's ARGV: one owner per position ---------------------------------------------


def gate_bindings() -> dict[str, tuple[int, str | None]]:
    """gate.lua's ``local <name> = ARGV[<n>]  -- codec.<CONST>`` lines: name -> (n, CONST)."""
    code = (LUA / "gate.lua").read_text("utf-8")
    found = re.findall(r"^local (\w+) = ARGV\[(\d+)\](?:  -- codec\.(\w+))?", code, re.MULTILINE)
    return {name: (int(n), const or None) for name, n, const in found}


def test_gate_binds_each_argv_once_by_name_and_reads_argv_nowhere_else() -> None:
    bound = gate_bindings()
    assert sorted(n for n, _ in bound.values()) == list(range(1, len(bound) + 1))
    code = (LUA / "gate.lua").read_text("utf-8")
    others = [
        line
        for line in code.splitlines()
        if "ARGV[" in line.split("--", 1)[0] and not re.match(r"local \w+ = ARGV\[", line)
    ]
    assert others == []
    header = code.split("\n\n", 1)[0]
    documented = {int(n) for n in re.findall(r"ARGV\[(\d+)\]", header)}
    assert documented == set(range(1, len(bound) + 1))


def test_gate_argv_groups_start_where_codec_says() -> None:
    from celery_debounce.store import codec

    marked = {const: n for n, const in gate_bindings().values() if const}
    assert marked == {
        "CAP_ARGV": codec.CAP_ARGV,
        "EDGE_ARGV": codec.EDGE_ARGV,
        "COLLECT_ARGV": codec.COLLECT_ARGV,
    }


def test_the_python_builder_puts_each_value_where_gate_lua_reads_it(backend) -> None:  # type: ignore[no-untyped-def]
    from celery_debounce.aliases import fixed_id
    from celery_debounce.producer.call import prepare_call
    from celery_debounce.producer.gate import gate_args
    from celery_debounce.producer.options import build_spec

    at = {name: n - 1 for name, (n, _) in gate_bindings().items()}
    settings = backend.settings
    fixed = fixed_id("mine", {})
    assert fixed is not None
    edge = prepare_call(
        settings,
        "t",
        build_spec("1h", "{0}", "2h", False, 3, True, True),
        ("k",),
        {},
        {},
        None,
        "json",
    )
    collect = prepare_call(
        settings,
        "t",
        build_spec("1h", "{0}", "2h", False, 3, collect=True),
        ("k",),
        {},
        {},
        None,
        "json",
    )
    for prepared, last in ((edge, "history_ttl"), (collect, "collect_embed")):
        args = gate_args(backend, prepared, fixed)
        assert len(args) == at[last] + 1
        assert args[at["opener_id"]] == prepared.task_id
        assert args[at["payload"]] == prepared.payload
        assert args[at["alias_json"]] == fixed.alias_json
        assert args[at["alias_on_open"]] == "0"
        assert args[at["max_calls"]] == 3
    edge_args = gate_args(backend, edge, fixed)
    assert edge_args[at["edge"]] == b"B"
    assert edge_args[at["history_ttl"]] == settings.history_ttl_ms
    collect_args = gate_args(backend, collect, fixed)
    assert collect_args[at["edge"]] == collect_args[at["history_ttl"]] == ""
    assert collect_args[at["budget"]] == settings.max_payload_bytes
    assert collect_args[at["collect_embed"]] == collect.collect_embed
