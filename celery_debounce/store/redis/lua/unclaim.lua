-- unclaim.lua: undo a claim that too few replicas acknowledged (debounce_redis_wait_replicas).
--
-- KEYS[1]  <tag>:win:<id>  hash; st "claimed" -> ARGV[3] (the state before the claim)
-- KEYS[2]  <tag>:leased    zset; not touched (claim.lua removed the id: never taken again)
-- KEYS[3]  <tag>:active    zset; the id leaves it if the state before was "stale"
-- KEYS[4]  <tag>:claims    zset; the id leaves it ("dispatching"/"queued"/"stale"), or
--                          its lease ends now (a lapsed "claimed" one that was taken over)
-- ARGV[1]  task id   ARGV[2]  the claim's time (ms, field ca, claim.lua's reply)
-- ARGV[3]  state before the claim
--
-- Only the claim of that time is undone: a later claim of the window (another delivery)
-- is left alone. The delivery whose claim this was goes through the broker again; the
-- window is then as it was before it, so that delivery, or another one, claims it.
-- Returns 1 if undone, else 0.

--@include now

if redis.call('HGET', KEYS[1], 'st') ~= 'claimed' or
    redis.call('HGET', KEYS[1], 'ca') ~= ARGV[2] then
  return 0
end
redis.pcall('ZREM', KEYS[4], ARGV[1])  -- the first write shrinks (maxmemory: design.md)
if ARGV[3] == 'claimed' then
  local now = now_ms()
  redis.call('ZADD', KEYS[4], now, ARGV[1])
  return 1
end
redis.call('HSET', KEYS[1], 'st', ARGV[3])
if ARGV[3] == 'stale' then
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return 1
