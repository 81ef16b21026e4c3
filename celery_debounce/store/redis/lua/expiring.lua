-- expiring.lua: remember when the messages just published expire (a window with
-- `expires`), so a message the broker discards unseen still finishes its window
-- (expire.lua).
--
-- KEYS[1]  <tag>:expiring  zset task id -> when its message expires (ms); the key
--                          expires with its latest member (+ ARGV[1])
-- ARGV[1]  slack ms (kept past the last expiry)   ARGV[2..]  task id, ms left, ...
--
-- Returns {now ms, ids added}.

--@include now

local now = now_ms()
local added = 0
for i = 2, #ARGV, 2 do
  local at = now + math.floor(tonumber(ARGV[i + 1]))
  redis.call('ZADD', KEYS[1], string.format('%d', at), ARGV[i])
  added = added + 1
end
local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIRE', KEYS[1], math.max(0, tonumber(last[2]) - now) + tonumber(ARGV[1]))
end
return {now, added}
