-- layouts.lua: the shard layouts (`debounce_shards`, cluster or not) whose dispatchers
-- took windows lately, so a dispatcher of another layout drains their shards (a
-- lowered `debounce_shards` leaves windows under tags the new value never reads).
--
-- KEYS[1]  <prefix>:layouts  hash layout name (layout.layout_name) -> ms last written;
--                            expires ARGV[1] after the last write
-- ARGV[1]  how long a layout is remembered after its last write (ms: the history TTL)
-- ARGV[2..]  layout names to write now (a dispatcher's own, after it took windows;
--            another one it drains whose shards still hold windows)
--
-- Fields older than ARGV[1] are deleted. Returns {now ms, name, ms, name, ms, ...}.

--@include now

local now = now_ms()
local keep = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], string.format('%d', now))
end
if #ARGV > 1 then
  redis.call('PEXPIRE', KEYS[1], keep)
end
local reply = {now}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local seen = tonumber(all[i + 1])
  if seen and seen >= now - keep then
    reply[#reply + 1] = all[i]
    reply[#reply + 1] = all[i + 1]
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return reply
