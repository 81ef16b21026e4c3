-- find.lua: look for the pending window that has a given task id (one ZSCAN step).
--
-- KEYS[1]  <tag>:due   zset ident -> deadline ms (read only)
-- Reads, by name (same hash tag): <tag>:open:<ident>  field id
-- ARGV[1]  <tag>    ARGV[2]  ZSCAN cursor ("0" to start)    ARGV[3]  COUNT hint
-- ARGV[4]  task id
--
-- Pending windows are keyed by ident, not by id, and no id index is kept (it
-- would cost every opened window a write): the caller repeats this until the
-- cursor comes back "0". Each call blocks Redis for about COUNT HGETs only.
-- Returns {next cursor, ident or ""}.

--@include keys

local tag = ARGV[1]
local step = redis.call('ZSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3])
local members = step[2]
for i = 1, #members, 2 do
  local ident = members[i]
  if redis.call('HGET', open_key(tag, ident), 'id') == ARGV[4] then
    return {step[1], ident}
  end
end
return {step[1], ''}
