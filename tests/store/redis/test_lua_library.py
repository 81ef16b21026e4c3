"""The Lua library (celery_debounce/store/redis/lua/lib/): the loader's ``--@include``
lines, what each script includes, the one owner of gate.lua's ARGV positions, and of
the scripts' key names (lib/keys.lua, checked against store/redis/keys.py and tags.py)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_debounce.store import idents
from celery_debounce.store.redis import keys, scripts, tags
from celery_debounce.store.redis.scripts import (
    SCRIPT_NAMES,
    SHARDED_WAKE_OFF,
    SHARDED_WAKE_ON,
    inline_includes,
    library_names,
    script_source,
)

LUA = Path(scripts.__file__).resolve().parent / "lua"


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
    assert message.startswith(
        "s.lua: --@include nope: no celery_debounce/store/redis/lua/lib/nope.lua"
    )
    for name in library_names():
        assert name in message
    with pytest.raises(ValueError, match=r"^lib/a.lua: --@include gone"):
        inline_includes("--@include a\n", "s.lua", pieces(a="--@include gone\n"))


def test_the_package_library_raises_for_an_unknown_piece() -> None:
    with pytest.raises(ValueError, match=r"gate\.lua: --@include missing_piece: no "):
        inline_includes("--@include missing_piece\n", "gate.lua")


#: Pieces that define a family of functions rather than one: lib/keys.lua, a builder
#: per key name.
FAMILIES = {"keys"}


def defines(piece: str) -> list[str]:
    """The functions ``lib/<piece>.lua`` defines: one, or a family (:data:`FAMILIES`)."""
    text = (LUA / "lib" / f"{piece}.lua").read_text("utf-8")
    names = re.findall(r"^local function ([a-z_]+)\(", text, re.MULTILINE)
    if piece in FAMILIES:
        assert names, f"lib/{piece}.lua defines no function"
    else:
        assert len(names) == 1, f"lib/{piece}.lua must define one function, defines {names}"
    return names


def lua_code(text: str) -> tuple[str, list[str]]:
    """Lua ``text`` without its comments (``--`` outside a string literal, to the line's
    end), and the contents of its string literals (quoted on one line, as the scripts
    write them; no long brackets)."""
    lines: list[str] = []
    literals: list[str] = []
    for line in text.splitlines():
        i, quote, start = 0, "", 0
        while i < len(line):
            c = line[i]
            if quote:
                if c == "\\":
                    i += 1  # the escaped character
                elif c == quote:
                    literals.append(line[start:i])
                    quote = ""
            elif c in "'\"":
                quote, start = c, i + 1
            elif line.startswith("--", i):
                line = line[:i]
                break
            i += 1
        lines.append(line)
    return "\n".join(lines), literals


@pytest.mark.parametrize("piece", library_names())
def test_each_piece_opens_with_what_it_defines_and_touches(piece: str) -> None:
    text = (LUA / "lib" / f"{piece}.lua").read_text("utf-8")
    assert text.startswith(f"-- lib/{piece}.lua: defines {defines(piece)[0]}(")
    header = text.split("\nlocal function", 1)[0]
    assert "Touches" in header


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_script_includes_only_what_it_uses(name: str) -> None:
    raw = (LUA / f"{name}.lua").read_text("utf-8")
    code = lua_code(raw)[0]
    flat = script_source(name)
    assert "--@include" not in flat
    for piece in re.findall(r"^--@include (\S+)$", raw, re.MULTILINE):
        functions = defines(piece)
        if piece in FAMILIES:  # one of them, called or passed (doctor_ttl's table)
            uses = [f for f in functions if re.search(rf"\b{f}\b", code)]
        else:
            uses = re.findall(rf"\b{functions[0]}\(", code)
        assert uses, f"{name}.lua includes {piece} but never calls {', '.join(functions)}"
        for function in functions:
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
    from celery_debounce.store.redis import codec

    marked = {const: n for n, const in gate_bindings().values() if const}
    assert marked == {
        "CAP_ARGV": codec.CAP_ARGV,
        "EDGE_ARGV": codec.EDGE_ARGV,
        "COLLECT_ARGV": codec.COLLECT_ARGV,
    }


def test_the_python_builder_puts_each_value_where_gate_lua_reads_it(backend) -> None:  # type: ignore[no-untyped-def]
    from celery_debounce.aliases import fixed_id
    from celery_debounce.producer.call import prepare_call
    from celery_debounce.producer.options import build_spec
    from celery_debounce.store.redis.codec import gate_args

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


# -- lib/keys.lua: the scripts' one owner of key names -----------------------------------

#: keys.lua's builders of one window's keys and of one shard's, each named as its twin
#: in store/redis/keys.py or tags.py (the check below calls that twin by the same name).
WINDOW_KEYS = ("open_key", "win_key", "run_key", "quiet_key", "calls_key", "cancel_marker_key")
SHARD_KEYS = (
    "ids_key",
    "due_key",
    "leased_key",
    "active_key",
    "claims_key",
    "held_key",
    "expiring_key",
    "quarantine_key",
    "stats_key",
    "hot_key",
    "dispatchers_key",
    "shard_wake_channel",
)

#: Builds every name keys.lua builds for ARGV[1] (a tag) and ARGV[2] (an ident or id),
#: and reads them back (open_ident, prefix_of), in the order of the tuples above.
KEYS_PROBE = f"""--@include keys
local tag, name = ARGV[1], ARGV[2]
local out = {{}}
for _, build in ipairs({{{", ".join(WINDOW_KEYS)}}}) do out[#out + 1] = build(tag, name) end
for _, build in ipairs({{{", ".join(SHARD_KEYS)}}}) do out[#out + 1] = build(tag) end
out[#out + 1] = wake_channel(prefix_of(tag))
out[#out + 1] = open_ident(tag, open_key(tag, name))
out[#out + 1] = prefix_of(tag)
return out
"""


def twin(name: str) -> Any:
    """The Python builder of keys.lua's ``name``: store/redis/keys.py's, or tags.py's."""
    return getattr(keys, name, None) or getattr(tags, name)


def test_keys_lua_defines_the_builders_the_check_covers() -> None:
    covered = {*WINDOW_KEYS, *SHARD_KEYS, "wake_channel", "open_ident", "prefix_of"}
    assert set(defines("keys")) == covered


@pytest.mark.parametrize(
    "prefix, tag",
    [
        ("debounce", tags.shard_tag("debounce", 0)),
        ("my:app", tags.shard_tag("my:app", 7)),
        ("préfixe", tags.shard_tag("préfixe", 2)),
        # Redis Cluster tags: the shard alone ({9}), and <shard>.<k> ({0.13})
        ("debounce", tags.cluster_shard_tags("debounce", 16)[9]),
        ("debounce", tags.cluster_shard_tags("debounce", 16)[0]),
    ],
)
def test_keys_lua_builds_the_names_keys_py_builds(
    redis_client: redis.Redis, prefix: str, tag: str
) -> None:
    assert tag.startswith(prefix + ":{")
    probe = inline_includes(KEYS_PROBE, "probe.lua")
    for name in (
        idents.window_ident("t", "k"),
        idents.window_ident("tâche", "clé: {x} ~1"),  # braces, colons, non-ASCII
        "2f1c0d4e-9b7a-4c53-8f0e-5d2a7b3c1e99",
        "2f1c0d4e-9b7a-4c53-8f0e-5d2a7b3c1e99~1700000000000~2",  # an id renamed aside
    ):
        got = [v.decode("utf-8") for v in redis_client.eval(probe, 0, tag, name)]
        want = [
            *(twin(b)(tag, name) for b in WINDOW_KEYS),
            *(twin(b)(tag) for b in SHARD_KEYS),
            tags.wake_channel(prefix),
            name,
            prefix,
        ]
        assert got == want
        # every key of one window and shard is in the shard's slot
        assert {tags.key_slot(k) for k in got[: len(WINDOW_KEYS) + len(SHARD_KEYS)]} == {
            tags.key_slot(tag)
        }


#: A string literal that spells a key name: ':' then a kind keys.lua builds (':win:',
#: ':ids', ...), or a bare ':' (a name joined from parts).
def key_kinds() -> set[str]:
    _, literals = lua_code((LUA / "lib" / "keys.lua").read_text("utf-8"))
    return {m for lit in literals for m in re.findall(r"^:(\w+):?$", lit)}


def test_key_kinds_are_read_from_keys_lua() -> None:
    assert {"open", "win", "run", "ids", "due", "held", "wake"} <= key_kinds()


@pytest.mark.parametrize(
    "path",
    sorted(
        p.relative_to(LUA).as_posix()
        for p in [*LUA.glob("*.lua"), *LUA.glob("lib/*.lua")]
        if p.name != "keys.lua"
    ),
)
def test_no_script_but_keys_lua_spells_a_key_name(path: str) -> None:
    code, literals = lua_code((LUA / path).read_text("utf-8"))
    spelled = re.compile(rf"(^:$|:({'|'.join(sorted(key_kinds()))})\b)")
    assert [lit for lit in literals if spelled.search(lit)] == []
    # nor finds a name's parts by their length (gate.lua's ident after '}:open:')
    assert "#tag +" not in code
