-- take.lua: take due windows out of the due set for publishing, atomically.
--
-- KEYS[1]  <tag>:due      zset ident -> deadline ms (pending windows)
-- KEYS[2]  <tag>:leased   zset task id -> lease expiry ms (taken, publish not confirmed)
-- KEYS[3]  <tag>:stats    hash of counters per task, bumped once per window taken from
--                         the due set (never per call; see docs/operations.md):
--                         r|<task> runs   c|<task> calls in them   f|<task> forced by max wait
--                         l<b>|<task> windows taken late by lateness bucket b (ARGV[10..])
--                         m|<task> windows closed by their call cap or full (gate.lua set cx)
--                         e|<task> leading runs (gate.lua set ld)
--                         (gate.lua also bumps s|<task>, suppressed calls, here)
--                         expires ARGV[5] ms after the last window counted
-- Touches, by name (same hash tag):
--   <tag>:open:<ident>  renamed to <tag>:win:<id>; closes the window to new calls.
--                       Never renamed over an existing key (RENAMENX): if win:<id> exists
--                       (a window opened under a reused id before gate.lua checked ids,
--                       or a foreign key), the window is taken under the id
--                       <id>~<now>~<n> instead and <id> is recorded as its alias
--                       (fields na, a<na> = {"id": <id>}, see gate.lua)
--   <tag>:win:<id>      hash, fields of gate.lua plus
--                       dl deadline ms (the window's due score when it was taken)
--                       st state ("dispatching", "queued", "claimed", "finished")
--                       i  ident      ta taken ms     tries  times taken
--   <tag>:ids           hash; <id> removed when it maps to the taken window's ident
--   <tag>:calls:<cl>    a collect window's call list (record field cl): read and
--                       deleted when the window is first taken; the record's p, cb
--                       written, cl removed (see below)
--   <tag>:active        zset task id -> ms handed to the broker; at most PRUNE ids
--                       older than the record TTL whose win:<id> is gone are removed
--                       (a run killed without acks_late never finishes its record)
--   <tag>:claims       zset task id -> claim lease expiry ms (claim.lua, renew.lua): at
--                      most PRUNE ids whose lease passed are released: the id leaves
--                      the claims and active sets and a "claimed" record becomes
--                      "stale" (sa: ms), so nothing waits behind a dead run; one that
--                      a duplicate delivery was skipped for (field rd, claim.lua) is
--                      made "dispatching" with an expired lease instead, so
--                      it is published again by the next take; one claimed on the
--                      last delivery its quorum queue allows (field lv, claim.lua),
--                      whose message nothing delivers again, is made "queued" (sa: ms)
--                      and added to <tag>:expiring scored 0: expire.lua finishes it
--                      (REVOKED) and frees its exclusive key, and a dispatcher stores
--                      the outcome for its ids
--   <tag>:run:<ident>  hash, field id: the id of the debounce_exclusive window of <ident> in
--                      progress, set when such a window is taken (its stored options
--                      carry the header "debounce_exclusive"), deleted when its run
--                      ends (finish.lua) or its claim lapses (above)
--   <tag>:held         zset ident -> held since ms: a due window whose <ident> has a
--                      window in progress (run:<ident> names a record that is
--                      dispatching, queued or claimed) is held: it stays open (calls
--                      join it) and in the due set, scored now + ARGV[3] (looked at
--                      again then: a run whose end is never seen, its message lost,
--                      cannot hold it longer), its record gets hs (held since, ms).
--                      When the run ends (finish.lua, a lapsed claim here) it leaves
--                      the set and its due score becomes now. When taken, an exclusive
--                      window counts h|<task> (holds) and hm|<task> (ms held)
-- ARGV[1]  <tag>          ARGV[2]  max windows to take
-- ARGV[3]  lease ms       ARGV[4]  record TTL ms (safety expiry of win records)
-- ARGV[5]  history TTL ms (expiry of the stats hash, and of the two zsets below)
-- ARGV[6]  dispatcher name; '' or absent: the two zsets below are not written
-- ARGV[7]  how many idents <tag>:hot keeps (the ARGV[7] with the most calls)
-- ARGV[8]  '' or the latest claim expiry (ms) that may lapse in this pass: what the
--          dispatcher's monotonic clock says this Redis's clock can read by now had it not
--          stepped (its last take + the time since + 1 s), less a step forward it saw
--          within the last claim lease; equal to or above now unless the clock stepped
--          forward, so the claims of runs still going, whose expiry such a step moved
--          into the past, are renewed before they could lapse
-- ARGV[9]  max bytes of bodies (debounce_dispatch_batch_bytes): no window is taken once
--          the bodies taken reach it, so a reply holds at most that plus one window (the
--          first whatever its size); windows left stay due (or leased) for the next take
-- ARGV[10..] upper bounds (ms) of the lateness buckets, ascending (layout.LATE_BUCKETS_MS);
--          bucket b (0-based) counts windows taken at most ARGV[10 + b] ms late, the
--          last one (index #bounds) everything above
-- Written only when ARGV[6] is given and this pass took windows (best effort, like the
-- stats; read by `celery debounce top` and the store gauges of metrics.py):
--   <tag>:hot          zset ident -> calls absorbed by its windows taken from the due set
--                      (ZINCRBY n, for windows of more than one call: a single call
--                      collapsed nothing), trimmed to the ARGV[7] highest; expires
--                      ARGV[5] ms after the last update
--   <tag>:dispatchers  zset dispatcher name -> ms of its last pass that took windows;
--                      names older than ARGV[5] ms are dropped; expires ARGV[5] ms after
--                      the last update
--
-- Windows whose lease expired while still "dispatching" are taken again first
-- (their dispatcher died or their publish failed); claimed or queued ones are
-- dropped from the lease set. A window flush.lua closed has tries 0 and an expired
-- lease: it is taken here (tries 1, ta now) and counted in the stats like a due window;
-- so is a window gate.lua closed at its call cap (field cx, read here: also m|<task>)
-- or as a leading run (field ld, read here: also e|<task>);
-- either gets the record TTL (ARGV[4]) again here (gate.lua's close sets none).
-- Returns {now ms, ms until the next deadline or lease expiry (-1: none), w1, w2, ...}
-- where each w is {id, ident, fs, dl, mw, n, ct, p, o, tries, cx, ld, fl} (mw: max wait ms,
-- the ceiling is fs + mw; cx "1" for a window closed by its call cap, "2" for a collect
-- window closed full, ld "1" for a leading run, fl the publish failures release.lua
-- counted against it: tries also counts takes a broker outage wasted); ct, o, cx, ld, fl may be nil
-- (application/json and {}: see gate.lua). A debounce_exclusive window that was held
-- has one more element after fl: the ms it was held.
--
-- A collect window (field cl, see gate.lua) gets its body here, the first time it is
-- taken: p becomes '[[[' .. the elements of <tag>:calls:<cl> joined by ',' .. ']],{},'
-- .. p (the embed) .. ']', cb its length, cl is removed and the list deleted; later
-- takes and the dispatcher see an ordinary window. A list that is missing or of the
-- wrong type gives no elements.
--
-- Maxmemory: the first write of every path is a ZREM (never grows memory), so at
-- maxmemory (noeviction) a take either writes nothing (nothing to take) or goes through;
-- Redis checks OOM only at a script's first write that may grow memory.
--
-- A key of the wrong Redis type (something else wrote to open:<ident> or win:<id>)
-- must not fail every pass and block the shard: such an entry leaves the due or
-- lease set, a win:<id> one is listed in <tag>:quarantine (zset id -> ms), and the
-- reply carries {key, error} (two elements) in place of a window for the dispatcher
-- to log. The wrong-typed key itself is left for an operator. The stats counters
-- are best effort: a wrong-typed stats key skips them.

--@include now
--@include close_to_record
--@include task_of
--@include keys

local now = now_ms()
local tag = ARGV[1]
local limit = tonumber(ARGV[2])
local lease_until = string.format('%d', now + tonumber(ARGV[3]))
local ttl = ARGV[4]
local out = {}
local taken = 0
local counted = 0
local observer = ARGV[6] or ''
local hot = nil
if observer ~= '' then
  hot = hot_key(tag)
end

local max_bytes = tonumber(ARGV[9])
local bytes = 0

-- Upper bounds (ms) of the lateness buckets (ARGV[10..]); the last bucket is everything above.
local LATE_MS = {}
for b = 10, #ARGV do
  LATE_MS[#LATE_MS + 1] = tonumber(ARGV[b])
end

local function count(ident, row, capped, leading)
  local task = task_of(ident)
  local dl = tonumber(row[4])
  redis.call('HINCRBY', KEYS[3], 'r|' .. task, 1)
  if capped then
    redis.call('HINCRBY', KEYS[3], 'm|' .. task, 1)
  end
  if leading then
    redis.call('HINCRBY', KEYS[3], 'e|' .. task, 1)
  end
  redis.call('HINCRBY', KEYS[3], 'c|' .. task, tonumber(row[6]))
  if dl >= tonumber(row[3]) + tonumber(row[5]) then
    redis.call('HINCRBY', KEYS[3], 'f|' .. task, 1)
  end
  local late = now - dl
  local bucket = #LATE_MS
  for b = 1, #LATE_MS do
    if late <= LATE_MS[b] then
      bucket = b - 1
      break
    end
  end
  redis.call('HINCRBY', KEYS[3], 'l' .. bucket .. '|' .. task, 1)
end

local function failed(reply)
  return type(reply) == 'table' and reply.err ~= nil
end

local function window(key)
  local row = redis.call('HMGET', key, 'id', 'i', 'fs', 'dl', 'mw', 'n', 'ct', 'p', 'o', 'tries',
    'cx', 'ld', 'cl', 'fl')
  if row[13] then  -- a collect window: splice its body (see the header)
    local list = calls_key(tag, row[13])
    local elements = redis.pcall('LRANGE', list, 0, -1)
    if failed(elements) then
      elements = {}
    end
    local body = '[[[' .. table.concat(elements, ',') .. ']],{},' .. (row[8] or '{}') .. ']'
    redis.call('HSET', key, 'p', body, 'cb', #body)
    redis.call('HDEL', key, 'cl')
    redis.call('DEL', list)
    row[8] = body
  end
  row[13] = row[14]  -- fl: publish failures counted against it (release.lua)
  row[14] = nil
  return row
end

local held = held_key(tag)

-- An exclusive window's run ended (or its claim lapsed): free its key, and put a
-- window held behind it back in the due set.
local function free_run(id, key, due)
  local ident = redis.pcall('HGET', key, 'i')
  if type(ident) ~= 'string' then
    return
  end
  local run = run_key(tag, ident)
  if redis.pcall('HGET', run, 'id') == id then
    redis.call('DEL', run)
    if redis.pcall('ZREM', held, ident) == 1 and
        type(redis.pcall('HGET', open_key(tag, ident), 'hs')) == 'string' then
      redis.call('ZADD', due, now, ident)
    end
  end
end

-- Claims whose lease passed: their worker died (or stopped renewing for a lease).
-- ZREM first (maxmemory: see below).
local claims = claims_key(tag)
-- A claims or held key of the wrong type (a foreign write) must not fail every take:
-- read and written with pcall, such a key is left alone (no claim lapses, no hold).
local lapse_upto = now
if ARGV[8] and ARGV[8] ~= '' then  -- after a step forward of this clock (see the header)
  lapse_upto = math.min(now, tonumber(ARGV[8]))
end
local lapsed = redis.pcall('ZRANGEBYSCORE', claims, '-inf', lapse_upto, 'LIMIT', 0, 20)
if failed(lapsed) then
  lapsed = {}
end
for _, id in ipairs(lapsed) do
  redis.call('ZREM', claims, id)
  local key = win_key(tag, id)
  local state = redis.pcall('HGET', key, 'st')  -- a wrong-typed key: an error, left alone
  if state == 'claimed' then
    redis.call('ZREM', active_key(tag), id)
    if redis.call('HGET', key, 'rd') then
      redis.call('HDEL', key, 'rd')
      redis.call('HSET', key, 'st', 'dispatching', 'sa', string.format('%d', now))
      redis.call('ZADD', KEYS[2], now, id)
    elseif redis.call('HGET', key, 'lv') then
      redis.call('HSET', key, 'st', 'queued', 'sa', string.format('%d', now))
      redis.call('ZADD', expiring_key(tag), 0, id)
    else
      redis.call('HSET', key, 'st', 'stale', 'sa', string.format('%d', now))
      free_run(id, key, KEYS[1])
    end
  end
end

-- A due window whose ident has an exclusive window in progress: held (see the header).
local function held_by_run(ident, open)
  local runner = redis.pcall('HGET', run_key(tag, ident), 'id')
  if type(runner) ~= 'string' then
    return false
  end
  local st = redis.pcall('HGET', win_key(tag, runner), 'st')
  if st == 'dispatching' or st == 'queued' or st == 'claimed' then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ident)
    if redis.pcall('ZADD', held, 'NX', now, ident) == 1 and
        not redis.call('HGET', open, 'hs') then
      redis.call('HSET', open, 'hs', string.format('%d', now))
    end
    return true
  end
  redis.call('DEL', run_key(tag, ident))
  redis.pcall('ZREM', held, ident)
  return false
end

-- An exclusive window taken: its key is in progress until its run ends. One that was
-- held gets the ms it was held as a 14th element of its row (after fl).
local function exclusive_taken(ident, id, key, row)
  redis.call('HSET', run_key(tag, ident), 'id', id)
  redis.call('PEXPIRE', run_key(tag, ident), ttl)
  local since = redis.call('HGET', key, 'hs')
  if since then
    redis.call('HDEL', key, 'hs')
    local task = task_of(ident)
    if task then
      redis.pcall('HINCRBY', KEYS[3], 'h|' .. task, 1)
      redis.pcall('HINCRBY', KEYS[3], 'hm|' .. task, now - tonumber(since))
    end
    row[14] = string.format('%d', now - tonumber(since))
  end
end

local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(expired) do
  if bytes >= max_bytes then
    break  -- the reply's bytes are reached: the rest stay leased for the next take
  end
  local key = win_key(tag, id)
  local st = redis.pcall('HGET', key, 'st')
  if failed(st) then
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZADD', quarantine_key(tag), now, id)
    taken = taken + 1
    out[taken] = {key, st.err}
  elseif st == 'dispatching' then
    -- ZREM first: under maxmemory Redis refuses a script only at its first write that
    -- may grow memory (ZADD, HSET, HINCRBY, ...) and only if it wrote nothing before.
    -- Every path of this script starts with a ZREM, so a take goes through at
    -- maxmemory and due leases never block the shard (docs/design.md, "Maxmemory")
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZADD', KEYS[2], lease_until, id)
    local tries = redis.call('HINCRBY', key, 'tries', 1)
    taken = taken + 1
    out[taken] = window(key)
    bytes = bytes + #(out[taken][8] or '')
    if tries == 1 then  -- flushed (flush.lua) or closed by its cap (gate.lua): first taken now
      redis.call('HSET', key, 'ta', string.format('%d', now))
      redis.call('PEXPIRE', key, ARGV[4])  -- the record TTL: gate.lua's cap close sets none
      if pcall(count, out[taken][2], out[taken], out[taken][11] ~= false,
          out[taken][12] ~= false) then
        counted = counted + 1
      end
      if out[taken][9] and string.find(out[taken][9], '"debounce_exclusive"', 1, true) then
        redis.call('HSET', run_key(tag, out[taken][2]), 'id', id)  -- flushed: in progress
        redis.call('PEXPIRE', run_key(tag, out[taken][2]), ttl)
      end
    end
  else
    redis.call('ZREM', KEYS[2], id)
  end
end

if taken < limit and bytes < max_bytes then
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES',
    'LIMIT', 0, limit - taken)
  for d = 1, #due, 2 do
    if bytes >= max_bytes then
      break  -- the reply's bytes are reached: the rest stay due for the next take
    end
    local ident = due[d]
    redis.call('ZREM', KEYS[1], ident)
    local open = open_key(tag, ident)
    local id = redis.pcall('HGET', open, 'id')
    if failed(id) then
      taken = taken + 1
      out[taken] = {open, id.err}
    elseif id and held_by_run(ident, open) then
      taken = taken  -- held: left open, due again later (see the header)
    elseif id then
      if redis.call('HGET', ids_key(tag), id) == ident then
        redis.call('HDEL', ids_key(tag), id)
      end
      local key
      key, id = close_to_record(tag, open, id, string.format('%d', now))
      redis.call('HSET', key, 'st', 'dispatching', 'i', ident, 'dl', due[d + 1],
        'ta', string.format('%d', now), 'tries', 1)
      redis.call('PEXPIRE', key, ttl)
      redis.call('ZADD', KEYS[2], lease_until, id)
      taken = taken + 1
      out[taken] = window(key)
      bytes = bytes + #(out[taken][8] or '')
      if pcall(count, ident, out[taken]) then
        counted = counted + 1
      end
      if out[taken][9] and string.find(out[taken][9], '"debounce_exclusive"', 1, true) then
        exclusive_taken(ident, id, key, out[taken])
      end
      local calls = tonumber(out[taken][6])
      if hot and calls and calls > 1 then
        redis.pcall('ZINCRBY', hot, calls, ident)
      end
    end
  end
end

if counted > 0 then
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
end

-- Bounded pruning of active ids whose record expired (never finished).
local PRUNE = 20
local active = active_key(tag)
local stale = redis.call('ZRANGEBYSCORE', active, '-inf',
  string.format('%d', now - tonumber(ttl)), 'LIMIT', 0, PRUNE)
for _, id in ipairs(stale) do
  if redis.call('EXISTS', win_key(tag, id)) == 0 then
    redis.call('ZREM', active, id)
  end
end

if hot and taken > 0 then
  local seen = dispatchers_key(tag)
  redis.pcall('ZREMRANGEBYRANK', hot, 0, -1 - tonumber(ARGV[7]))
  redis.pcall('PEXPIRE', hot, ARGV[5])
  redis.pcall('ZADD', seen, now, observer)
  redis.pcall('ZREMRANGEBYSCORE', seen, '-inf', now - tonumber(ARGV[5]))
  redis.pcall('PEXPIRE', seen, ARGV[5])
end

local next_in = -1
local first_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first_due[1] then
  next_in = math.max(0, tonumber(first_due[2]) - now)
end
local first_lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if first_lease[1] then
  local lease_in = math.max(0, tonumber(first_lease[2]) - now)
  if next_in < 0 or lease_in < next_in then
    next_in = lease_in
  end
end

local reply = {now, next_in}
for i = 1, taken do
  reply[i + 2] = out[i]
end
return reply
