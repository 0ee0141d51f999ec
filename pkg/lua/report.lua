-- report.lua: record an enforcer's report in its plane's fleet, on Redis's
-- clock, and drop the reports that lapsed. Liveness is judged by one clock,
-- Redis TIME, whatever the hosts' clocks say: an enforcer whose clock ran
-- behind would otherwise write a report that the others find lapsed at
-- once, and one whose clock ran ahead a report that outlives it.
--
-- KEYS[1]  the plane's reports (a hash: enforcer id -> "version:rate:until",
--          until in ms of Redis TIME)
-- KEYS[2]  the plane's report states (a hash: enforcer id ->
--          "mode:0" or "mode:1", degraded)
-- ARGV[1]  enforcer id
-- ARGV[2]  "version:rate", the report but its until
-- ARGV[3]  ttl in ms (>= 1): the report lapses at now + ttl unless renewed
-- ARGV[4]  the report's state, or "" for none (a state stored before is
--          dropped)
--
-- Returns the number of reports dropped: lapsed (until passed) or not a
-- report (no "…:…:<until>").
--
-- Side effects: both hashes live as long as their longest report does
-- (PEXPIRE NX sets a new hash's expiry, GT only lengthens it: a report with
-- a short ttl must not take the others with it); a lapsed report's state
-- and a state without a report are dropped.
--
-- Complexity: O(reports), the plane's enforcers.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. (now + ttl))
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
for _, k in ipairs(KEYS) do
  redis.call('PEXPIRE', k, 2 * ttl, 'NX')
  redis.call('PEXPIRE', k, 2 * ttl, 'GT')
end

local dropped = 0
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  local lapses = tonumber(string.match(all[i + 1], '^[^:]*:[^:]*:(%d+)$'))
  if lapses == nil or lapses < now then
    redis.call('HDEL', KEYS[1], all[i])
    redis.call('HDEL', KEYS[2], all[i])
    dropped = dropped + 1
  else
    live[all[i]] = true
  end
end
local states = redis.call('HKEYS', KEYS[2])
for _, id in ipairs(states) do
  if not live[id] then
    redis.call('HDEL', KEYS[2], id)
  end
end
return dropped
