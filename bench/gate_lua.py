"""The Lua work of one ``gate.lua`` call, without Redis: the figure docs/design.md cites
for gate.lua's shape (its Lua section, "Where to change what").

``python -m bench.gate_lua [REV ...]`` runs the working tree's ``gate.lua`` and the one
at each git revision (its includes inlined by this tree's loader) in a Lua 5.1 VM (lupa,
from ``fakeredis[lua]``) whose ``redis.call`` is a constant stub, as Redis runs a script:
its body a function called once per call. Printed: microseconds of Lua per call, the
fastest of interleaved rounds, for a join (hot key) and an open (cold key). The Redis
commands are the same for every revision, so the differences are the script's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from celery_debounce.store.redis.scripts import inline_includes, script_source

STUB = r"""
local hot
local R = {}
function R.TIME() return {'1700000000', '123456'} end
function R.HMGET()
  if hot then return {'id1', '1700000000123', '7200000', false, false} end
  return {false, false, false, false, false}
end
function R.EXISTS() return 0 end
function R.HINCRBY() return 5 end
function R.ZADD() return 1 end
function R.ZRANGE() return {} end
function R.PUBLISH() return 0 end
function R.HSET() return 1 end
function R.PEXPIRE() return 1 end
function R.HGET() return false end
redis = {call = function(c, ...) return R[c](...) end}
redis.pcall = redis.call
redis.error_reply = function(m) return {err = m} end
KEYS = {'debounce:{0}:open:1:t:hot', 'debounce:{0}:due'}
ARGV = {'id', '3600000', '7200000', '0', '', '[[1],{},{}]', ''}
return function(body, n, h)
  hot = h
  local t = os.clock()
  for i = 1, n do body() end
  return os.clock() - t
end
"""


def source_at(rev: str) -> str:
    """gate.lua at a git revision, its includes inlined."""
    raw = subprocess.run(
        ["git", "show", f"{rev}:celery_debounce/store/redis/lua/gate.lua"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return inline_includes(raw, f"{rev}:gate.lua")


def main(revs: list[str], loop: int = 100_000, rounds: int = 9) -> None:
    import lupa.lua51 as lua51

    texts = {"tree": script_source("gate")} | {rev: source_at(rev) for rev in revs}
    runs: dict[str, Any] = {}
    for name, text in texts.items():
        runtime = lua51.LuaRuntime()
        bench = runtime.execute(STUB)
        body = runtime.execute("return function()\n" + text + "\nend")
        bench(body, 2000, True)
        bench(body, 2000, False)
        runs[name] = (bench, body)
    best: dict[tuple[str, bool], float] = {}
    for n in range(rounds):
        for hot in (True, False):
            for name in list(texts)[:: 1 if n % 2 == 0 else -1]:
                bench, body = runs[name]
                usec = bench(body, loop, hot) * 1e6 / loop
                best[name, hot] = min(usec, best.get((name, hot), usec))
    for hot in (True, False):
        for name in texts:
            print(
                f"{'join (hot key)' if hot else 'open (cold key)':16s} {name:12s} "
                f"{best[name, hot]:.2f} usec of Lua per call"
            )


if __name__ == "__main__":
    main(sys.argv[1:], int(os.environ.get("LOOP", "100000")))
