-- flush.lua: make a pending window due now, as if its deadline had passed.
--
-- KEYS[1]  <tag>:open:<ident>  hash; field id read
-- KEYS[2]  <tag>:due           zset; ident scored now (the pending window's deadline)
-- ARGV[1]  ident     ARGV[2]  wake channel (published to, so dispatchers take it at once)
-- ARGV[3]  task id the window must have ("" for whichever window is open): a
--          by-id flush must not hit a newer window opened under the same ident
--
-- Returns the window's task id, or false if no (matching) window is open for ident.

local id = redis.call('HGET', KEYS[1], 'id')
if not id or (ARGV[3] ~= '' and id ~= ARGV[3]) then
  return false
end
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('PUBLISH', ARGV[2], now)
return id
