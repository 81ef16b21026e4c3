-- doctor_open.lua: `celery debounce doctor`: open windows that have no due entry (no
-- dispatcher would ever take them). Decided per window in this one script, so a window
-- opened, taken, flushed or cancelled meanwhile is never a finding.
--
-- KEYS[1]  <tag>:due            zset ident -> deadline ms; with repair, ZADD <now> ident
-- Reads, by name (same tag): <tag>:open:<ident>  (EXISTS only)
-- ARGV[1]  <tag>    ARGV[2]  "1": repair, "0": only report    ARGV[3..]  idents
--
-- Returns the idents found (with repair: made due now, so the next take runs them).

--@include now
--@include keys

local tag = ARGV[1]
local repair = ARGV[2] == '1'
local found = {}
local now = nil
for i = 3, #ARGV do
  local ident = ARGV[i]
  if redis.call('EXISTS', open_key(tag, ident)) == 1 and
      not redis.call('ZSCORE', KEYS[1], ident) then
    found[#found + 1] = ident
    if repair then
      now = now or now_ms()
      redis.call('ZADD', KEYS[1], now, ident)
    end
  end
end
return found
