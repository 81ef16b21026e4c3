-- finish.lua: the window's run ended (task_postrun with a final state).
--
-- KEYS[1]  <tag>:win:<id>  hash; st -> "finished", rs final Celery state, fa finished ms;
--                          p and o deleted; expires after the history TTL;
--                          na and a1 .. a<na> (aliases, see gate.lua) read and kept, so a
--                          redelivered run stores them again
-- KEYS[2]  <tag>:leased    zset; the id leaves it
-- KEYS[3]  <tag>:active    zset; the id leaves it
-- KEYS[4]  <tag>:claims    zset; the id leaves it (its claim lease ends)
-- Touches, by name (same tag): <tag>:run:<ident>, <tag>:held, <tag>:open:<ident>,
--   <tag>:due: the key of a debounce_exclusive window is freed (see take.lua)
-- ARGV[1]  task id    ARGV[2]  final Celery state    ARGV[3]  history TTL ms
--
-- Returns {1 if a record was finished else 0, now ms, alias 1, alias 2, ...}.

--@include now
--@include aliases
--@include tag
--@include keys

local now = now_ms()
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.pcall('ZREM', KEYS[4], ARGV[1])  -- pcall: a foreign key there never blocks a finish
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, now}
end
-- a debounce_exclusive window (take.lua set <tag>:run:<ident> to its id): its key is
-- free; a window held behind it (<tag>:held, its record has hs) is due now
local ident = redis.call('HGET', KEYS[1], 'i')
if ident then
  local tag = tag_of(KEYS[1])
  local run = run_key(tag, ident)
  if redis.pcall('HGET', run, 'id') == ARGV[1] then
    redis.call('DEL', run)
    if redis.pcall('ZREM', held_key(tag), ident) == 1 and
        type(redis.pcall('HGET', open_key(tag, ident), 'hs')) == 'string' then
      redis.call('ZADD', due_key(tag), now, ident)
    end
  end
end
redis.call('HSET', KEYS[1], 'st', 'finished', 'rs', ARGV[2], 'fa', string.format('%d', now))
redis.call('HDEL', KEYS[1], 'rd')
redis.call('HDEL', KEYS[1], 'p', 'o')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return aliases(KEYS[1], {1, now})
