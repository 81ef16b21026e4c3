-- lib/tag.lua: defines tag_of(key), the shard tag <prefix>:{<shard>} a key of the store
-- starts with: up to the first '}' (the prefix has no braces: settings refuses them).
-- Touches no key.
local function tag_of(key)
  return string.sub(key, 1, string.find(key, '}', 1, true))
end
