"""The contract suite (tests/store/contract) uses every member of the store contract's
Protocols (celery_debounce/store/api.py), so each is run against every store."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _members() -> list[tuple[str, str]]:
    tree = ast.parse((ROOT / "celery_debounce/store/api.py").read_text("utf-8"))
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                    found.append((node.name, item.name))
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    found.append((node.name, item.target.id))
    return found


def test_the_contract_suite_uses_every_member_of_the_contract() -> None:
    suite = (ROOT / "tests/store/contract/test_contract.py").read_text("utf-8")
    members = _members()
    assert len(members) > 40  # the Protocols were read
    unused = [(role, name) for role, name in members if not re.search(rf"\.{name}\b", suite)]
    assert unused == []


#: Every member of each role, as docs/design.md's "The store contract" lists them: a member
#: added or removed is a change of the contract every store implements (and CHANGELOG's).
ROLES = {
    "BaseStore": ["settings", "tag", "check_server"],
    "ProducerStore": ["gate", "gate_many"],
    "DispatcherStore": [
        "layout",
        "take",
        "ack",
        "release",
        "quarantine",
        "expiring",
        "expire",
        "expired",
        "layouts",
        "heartbeat",
        "wake_listener",
        "refresh_topology",
    ],
    "WorkerStore": [
        "claim",
        "claim_late",
        "finish_run",
        "renew_claims",
        "end_claim",
        "put_back",
        "ceiling_lateness_ms",
    ],
    "OperatorStore": [  # at most about 15 (issue 40): reads and actions in domain terms
        "time_ms",
        "pending",
        "taken",
        "open_windows",
        "taken_windows",
        "census",
        "snapshot",
        "liveness",
        "pending_payloads",
        "reach",
        "flush",
        "cancel",
        "cancelled_by",
        "reset_counters",
        "delete_all",
    ],
    "DefinitionStore": ["publish_definitions", "task_definition"],
    "Store": ["server_checked"],
    "WakeListening": ["subscribe", "wait", "close"],  # what wake_listener returns
    "ShardPlan": ["name", "legacy_shards", "tags_of"],  # what layout returns
}


def test_each_role_has_exactly_its_listed_members() -> None:
    found: dict[str, list[str]] = {}
    for role, name in _members():
        found.setdefault(role, []).append(name)
    assert found == ROLES
    assert len(ROLES["OperatorStore"]) <= 15


def test_the_states_the_redis_scripts_write_are_the_contracts() -> None:
    from celery_debounce.store.states import STATES

    lua = "\n".join(
        p.read_text("utf-8") for p in (ROOT / "celery_debounce/store/redis/lua").rglob("*.lua")
    )
    written = {  # 'st' set by an HSET (an HMGET reads it)
        state
        for line in lua.splitlines()
        if "HSET" in line
        for state in re.findall(r"'st', '([a-z]+)'", line)
    }
    assert {"dispatching", "queued", "claimed", "finished"} <= written <= STATES, written
