-- cancel.lua: drop a pending window so that it never runs.
--
-- KEYS[1]  <tag>:open:<ident>  hash; deleted
-- KEYS[2]  <tag>:due           zset; ident removed
-- ARGV[1]  ident
--
-- Only pending windows can be cancelled: once taken, a window is the broker's.
-- Returns the cancelled window's task id, or false if none was open.

local id = redis.call('HGET', KEYS[1], 'id')
redis.call('ZREM', KEYS[2], ARGV[1])
if not id then
  return false
end
redis.call('DEL', KEYS[1])
return id
