-- census.lua: per-task figures over pending windows (one ZSCAN step), for `stats`.
--
-- KEYS[1]  <tag>:due   zset ident -> deadline ms (read only)
-- Reads, by name (same hash tag): <tag>:open:<ident>  fields fs n
-- ARGV[1]  <tag>    ARGV[2]  ZSCAN cursor ("0" to start)    ARGV[3]  COUNT hint
-- ARGV[4]  now ms (windows with deadline <= now are due)
--
-- The caller repeats this until the cursor comes back "0" and adds the rows up.
-- Returns {next cursor, rows...}; a row per task seen in this step:
-- {task, open windows, due windows, oldest first_seen ms, calls waiting}.

--@include task_of
--@include keys

local tag = ARGV[1]
local now = tonumber(ARGV[4])
local step = redis.call('ZSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3])
local members = step[2]
local by_task = {}
local order = {}
for i = 1, #members, 2 do
  local ident = members[i]
  local deadline = tonumber(members[i + 1])
  local task = task_of(ident)
  local row = by_task[task]
  if not row then
    row = {task, 0, 0, -1, 0}
    by_task[task] = row
    order[#order + 1] = task
  end
  local rec = redis.call('HMGET', open_key(tag, ident), 'fs', 'n')
  if rec[1] then
    row[2] = row[2] + 1
    if deadline <= now then
      row[3] = row[3] + 1
    end
    local fs = tonumber(rec[1])
    if row[4] < 0 or fs < row[4] then
      row[4] = fs
    end
    row[5] = row[5] + tonumber(rec[2])
  end
end
local reply = {step[1]}
for i, task in ipairs(order) do
  local row = by_task[task]
  reply[i + 1] = {row[1], row[2], row[3], string.format('%d', row[4]), row[5]}
end
return reply
