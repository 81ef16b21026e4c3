-- lib/keys.lua: defines open_key(tag, ident) and the other key names of one shard: the
-- one place the scripts spell a key's name, each builder as store/redis/keys.py's of the
-- same name (tests/store/redis/test_lua_library.py runs both on the same idents and tags,
-- cluster tags included). <tag> is the shard's hash-tagged prefix <prefix>:{<shard>} (a
-- script gets it as ARGV, or reads it out of a key with tag_of), so every key built from
-- it is in the slot of the keys the script was called with. Per window: open_key, win_key, run_key,
-- quiet_key, calls_key, cancel_marker_key; per shard: ids_key, due_key, leased_key,
-- active_key, claims_key, held_key, expiring_key, quarantine_key, stats_key, hot_key,
-- dispatchers_key; the wake channels wake_channel(prefix), shard_wake_channel(tag); and
-- the other way: open_ident(tag, key), the ident of open_key(tag, ident), and
-- prefix_of(tag), the prefix of a shard tag (the prefix has no braces: settings refuse them).
-- Touches no key (builds names; each script's header says which it touches).
local function open_key(tag, ident)
  return tag .. ':open:' .. ident
end

local function open_ident(tag, key)
  return string.sub(key, #tag + 7)  -- after '<tag>:open:'
end

local function win_key(tag, id)
  return tag .. ':win:' .. id
end

local function run_key(tag, ident)
  return tag .. ':run:' .. ident
end

local function quiet_key(tag, ident)
  return tag .. ':quiet:' .. ident
end

local function calls_key(tag, cl)
  return tag .. ':calls:' .. cl
end

local function cancel_marker_key(tag, token)
  return tag .. ':cancelled:' .. token
end

local function ids_key(tag)
  return tag .. ':ids'
end

local function due_key(tag)
  return tag .. ':due'
end

local function leased_key(tag)
  return tag .. ':leased'
end

local function active_key(tag)
  return tag .. ':active'
end

local function claims_key(tag)
  return tag .. ':claims'
end

local function held_key(tag)
  return tag .. ':held'
end

local function expiring_key(tag)
  return tag .. ':expiring'
end

local function quarantine_key(tag)
  return tag .. ':quarantine'
end

local function stats_key(tag)
  return tag .. ':stats'
end

local function hot_key(tag)
  return tag .. ':hot'
end

local function dispatchers_key(tag)
  return tag .. ':dispatchers'
end

local function prefix_of(tag)
  return string.sub(tag, 1, string.find(tag, ':{', 1, true) - 1)
end

local function wake_channel(prefix)
  return prefix .. ':wake'
end

local function shard_wake_channel(tag)
  return tag .. ':wake'
end
