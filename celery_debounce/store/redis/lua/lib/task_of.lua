-- lib/task_of.lua: defines task_of(ident), the task name cut out of an ident
-- <n>:<task>:<key> (n the name's UTF-8 bytes, layout.ident_prefix); nil when the ident
-- does not start with <digits>:.
-- Touches no key.
local function task_of(ident)
  local digits = string.match(ident, '^(%d+):')
  if not digits then
    return nil
  end
  return string.sub(ident, #digits + 2, #digits + 1 + tonumber(digits))
end
