-- release.lua: hand back windows whose publish failed, to be retried later.
--
-- KEYS[1]  <tag>:leased   zset task id -> lease expiry ms; the expiry moves to now + delay
-- Reads, by name (same hash tag): <tag>:win:<id>  st, tries
-- ARGV[1]  retry delay ms     ARGV[2]  <tag>
-- ARGV[3..]  pairs: task id, its `tries` as take.lua returned it to this dispatcher;
--            `<tries>!` also counts a publish failure against the window (HINCRBY fl 1,
--            the count MAX_TRIES applies to: a broker outage is never counted)
--
-- Only leases that are still this dispatcher's are moved: the id is still leased,
-- the record is still "dispatching" and its `tries` is the caller's. A window claimed
-- meanwhile has left the lease set; one whose lease expired and that another
-- dispatcher took again has a higher `tries`, and that dispatcher's lease is left
-- alone. Returns {how many were released, now ms (expiry = now + ARGV[1])}.

--@include now
--@include keys

local now = now_ms()
local at = string.format('%d', now + tonumber(ARGV[1]))
local released = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local key = win_key(ARGV[2], id)
  local tries, counted = string.match(ARGV[i + 1], '^(.-)(!?)$')
  local rec = redis.pcall('HMGET', key, 'st', 'tries')
  -- ZREM then ZADD (not ZADD XX): the first write never grows memory, so at maxmemory
  -- a release goes through (Redis refuses a script under OOM only at its first write
  -- that may grow memory, if it wrote nothing before; docs/design.md, "Maxmemory")
  if rec[1] == 'dispatching' and rec[2] == tries and
      redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('ZADD', KEYS[1], at, id)
    if counted == '!' then
      redis.call('HINCRBY', key, 'fl', 1)
    end
    released = released + 1
  end
end
return {released, now}
