-- cancel.lua: drop a pending window so that it never runs.
--
-- KEYS[1]  <tag>:open:<ident>  hash; deleted
-- KEYS[2]  <tag>:due           zset; ident removed
-- KEYS[3]  <tag>:stats         hash; x|<task> cancelled windows of the task, +1;
--                              expires ARGV[3] ms later (history TTL)
-- ARGV[1]  ident
-- ARGV[2]  task id the window must have ("" for whichever window is open): a
--          by-id cancel must not hit a newer window opened under the same ident
-- ARGV[3]  history TTL ms
--
-- Only pending windows can be cancelled: once taken, a window is the broker's.
-- Returns {task id, calls absorbed} of the cancelled window, or false if none was open.

local found = redis.call('HMGET', KEYS[1], 'id', 'n')
if not found[1] then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return false
end
if ARGV[2] ~= '' and found[1] ~= ARGV[2] then
  return false
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[1])
local digits = string.match(ARGV[1], '^(%d+):')
local task = string.sub(ARGV[1], #digits + 2, #digits + 1 + tonumber(digits))
redis.call('HINCRBY', KEYS[3], 'x|' .. task, 1)
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return {found[1], tonumber(found[2])}
