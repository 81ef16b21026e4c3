-- release.lua: hand back windows whose publish failed, to be retried later.
--
-- KEYS[1]  <tag>:leased   zset task id -> lease expiry ms
-- ARGV[1]  retry delay ms     ARGV[2..]  task ids
--
-- Only windows still leased are touched (XX): a window claimed in the meantime
-- has left the lease set and stays out. Returns how many were released.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local at = string.format('%d', now + tonumber(ARGV[1]))
local released = 0
for i = 2, #ARGV do
  released = released + redis.call('ZADD', KEYS[1], 'XX', 'CH', at, ARGV[i])
end
return released
