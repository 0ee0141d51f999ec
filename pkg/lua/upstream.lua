-- upstream.lua: an enforcer's exchange with the fleet about a plane's
-- degraded upstreams (pkg/upstream, pkg/enforcer upstream.go), once per
-- reconcile interval: report this node's demand per class on each upstream
-- of the plan it holds, and return the fleet's. The plan itself (the
-- leader's, pkg/upstream PublishPlan) is not a key of this script: the
-- enforcer reads it apart (HMGET), since Redis checks a script's declared
-- keys for writing and the enforcer's ACL user may only read the plan.
--
-- KEYS[1]  the plane's gate nodes, a hash: field node id, value the ms of
--          its last exchange
-- KEYS[2..] per upstream of the plan the node holds, its demand hash:
--          field node id, value "<ms> <d0> <d1> <d2> <d3> <d4>", the ms it
--          was reported at and the node's demand per class (tokens/s,
--          suspended to critical)
-- ARGV[1]  node id
-- ARGV[2]  how long a report stays live, ms
-- ARGV[3..] per demand hash, this node's demand: "<d0> <d1> <d2> <d3> <d4>"
--
-- Returns {now ms, the live gate nodes (this one included), then per
-- demand hash: the live nodes, this one included, and the fleet's demand
-- per class as five strings (numbers in a reply would be truncated to
-- integers)}.
--
-- Side effects: stores this node's exchange time and reports, removes
-- those older than ARGV[2] and sets each hash to expire after it (a plane
-- that stops degrading leaves nothing behind). Time is Redis TIME: one clock for the
-- fleet. Complexity: O(nodes × upstreams).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], now)
redis.call('PEXPIRE', KEYS[1], ttl)
local nodes = redis.call('HGETALL', KEYS[1])
local liveNodes = 0
for j = 1, #nodes, 2 do
  if tonumber(nodes[j + 1]) + ttl < now then
    redis.call('HDEL', KEYS[1], nodes[j])
  else
    liveNodes = liveNodes + 1
  end
end
local out = {now, liveNodes}
for i = 2, #KEYS do
  redis.call('HSET', KEYS[i], ARGV[1], now .. ' ' .. ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[i], ttl)
  local all = redis.call('HGETALL', KEYS[i])
  local live, sums = 0, {0, 0, 0, 0, 0}
  for j = 1, #all, 2 do
    local fields = {}
    for f in string.gmatch(all[j + 1], '%S+') do
      fields[#fields + 1] = tonumber(f)
    end
    if #fields ~= 6 or fields[1] == nil or fields[1] + ttl < now then
      redis.call('HDEL', KEYS[i], all[j])
    else
      live = live + 1
      for c = 1, 5 do
        sums[c] = sums[c] + (fields[c + 1] or 0)
      end
    end
  end
  out[#out + 1] = live
  for c = 1, 5 do
    out[#out + 1] = string.format('%.17g', sums[c])
  end
end
return out
