-- gate.lua: open a debounce window or join the open one, in one atomic step.
--
-- KEYS[1]  <prefix>:{<shard>}:open:<ident>   hash, the open window (see docs/design.md)
--            id  task id        fs  first_seen ms     mw  max wait ms (ceiling = fs + mw)
--            n   calls absorbed ct  payload content type
--            p   payload        o   opener's options (JSON)
--            tr  1 on a trailing window (opened during a quiet period, see below)
--            e   the opener's embed JSON, only when ct is not JSON (see ARGV[4])
--            ct is left out when it is application/json and o when it is {}
--            (readers use those defaults). The deadline is not stored here: it is
--            the window's score in the due set.
-- KEYS[2]  <prefix>:{<shard>}:due            zset ident -> deadline ms
-- ARGV (each bound once to a named local at the top of the code, below):
-- ARGV[1]  task id to use if this call opens the window
-- ARGV[2]  window ms          ARGV[3]  max wait ms
-- ARGV[4]  the producer's contract version (docs/contract.md), then ':', then "1" to
--          replace the payload of an open window, else "0"; for a payload that is not
--          JSON, followed by the call's protocol-2 embed as JSON ({} without links):
--          '1:0', '1:1', '1:1{}'. A version other than CONTRACT (below), or none, is
--          refused with an error reply 'DEBOUNCE_CONTRACT_MISMATCH producer <p> gate <g>'
--          before anything is read or written.
--          A replacing join keeps the window's content type and embed (the opener's): a
--          JSON body gets the call's [args, kwargs spliced before the window's embed (both
--          found from the end of the bodies); another content type is replaced whole when
--          the call's embed is the window's e. A call of another content type, or of
--          another embed under another content type, is refused with an error reply
--          starting DEBOUNCE_REPLACE_REFUSED, before anything is written.
-- ARGV[5]  payload content type, '' for application/json
-- ARGV[6]  payload            ARGV[7]  opener's options JSON, '' for {}
-- Only for a call whose id the caller fixed (task_id=, canvas); absent for default calls:
-- ARGV[8]  the call's alias (JSON {"id": ARGV[1], canvas options}), see aliases.py
-- ARGV[9]  fallback task id: used to open the window when ARGV[1] is already in use
-- ARGV[10] "1" to record the alias also when the call opens the window under ARGV[1]
--          (a canvas call), else "0"
-- ARGV[11] most aliases a window records (MAX_ALIASES)
-- Only for a call with debounce_max_calls; absent otherwise (a call with a cap and no
-- fixed id sends ARGV[8] .. ARGV[11] as ''):
-- ARGV[12] the call's max calls (an integer >= 1); stored as field mc when the call
--          opens the window: a window's cap is its opener's (like mw). A join reads mc
--          whatever it sent itself.
-- Only for a call with debounce_leading=True; absent for a trailing-only call, which
-- ignores the edge state entirely (a leading call with no cap and no fixed id sends
-- ARGV[8] .. ARGV[12] as ''):
-- ARGV[13] the call's edge mode: 'L' leading only, 'B' leading and trailing
-- ARGV[14] history TTL ms: expiry of <tag>:stats, bumped for a suppressed call
-- The quiet period, by name with KEYS[1]'s tag:
--   <tag>:quiet:<ident>  hash, the quiet period that follows a leading run
--            id  the leading run's task id    fs  the leading call's time ms
--            mw  the leading call's max wait ms (the quiet period never outlasts fs + mw)
--            dl  end of the quiet period ms: min(now + window, fs + mw), moved by every
--                edge call (ARGV[13] given) that finds it running (now < dl)
--            n   calls it holds, the leading call included
--            m   the leading call's ARGV[13]
--          PEXPIREAT dl (the key lives as long as the quiet period; a reader also
--          checks now < dl, so expiry timing never matters)
--   <tag>:stats          hash; s|<task> + 1 for a suppressed call, PEXPIRE ARGV[14]
-- Every call that is not refused (suppressed ones included) counts itself in
-- <tag>:stats field i|<task> (calls in, read by `top`; best effort: a wrong-typed key
-- skips it). A call that adds the task's field to a hash without a TTL (one it created)
-- gives it one: ARGV[14], or an hour without it (take.lua sets debounce_history_ttl when
-- it counts a window).
-- An edge call:
--   * quiet period running (now < dl): the call moves dl and counts itself in n.
--     Mode 'L': suppressed; it writes nothing else but the s|<task> counter and
--     returns the leading run's id (the run that carries its effect).
--     Mode 'B': joins the open window, or opens one that
--     inherits fs and mw from the quiet period (deadline = the quiet period's end,
--     never later than the leading call's ceiling) with field tr 1 (trailing)
--   * no quiet period and no open window: a leading call. The window opens as usual
--     and is closed at once as the cap closes it (below) with ld 1 (leading) instead
--     of cx 1: the dispatcher publishes it on its next pass; take.lua sets its record
--     TTL and counts e|<task> when it first takes it.
--     The quiet period starts (id, fs now, mw ARGV[3], dl now + window, n 1, m)
--   * no quiet period and a window open (opened by a trailing-only call, or a
--     trailing window past its deadline not yet taken): joins it as any call
-- The ident (the due member) and the wake channel (<prefix>:wake, or <tag>:wake, see
-- "Wake-ups" below) are read from KEYS[1]: the prefix has no braces, so the first
-- '}' ends the tag (lib/tag.lua), and the ident follows '}:open:' (lib/keys.lua). The wake channel is published to when this window becomes
-- the earliest one.
-- Only with ARGV[8], touches by name (same hash tag <tag> as KEYS[1]):
--   <tag>:win:<ARGV[1]>  EXISTS: a taken record holds the id, so it is in use
--   <tag>:ids            hash id -> ident of the pending windows opened under a fixed id;
--                        an id in it whose open:<ident> still has that id is in use;
--                        set here when a window opens under ARGV[1]
--   KEYS[1] also gets  na  aliases recorded    a<k>  the k-th alias (k = 1 .. na)
-- A window never opens under an id in use (a record is never overwritten): it opens
-- under ARGV[9] and records the alias. A call joining a window that has another id
-- records its alias. Past ARGV[11] aliases the call is refused with an error reply
-- starting DEBOUNCE_ALIASES_FULL, before anything is written.
-- The cap: when a window with mc reaches n >= mc calls (this call included; the
-- opener itself when mc is 1), the call closes it as flush.lua does, in the same step:
--   KEYS[2]              ident removed
--   <tag>:ids            <id> removed when it maps to ident
--   <tag>:open:<ident>   renamed to <tag>:win:<id> (never over an existing key: then
--                        to <tag>:win:<id>~<now>~<k> with <id> as its alias, fields
--                        na, a<na> = {"id": <id>}), then st "dispatching", i ident,
--                        dl now, tries 0, cx 1 (closed by the cap). No TTL here (a
--                        joiner may send no cap, so no settings): take.lua sets the
--                        record TTL when it first takes it and counts m|<task>
--   <tag>:leased         the window's id scored now: a lease already expired, so the
--                        next take.lua pass (of any dispatcher) takes it first
--   the wake channel     published to (now)
-- All by name with KEYS[1]'s tag. The next call opens a new window. A window without
-- mc (or cl, below) costs one more HMGET field each, nothing else.
-- Only for a debounce_collect call; absent otherwise (ARGV[8..14] sent as '' when not given):
-- (no call sends both ARGV[13] and ARGV[15]: debounce_collect with debounce_leading=True
-- is refused before the gate, see docs/design.md; a collect call sends ARGV[13..14] as '')
-- ARGV[15] the call's byte budget (debounce_max_payload_bytes): stored as cz when the
--          call opens the window (a window's budget is its opener's, like mc)
-- ARGV[16] the call's protocol-2 embed JSON ({} without links), stored as p when the call
--          opens the window
-- ARGV[6] is then the call's JSON [args, kwargs(, id)]; its element is
-- '[' .. now .. ',' followed by ARGV[6] without its '[' (collect.py owns the format).
-- Only for a collect call, touches by name (same hash tag <tag> as KEYS[1]):
--   <tag>:calls:<cl>     list: the call's element RPUSHed (EXISTS when a window opens,
--                        to pick a cl no live list has)
-- A collect window's record also has (every call reads cl, one more HMGET field):
--   cl  the suffix of its call list <tag>:calls:<cl> (the id it opened under, with
--       ~<k> appended if such a list exists): a list of elements, in call order
--   cb  bytes of the body take.lua will splice: 10 + #embed + the elements + commas
--   cz  its byte budget; cb never exceeds it
-- A collect call that does not fit (cb + 1 + #element > cz) closes the window as the
-- cap does (cx 2: full) and opens a new one (it never joins, is never dropped); one
-- whose element cannot fit an empty window (10 + #ARGV[16] + #element > ARGV[15]) is
-- refused with an error reply starting DEBOUNCE_PAYLOAD_TOO_LARGE, nothing written.
-- A call whose mode differs from the open window's (a collect call and a window
-- without cl, or the reverse: a deploy changed the task) closes that window as flush.lua
-- does (no cx) and opens a new one.
--
-- Wake-ups: with SHARDED_WAKE false (as stored; a single node) PUBLISH to <prefix>:wake.
-- On a Redis Cluster whose masters have sharded pub/sub the store loads this script
-- with SHARDED_WAKE true (store.script_source): SPUBLISH to <tag>:wake instead, a
-- channel in KEYS[1]'s slot (<tag> = <prefix>:{<shard tag>}, read from KEYS[1]).
--
-- Returns {task id, 1 if opened else 0, deadline ms (now when the cap closed it),
-- calls, now ms}; a leading call adds a sixth element 'lead', a suppressed call
-- 'suppressed' (then the deadline is the quiet period's end and calls its n).
-- Time is Redis server time, never the producer's.

--@include now
--@include tag
--@include task_of
--@include close_to_record
--@include keys

local SHARDED_WAKE = false

-- ARGV, bound once to the names the code below uses (what each means: the header).
-- An optional group starts at the position store/redis/codec.py names in the comment
-- (tests/store/redis/test_lua_library.py checks both agree); a group not sent is nil or ''.
local opener_id = ARGV[1]
local window_ms = ARGV[2]
local max_wait_ms = ARGV[3]
local versioned = ARGV[4]  -- '<contract version>:<replace flag>[<embed>]'
local content_type = ARGV[5]
local payload = ARGV[6]
local options = ARGV[7]
local alias_json = ARGV[8]  -- fixed id group (gate_args' FixedId)
local fallback_id = ARGV[9]
local alias_on_open = ARGV[10]
local max_aliases = ARGV[11]
local max_calls = ARGV[12]  -- codec.CAP_ARGV
local edge = ARGV[13]  -- codec.EDGE_ARGV
local history_ttl = ARGV[14]
local budget = ARGV[15]  -- codec.COLLECT_ARGV
local collect_embed = ARGV[16]

-- The contract this gate speaks (docs/contract.md; options.CONTRACT_VERSION): a producer
-- of another one is refused before anything is read or written.
local CONTRACT = '1'
local contract, replace_arg = string.match(versioned or '', '^(%d+):(.*)$')
if contract ~= CONTRACT then
  return redis.error_reply('DEBOUNCE_CONTRACT_MISMATCH producer ' .. (contract or 'none') ..
    ' gate ' .. CONTRACT .. ': this producer speaks another version of the gate contract ' ..
    '(docs/contract.md); upgrade the producer or the package so that both speak one')
end

-- Bound once: the time, the keys and names read from KEYS[1].
local now = now_ms()
local open = KEYS[1]
local tag = tag_of(open)
local ident = open_ident(tag, open)
local task = task_of(ident)
local deadline = now + tonumber(window_ms)

-- Calls in: i|<task> in <tag>:stats (see the header), then the reply unchanged.
local function counted(reply)
  local stats = stats_key(tag)
  -- a new field may be a new hash: only then is its TTL read (one command less per call)
  if redis.pcall('HINCRBY', stats, 'i|' .. task, 1) == 1 and redis.call('PTTL', stats) == -1 then
    redis.call('PEXPIRE', stats, (history_ttl and history_ttl ~= '') and history_ttl or 3600000)
  end
  return reply
end

-- Tell dispatchers an earlier deadline exists (see the header).
local function wake(message)
  if SHARDED_WAKE then
    redis.call('SPUBLISH', shard_wake_channel(tag), message)
  else
    redis.call('PUBLISH', wake_channel(prefix_of(tag)), message)
  end
end

-- The cap reached, the window full or of the other mode, or a leading call: close it
-- as flush.lua does (see the header); mark is 'cx' (value 1: the cap, 2: full), 'ld'
-- (value 1: a leading run) or false (the mode changed: no mark).
local function shut(id, mark, value)
  local stamp = string.format('%d', now)
  redis.call('ZREM', KEYS[2], ident)
  if redis.call('HGET', ids_key(tag), id) == ident then
    redis.call('HDEL', ids_key(tag), id)
  end
  local key
  key, id = close_to_record(tag, open, id, stamp)
  redis.call('ZADD', leased_key(tag), stamp, id)
  if mark then
    redis.call('HSET', key, 'st', 'dispatching', 'i', ident, 'dl', stamp, 'tries', 0, mark, value)
  else
    redis.call('HSET', key, 'st', 'dispatching', 'i', ident, 'dl', stamp, 'tries', 0)
  end
  wake(stamp)
end

-- The cap reached or a leading call: close the window, reply; mark 'cx' or 'ld'.
local function close(id, opened, calls, mark)
  shut(id, mark, 1)
  if mark == 'ld' then
    return counted({id, opened, now, calls, now, 'lead'})
  end
  return counted({id, opened, now, calls, now})
end

-- Where the embed starts in a JSON body [args, kwargs, embed]: walked back from the end
-- over the embed's brackets and strings only (the arguments are never read). nil when the
-- last element is not an object.
local function embed_at(data)
  local i = #data
  while i > 0 and string.find(' \t\r\n', string.sub(data, i, i), 1, true) do i = i - 1 end
  if string.byte(data, i) ~= 93 then return nil end  -- the body's closing ']'
  i = i - 1
  while i > 0 and string.find(' \t\r\n', string.sub(data, i, i), 1, true) do i = i - 1 end
  if string.byte(data, i) ~= 125 then return nil end  -- the embed's closing '}'
  local depth = 0
  while i > 0 do
    local c = string.byte(data, i)
    if c == 34 then  -- back to the quote that opens this string (one not escaped)
      local escaped
      repeat
        i = i - 1
        while i > 0 and string.byte(data, i) ~= 34 do i = i - 1 end
        if i == 0 then return nil end
        local k = i - 1
        while k > 0 and string.byte(data, k) == 92 do k = k - 1 end
        escaped = (i - 1 - k) % 2 == 1
      until not escaped
    elseif c == 125 or c == 93 then
      depth = depth + 1
    elseif c == 123 or c == 91 then
      depth = depth - 1
      if depth == 0 then return i end
    end
    i = i - 1
  end
  return nil
end

-- An embed as the producer writes it: {} or an object whose first key is a protocol-2
-- embed key (a 0.1 record's [args, kwargs] ends with the kwargs instead).
local EMBED_STARTS = {'{}', '{"callbacks":', '{"errbacks":', '{"chain":', '{"chord":'}
local function is_embed(data, at)
  for _, start in ipairs(EMBED_STARTS) do
    if string.sub(data, at, at + #start - 1) == start then return true end
  end
  return false
end

-- The body a replacing join stores: the call's arguments with the window's embed
-- (callbacks, errbacks, chain, chord) and content type, the opener's. JSON: the call's
-- [args, kwargs, spliced before the window's embed. Another content type: the call's
-- body when its embed is the window's (field e, stored by the opener). Else nil, why.
local function replacement(ct, data, embed)
  local held = redis.call('HMGET', open, 'ct', 'e', 'p')
  local window_ct = held[1] or ''
  if window_ct == 'application/json' then window_ct = '' end  -- the default, spelt out
  if window_ct ~= ct then
    return nil, 'was opened with content type ' ..
      (window_ct == '' and 'application/json' or window_ct) .. ', this call has ' ..
      (ct == '' and 'application/json' or ct) .. ': a window runs with its opener\'s ' ..
      'serializer; call with the same serializer'
  end
  if not held[3] then  -- no body to keep anything of (not written by the package)
    return data
  end
  if ct == '' then
    local mine = embed_at(data)
    local theirs = embed_at(held[3])
    if not mine then
      return nil, 'cannot take this call\'s body: not a JSON [args, kwargs, embed]'
    end
    if not theirs or not is_embed(held[3], theirs) then  -- a 0.1 record: no embed to keep
      return data
    end
    return string.sub(data, 1, mine - 1) .. string.sub(held[3], theirs)
  end
  if held[2] == false or held[2] == embed then  -- no e: a record of 0.2, as 0.2 did
    return data
  end
  return nil, 'was opened with other link/link_error/chain/chord options, and a ' ..
    ct .. ' body cannot take this call\'s arguments apart from them; call with the ' ..
    'opener\'s options, or with serializer=\'json\''
end

-- Leading / trailing edge (see the header): only with ARGV[13].
local leading = false
local inherit = nil  -- {fs, mw} of the quiet period, for a trailing window opened in it
local quiet = nil
local qend = nil
-- A call during the quiet period moves its end and counts itself in it (called once
-- the call can no longer be refused, so a refused call writes nothing).
local function hold()
  local stamp = string.format('%d', qend)
  redis.call('HSET', quiet, 'dl', stamp)
  redis.call('PEXPIREAT', quiet, stamp)
  return redis.call('HINCRBY', quiet, 'n', 1)
end

-- A leading-only call during the quiet period q: folded into the leading run.
local function suppressed(q)
  local held = hold()
  local stats = stats_key(tag)
  redis.call('HINCRBY', stats, 's|' .. task, 1)
  redis.call('PEXPIRE', stats, history_ttl)
  return counted({q[1], 0, qend, held, now, 'suppressed'})
end

if edge and edge ~= '' then
  quiet = quiet_key(tag, ident)
  local q = redis.call('HMGET', quiet, 'id', 'fs', 'mw', 'dl')
  if q[1] and tonumber(q[4]) > now then
    qend = math.min(deadline, tonumber(q[2]) + tonumber(q[3]))
    if edge == 'L' then
      return suppressed(q)
    end
    inherit = {q[2], q[3]}
  elseif redis.call('EXISTS', open) == 0 then
    leading = true
  end
end

local found = redis.call('HMGET', open, 'id', 'fs', 'mw', 'mc', 'cl')
local fixed = alias_json ~= nil and alias_json ~= ''
local collect = budget ~= nil and budget ~= ''
local element
if collect then
  element = '[' .. string.format('%d', now) .. ',' .. string.sub(payload, 2)
  if 10 + #collect_embed + #element > tonumber(budget) then
    return redis.error_reply('DEBOUNCE_PAYLOAD_TOO_LARGE: this call makes a body of ' ..
      (10 + #collect_embed + #element) .. ' bytes, above debounce_max_payload_bytes=' ..
      budget)
  end
end
local mode = found[5] and true or false  -- the open window collects
if found[1] and mode ~= collect then  -- the other mode: close it, open a new one
  shut(found[1], false)
  found[1] = false
elseif found[1] and collect then
  local size = redis.call('HMGET', open, 'cb', 'cz')
  if tonumber(size[1]) + 1 + #element > tonumber(size[2]) then  -- full: the same
    shut(found[1], 'cx', 2)
    found[1] = false
  end
end

-- A replacing join (ARGV[4] '1...'): the call's arguments in the window's message; its
-- serializer and embed are the opener's. Refused, nothing written, when they cannot be.
local body = nil
if found[1] and not collect and string.sub(replace_arg, 1, 1) == '1' then
  local why
  body, why = replacement(content_type, payload, string.sub(replace_arg, 2))
  if not body then
    return redis.error_reply('DEBOUNCE_REPLACE_REFUSED: window ' .. found[1] .. ' ' .. why)
  end
end

-- The window's deadline set; when it is the earliest one, dispatchers are woken.
local function scheduled(id, opened, calls)
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  redis.call('ZADD', KEYS[2], deadline, ident)
  if first[1] == nil or deadline < tonumber(first[2]) then
    wake(string.format('%d', deadline))
  end
  return counted({id, opened, deadline, calls, now})
end

-- Join: the call joins the open window found (see the header).
if found[1] then
  local id = found[1]
  if fixed and id ~= opener_id then
    local na = tonumber(redis.call('HGET', open, 'na') or '0')
    if na >= tonumber(max_aliases) then
      return redis.error_reply('DEBOUNCE_ALIASES_FULL: window has ' .. na .. ' aliases (the ' ..
        'most a window records); call with another key or without a fixed task id')
    end
    redis.call('HSET', open, 'na', na + 1, 'a' .. (na + 1), alias_json)
  end
  if inherit then
    hold()
  end
  deadline = math.min(deadline, tonumber(found[2]) + tonumber(found[3]))
  local calls = redis.call('HINCRBY', open, 'n', 1)
  local cap = found[4]
  if collect then
    redis.call('RPUSH', calls_key(tag, found[5]), element)
    redis.call('HINCRBY', open, 'cb', #element + 1)
  elseif body then
    redis.call('HSET', open, 'p', body)
  end
  if cap and calls >= tonumber(cap) then
    return close(id, 0, calls, 'cx')
  end
  -- Usually a call moves the deadline later: GT does that in one command and can
  -- never make this window the earliest one, so there is nothing to publish.
  if redis.call('ZADD', KEYS[2], 'GT', 'CH', deadline, ident) == 1 then
    return counted({id, 0, deadline, calls, now})
  end
  return scheduled(id, 0, calls)
end

-- Open: no window found, the call opens one (see the header): under opener_id, or
-- fallback_id when a fixed id is in use.
do
  local id = opener_id
  local alias = false
  if fixed then
    local ids = ids_key(tag)
    local holder = redis.call('HGET', ids, id)
    if redis.call('EXISTS', win_key(tag, id)) == 1 or
        (holder and redis.call('HGET', open_key(tag, holder), 'id') == id) then
      id = fallback_id
      alias = true
    else
      redis.call('HSET', ids, id, ident)
      alias = alias_on_open == '1'
    end
  end
  local fs, mw = string.format('%d', now), max_wait_ms
  if inherit then  -- a trailing window: the quiet period's first seen and max wait
    fs, mw = inherit[1], inherit[2]
    hold()
  end
  deadline = math.min(deadline, tonumber(fs) + tonumber(mw))
  local fields = {'id', id, 'fs', fs, 'mw', mw, 'n', 1, 'p', payload}
  if inherit then
    fields[#fields + 1] = 'tr'
    fields[#fields + 1] = 1
  end
  if alias then
    fields[#fields + 1] = 'na'
    fields[#fields + 1] = 1
    fields[#fields + 1] = 'a1'
    fields[#fields + 1] = alias_json
  end
  if content_type ~= '' then
    fields[#fields + 1] = 'ct'
    fields[#fields + 1] = content_type
    if not collect then  -- a body Lua cannot read: the opener's embed, for replacing joins
      fields[#fields + 1] = 'e'
      fields[#fields + 1] = string.sub(replace_arg, 2)
    end
  end
  if options ~= '' then
    fields[#fields + 1] = 'o'
    fields[#fields + 1] = options
  end
  local capped = max_calls and max_calls ~= ''
  if capped then
    fields[#fields + 1] = 'mc'
    fields[#fields + 1] = max_calls
  end
  if collect then
    local cl = id
    local k = 0
    while redis.call('EXISTS', calls_key(tag, cl)) == 1 do
      k = k + 1
      cl = id .. '~' .. k
    end
    redis.call('RPUSH', calls_key(tag, cl), element)
    fields[10] = collect_embed  -- p: the embed; take.lua splices the body around it
    fields[#fields + 1] = 'cl'
    fields[#fields + 1] = cl
    fields[#fields + 1] = 'cb'
    fields[#fields + 1] = 10 + #collect_embed + #element
    fields[#fields + 1] = 'cz'
    fields[#fields + 1] = budget
  end
  redis.call('HSET', open, unpack(fields))
  if leading then
    redis.call('HSET', quiet, 'id', id, 'fs', fs, 'mw', mw, 'dl', string.format('%d', deadline),
      'n', 1, 'm', edge)
    redis.call('PEXPIREAT', quiet, string.format('%d', deadline))
    return close(id, 1, 1, 'ld')
  end
  if capped and tonumber(max_calls) <= 1 then
    return close(id, 1, 1, 'cx')
  end
  return scheduled(id, 1, 1)
end
