-- renew.lua: a worker process renews the claims of the runs it is running.
--
-- KEYS[1]  <tag>:claims   zset task id -> claim lease expiry ms
-- ARGV[1]  claim lease ms   ARGV[2..]  task ids
--
-- Only ids still in the set are renewed (XX): a claim take.lua released as stale, or
-- one finish.lua removed, is not brought back. Returns {now ms, how many were renewed}.

--@include now

local now = now_ms()
local until_ms = now + tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', until_ms, ARGV[i])
end
return {now, renewed}
