-- claim.lua: a worker is about to run the window's message (task_prerun).
--
-- KEYS[1]  <tag>:win:<id>  hash; st "dispatching"/"queued"/"stale" -> "claimed", ca claimed ms,
--                          lv "1" (ARGV[7]) or deleted, rd deleted (read: st)
-- KEYS[2]  <tag>:leased    zset; the id leaves it (never taken again)
-- KEYS[3]  <tag>:active    zset; the id is added (NX, scored now) and stays until finished
-- KEYS[4]  <tag>:claims    zset task id -> claim lease expiry ms (now + ARGV[2]); renewed by
--                          the running worker (renew.lua), removed by finish.lua, and a
--                          claim past its expiry is released by take.lua (state "stale")
-- ARGV[1]  task id   ARGV[2]  claim lease ms   ARGV[3]  "1": a retry of the run (it takes
--          the claim over)   ARGV[4]  task name (stats)   ARGV[5]  history TTL ms (stats)
-- ARGV[6]  (debounce_redis_wait_replicas only) the window's ident, as the dispatcher sent
--          it (header debounce_ident), or '': a record that is gone while the window
--          is still open under this id (<tag>:open:<ident>, field id) was never taken on
--          this master (its take, publish and claim were on a master a failover
--          demoted): a skip (state "pending"); this master's dispatcher publishes it
-- ARGV[7]  (optional) "1": this delivery is the last its quorum queue allows
--          (deliveries.py): the claim is marked (field lv 1), so that take.lua, should it
--          lapse (the whole worker killed), hands the window to the expiry sweep: nothing
--          delivers it again
--
-- Effectively once: a delivery of a window that is finished, or claimed under a live
-- lease, is a duplicate (a dispatcher killed after publish and before ack, a failover
-- republishing, a broker redelivery): it must not run. It is counted (stats d|<task>)
-- and a claimed one is marked (field rd 1): if that claim then goes stale, take.lua
-- publishes the window again instead of leaving it to a redelivery that was skipped.
-- A claim whose lease passed (its worker died, take.lua has not released it yet) is
-- taken over. A quarantined record, or one that is gone, runs as before (not claimed).
-- Returns {state before the claim ("" if the record is gone), now ms, 1 run / 0 skip}.

--@include now
--@include tag
--@include keys

local now = now_ms()
local st = redis.call('HGET', KEYS[1], 'st')
if not st then
  if ARGV[6] and ARGV[6] ~= '' then
    local tag = tag_of(KEYS[1])
    if redis.pcall('HGET', open_key(tag, ARGV[6]), 'id') == ARGV[1] then
      return {'pending', now, 0}
    end
  end
  return {'', now, 1}
end
redis.call('ZREM', KEYS[2], ARGV[1])
local live = false
if st == 'claimed' and ARGV[3] ~= '1' then
  local until_ms = redis.call('ZSCORE', KEYS[4], ARGV[1])
  live = until_ms and tonumber(until_ms) > now
end
if st == 'finished' or live then
  if st == 'claimed' then
    redis.call('HSET', KEYS[1], 'rd', '1')
  end
  local stats = stats_key(tag_of(KEYS[1]))
  if pcall(redis.call, 'HINCRBY', stats, 'd|' .. ARGV[4], 1) then
    redis.call('PEXPIRE', stats, ARGV[5])
  end
  return {st, now, 0}
end
if st == 'dispatching' or st == 'queued' or st == 'stale' or st == 'claimed' then
  redis.call('HSET', KEYS[1], 'st', 'claimed', 'ca', string.format('%d', now))
  redis.call('HDEL', KEYS[1], 'rd')
  if ARGV[7] == '1' then
    redis.call('HSET', KEYS[1], 'lv', '1')
  else
    redis.call('HDEL', KEYS[1], 'lv')
  end
  redis.call('ZADD', KEYS[3], 'NX', now, ARGV[1])
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[2]), ARGV[1])
end
return {st, now, 1}
