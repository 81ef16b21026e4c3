"""The Python producer against the shared conformance cases of the gate contract.

``contract/vectors.json`` (docs/contract.md) is read by this file and by the Node
package's tests: each case's ident, resolved key, Redis keys, ARGV and body bytes, or
its error. ``python tests/system/test_contract_vectors.py --write`` recomputes the outputs of
the cases that apply to Python (review the diff: it changes the contract).
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import EncodeError

from celery_debounce.errors import (
    DebounceConfigError,
    DebounceContractMismatch,
    DebounceKeyError,
    DebouncePayloadError,
)
from celery_debounce.producer.call import prepare_call
from celery_debounce.producer.options import TaskDefaults
from celery_debounce.settings import Settings
from celery_debounce.store.redis import codec as codec_module
from celery_debounce.store.redis.codec import gate_args, gate_keys
from celery_debounce.store.redis.keys import due_key, open_key
from celery_debounce.store.redis.tags import layout_of
from celery_debounce.store.results import CONTRACT_VERSION

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "contract" / "vectors.json"
GATE = ROOT / "celery_debounce" / "store" / "redis" / "lua" / "gate.lua"
NODE_VERSION = ROOT / "clients" / "node" / "src" / "contract.ts"

#: Node option name -> Python call option (an unknown name maps the same way, so it is
#: refused on both sides).
_SETTING = {
    "prefix": "debounce_key_prefix",
    "shards": "debounce_shards",
    "cluster": "debounce_redis_cluster",
    "maxKeyLength": "debounce_max_key_length",
    "maxPayloadBytes": "debounce_max_payload_bytes",
}


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTORS.read_text("utf-8"))
    return data


def python_cases() -> list[dict[str, Any]]:
    return [c for c in load()["cases"] if "python" in c.get("sides", ("python", "node"))]


def decode(value: Any) -> Any:
    """A case's value as Python holds it: ``{"$float": t}`` a float, ``{"$int": t}`` an int."""
    if isinstance(value, dict):
        if set(value) == {"$float"}:
            return float(value["$float"])
        if set(value) == {"$int"}:
            return int(value["$int"])
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def option_name(name: str) -> str:
    if name == "debounce":
        return name
    return "debounce_" + re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def settings_of(case: dict[str, Any]) -> Settings:
    app = Celery("vectors", set_as_current=False)
    app.conf.debounce_redis_url = "redis://localhost:1/0"
    for name, value in case.get("settings", {}).items():
        app.conf[_SETTING[name]] = value
    return Settings.from_app(app)


_KINDS = {
    "positional_only": inspect.Parameter.POSITIONAL_ONLY,
    "positional_or_keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "var_positional": inspect.Parameter.VAR_POSITIONAL,
    "keyword_only": inspect.Parameter.KEYWORD_ONLY,
    "var_keyword": inspect.Parameter.VAR_KEYWORD,
}


def signature_of(case: dict[str, Any]) -> inspect.Signature | None:
    """The case's ``signature`` (a published definition's parameters) as Python's."""
    if "signature" not in case:
        return None
    return inspect.Signature(
        [
            inspect.Parameter(
                p["name"],
                _KINDS[p["kind"]],
                default=decode(p.get("default", inspect.Parameter.empty)),
            )
            for p in case["signature"]
        ]
    )


def outcome(case: dict[str, Any]) -> dict[str, Any]:
    """What the Python producer makes of ``case``: ``{"expect": ...}`` or ``{"error": ...}``."""
    try:
        settings = settings_of(case)
        call_options = {option_name(k): v for k, v in case["options"].items()}
        if case.get("collect"):  # a task option: Node reads it from the definition
            call_options["debounce_collect"] = True
        spec = TaskDefaults().for_call(call_options, collect_fixed=False)
        assert spec is not None
        call = prepare_call(
            settings,
            case["task"],
            spec,
            decode(case["args"]),
            decode(case["kwargs"]),
            {},
            signature_of(case),
            "json",
            static={case["task"]: "{}"},
        )
    except DebounceKeyError:
        return {"error": {"kind": "key"}}
    except DebouncePayloadError:
        return {"error": {"kind": "payload"}}
    except DebounceConfigError:
        return {"error": {"kind": "config"}}
    except EncodeError:
        return {"error": {"kind": "encode"}}
    store = SimpleNamespace(
        settings=settings,
        gate_prefixes=tuple((open_key(tag, ""), due_key(tag)) for tag in layout_of(settings).tags),
    )
    argv = [a.decode() if isinstance(a, bytes) else str(a) for a in gate_args(store, call)]
    return {
        "expect": {
            "key": call.key,
            "ident": call.ident,
            "shard": call.shard,
            "keys": gate_keys(store, call),
            "argv": argv[1:5] + argv[6:7] + argv[11:],
            "body": call.payload.decode("ascii"),
        }
    }


@pytest.mark.parametrize("case", python_cases(), ids=lambda c: c["name"])
def test_the_python_producer_matches_the_case(case: dict[str, Any]) -> None:
    want = {k: case[k] for k in ("expect", "error") if k in case}
    assert outcome(case) == want


def test_the_cases_cover_what_the_languages_differ_on() -> None:
    cases = load()["cases"]
    assert len(cases) >= 50
    errors = {c["error"]["kind"] for c in cases if "error" in c}
    assert errors == {"config", "key", "payload", "encode"}
    text = VECTORS.read_text("utf-8")
    for needed in (
        '"$float": "1.0"',
        '"$int": "9007199254740993"',
        "\\ud83d\\ude00",
        "e\\u0301",
        "\\ud800",
        '"cluster": true',
        '"debounce": "2.5ms"',  # half-even rounding: 2 (half-up: 3)
        '"debounce": "3.5ms"',
        '"debounce": 0.0025',
        '"debounce": "0.0125"',
        '"kind": "var_keyword"',  # a signature to bind to
    ):
        assert needed in text, needed
    by_name = {c["name"]: c for c in cases}
    order = [
        by_name["kwargs order: the body keeps it"],
        by_name["kwargs order: the digest does not (same ident as the case above)"],
    ]
    assert order[0]["expect"]["ident"] == order[1]["expect"]["ident"]
    assert order[0]["expect"]["body"] != order[1]["expect"]["body"]
    nfc, nfd = by_name["unicode NFC key"], by_name["unicode NFD key: another window"]
    assert nfc["expect"]["ident"] != nfd["expect"]["ident"]


def test_one_contract_version_everywhere() -> None:
    lua = re.findall(r"^local CONTRACT = '(\d+)'$", GATE.read_text("utf-8"), re.MULTILINE)
    assert lua == [str(CONTRACT_VERSION)]
    assert load()["contract_version"] == CONTRACT_VERSION
    if NODE_VERSION.exists():
        node = re.findall(r"CONTRACT_VERSION = (\d+)", NODE_VERSION.read_text("utf-8"))
        assert node == [str(CONTRACT_VERSION)]


# -- against a real redis-server: what the producer wrote -----------------------------


@pytest.fixture
def vector_app(app_factory: Callable[..., Celery]) -> Iterator[Celery]:
    yield app_factory()


def written_cases() -> list[dict[str, Any]]:
    """The cases that open a window on one node (a cluster case:
    tests/system/test_node_producer.py) by name, with no signature to bind to (a task
    registered with one: tests/producer/test_published.py), and not leading (a leading
    call's window is closed at once: tests/producer/test_leading_edge.py)."""
    return [
        c
        for c in python_cases()
        if "expect" in c
        and not c.get("settings", {}).get("cluster")
        and "signature" not in c
        and not c["options"].get("leading")
        and not c.get("collect")  # a collect window's calls are a list: test_collect.py
    ]


def test_send_task_writes_each_case_s_body_under_its_ident(
    app_factory: Callable[..., Celery], redis_client: redis.Redis
) -> None:
    from celery_debounce import send_task

    cases = written_cases()
    assert any(c.get("settings") for c in cases)
    apps: dict[str, Celery] = {}
    for case in cases:
        redis_client.flushdb()  # each case opens its own window
        given = case.get("settings", {})
        app = apps.get(json.dumps(given)) or apps.setdefault(
            json.dumps(given), app_factory(**{_SETTING[k]: v for k, v in given.items()})
        )
        options = {option_name(k): v for k, v in case["options"].items()}
        send_task(app, case["task"], decode(case["args"]), decode(case["kwargs"]), **options)
        open_name, due = case["expect"]["keys"]
        assert redis_client.hget(open_name, "p") == case["expect"]["body"].encode(), case["name"]
        assert redis_client.zscore(due, case["expect"]["ident"]) is not None, case["name"]


def test_a_producer_of_another_contract_version_is_refused_and_writes_nothing(
    vector_app: Celery, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_debounce import send_task

    monkeypatch.setattr(codec_module, "_CONTRACT_PREFIX", b"2:")
    with pytest.raises(DebounceContractMismatch) as caught:
        send_task(
            vector_app,
            "proj.build_report",
            ["u1"],
            debounce="5m",
            debounce_max_wait="30m",
            debounce_key="report:{0}",
        )
    assert (caught.value.producer, caught.value.gate) == ("2", "1")
    assert "DEBOUNCE_CONTRACT_MISMATCH producer 2 gate 1" in str(caught.value)
    assert redis_client.keys("debounce:*") == []
    monkeypatch.setattr(codec_module, "_CONTRACT_PREFIX", b"1:")
    send_task(
        vector_app,
        "proj.build_report",
        ["u1"],
        debounce="5m",
        debounce_max_wait="30m",
        debounce_key="report:{0}",
    )
    assert redis_client.exists("debounce:{0}:open:17:proj.build_report:report:u1")


def _write() -> None:
    data = load()
    for case in data["cases"]:
        if "python" not in case.get("sides", ("python", "node")):
            continue
        case.pop("expect", None)
        case.pop("error", None)
        case.update(outcome(case))
    VECTORS.write_text(json.dumps(data, indent=1, ensure_ascii=True) + "\n", "utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        _write()


def test_an_unversioned_producer_is_refused_as_producer_none(redis_client: redis.Redis) -> None:
    from celery_debounce.store.redis.scripts import script_source

    keys = ["debounce:{0}:open:1:t:k", "debounce:{0}:due"]
    for flag in ("0", "1", "x:0", ""):  # a producer before the contract sent "0" / "1"
        with pytest.raises(
            redis.ResponseError, match="DEBOUNCE_CONTRACT_MISMATCH producer none gate 1"
        ):
            redis_client.eval(
                script_source("gate"), 2, *keys, "id", "300", "1000", flag, "", "[[], {}, {}]", ""
            )
    assert redis_client.keys("*") == []
