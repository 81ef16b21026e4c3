-- doctor_runs.lua: `celery debounce doctor`: debounce_exclusive run markers without a
-- live window, and held windows whose runner is gone. Decided per ident in this one
-- script (take.lua sets a marker, finish.lua/expire.lua/take.lua free it and the window
-- held behind it atomically), so a run starting or ending meanwhile is never a finding.
--
-- KEYS[1]  <tag>:held  zset ident -> held since ms; with repair, <ident> leaves it
-- Touches, by name (same tag):
--   <tag>:run:<ident>  hash, field id (read; deleted with repair)
--   <tag>:win:<id>     field st read ("dispatching", "queued", "claimed": live)
--   <tag>:claims       zset; ZSCORE of a claimed runner (a claim without an entry never
--                      lapses)
--   <tag>:open:<ident> EXISTS, field hs read
--   <tag>:due          zset; with repair, a window held behind a freed key is due now
-- ARGV[1]  <tag>    ARGV[2]  "1": repair, "0": only report
-- ARGV[3]  held-too-long ms    ARGV[4..]  idents
--
-- Returns {ident, problem, runner id or ""} per finding; problem is one of
-- "run_without_window" (the marker names a record that is gone or not live),
-- "claim_without_lease" (the marker names a claimed record with no claims entry),
-- "held_without_run" (held, no marker), "held_without_window" (held, no open window),
-- "held_too_long" (held longer than ARGV[3] behind a live run: never repaired here, a
-- run that long or its message lost; the runner's state is the third element).

--@include now
--@include keys

local tag = ARGV[1]
local repair = ARGV[2] == '1'
local found = {}
local now = now_ms()

local function release(ident)
  redis.call('DEL', run_key(tag, ident))
  if redis.pcall('ZREM', KEYS[1], ident) == 1 and
      type(redis.pcall('HGET', open_key(tag, ident), 'hs')) == 'string' then
    redis.call('ZADD', due_key(tag), now, ident)
  end
end

local held_limit = tonumber(ARGV[3])
for i = 4, #ARGV do
  local ident = ARGV[i]
  local runner = redis.pcall('HGET', run_key(tag, ident), 'id')
  local held = redis.pcall('ZSCORE', KEYS[1], ident)
  if type(runner) == 'string' then
    local st = redis.pcall('HGET', win_key(tag, runner), 'st')
    if st ~= 'dispatching' and st ~= 'queued' and st ~= 'claimed' then
      found[#found + 1] = {ident, 'run_without_window', runner}
      if repair then release(ident) end
    elseif st == 'claimed' and not redis.pcall('ZSCORE', claims_key(tag), runner) then
      found[#found + 1] = {ident, 'claim_without_lease', runner}
      if repair then  -- as a lapsed claim: the run is stale, its key free
        local key = win_key(tag, runner)
        redis.call('ZREM', active_key(tag), runner)
        redis.call('HSET', key, 'st', 'stale', 'sa', string.format('%d', now))
        release(ident)
      end
    elseif type(held) == 'string' and tonumber(held) < now - held_limit then
      found[#found + 1] = {ident, 'held_too_long', runner .. ' ' .. st}
    end
  elseif type(held) == 'string' then
    if redis.call('EXISTS', open_key(tag, ident)) == 0 then
      found[#found + 1] = {ident, 'held_without_window', ''}
      if repair then redis.call('ZREM', KEYS[1], ident) end
    else
      found[#found + 1] = {ident, 'held_without_run', ''}
      if repair then release(ident) end
    end
  end
end
return found
