-- doctor_calls.lua: `celery debounce doctor`: debounce_collect call lists whose window
-- is gone. The caller passes only lists whose suffix no open window named during a scan
-- that began after the lists were listed; here a list still there whose flushed or
-- closed window (win:<id>, field cl) does not name it either is a finding.
--
-- Touches, by name (same tag): <tag>:calls:<cl> (EXISTS; deleted with repair),
--   <tag>:win:<id> field cl read (<id>: <cl> up to its first "~")
-- KEYS[1]  <tag>:due  (not touched: names the slot)
-- ARGV[1]  <tag>    ARGV[2]  "1": repair, "0": only report    ARGV[3..]  list suffixes
--
-- Returns the suffixes found.

--@include keys

local tag = ARGV[1]
local repair = ARGV[2] == '1'
local found = {}
for i = 3, #ARGV do
  local cl = ARGV[i]
  local key = calls_key(tag, cl)
  if redis.call('EXISTS', key) == 1 then
    local id = string.match(cl, '^([^~]*)')
    if redis.pcall('HGET', win_key(tag, id), 'cl') ~= cl then
      found[#found + 1] = cl
      if repair then redis.call('DEL', key) end
    end
  end
end
return found
