-- reconcile.lua: one node's reconcile in local-reconciled mode. The node
-- pushes the tokens it admitted since its last push, its admission rate and
-- its demand, and pulls the fleet's view: the global level as of now and
-- the live nodes' total demand, from which it sizes its share.
--
-- KEYS[1]  the global bucket (decide.lua's format: central and
--          local-reconciled share it, so a change of mode keeps the state)
-- KEYS[2]  the plane's node set (heartbeat.lua's format)
-- KEYS[3]  the reconcile hash, per node: "s:<node>" its last applied push,
--          "d:<node>" its demand, "r:<node>" its admission rate (tokens
--          per second) and "t:<node>" the time of its last push (µs)
-- KEYS[4]  this node's tenant demands: a hash, tenant → tokens/s. The
--          other live nodes' are read too, by the same name with their ids
--          (in the same slot: one hash tag; not declared, since which nodes
--          are live is known only here)
-- ARGV[1]  node id
-- ARGV[2]  push sequence number: a push whose number is not above the
--          node's last applied one is not applied again (a retry after a
--          lost reply never counts twice)
-- ARGV[3]  tokens admitted in this push
-- ARGV[4]  the node's admission rate since its last push, tokens/s
-- ARGV[5]  the node's demand, tokens/s; -1 before the node has measured it
-- ARGV[6]  ttl in ms: the node is live until now + ttl
-- ARGV[7..9]  the global limit: rate, burst, period µs
-- ARGV[11..] pairs of tenant name and the node's demand for it, tokens/s:
--          its busiest tenants
-- ARGV[10] the reconcile interval, µs. The bucket may hold one interval's
--          refill above its burst: pushes come up to an interval after the
--          admissions they count, and capped at the burst the refill that
--          paid for them would be lost.
--
-- Returns {the global level as of now in token·µs: the bucket after this
-- push, less what the other live nodes admitted since their last pushes
-- (their rate × the time since; may be negative: the fleet owes tokens);
-- the live nodes' total demand, tokens/s (nodes that have not measured
-- theirs count as the average of those that have); the live nodes; for
-- each tenant of ARGV[11..], in order, the live nodes' total demand}.
--
-- Side effects: debits the global bucket (down to minus its burst),
-- records the node's push, rate, demand and liveness, forgets nodes whose
-- liveness expired, and sets expiries on everything it writes.
--
-- Complexity: O(live nodes × tenants pushed + expired nodes).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local node, seq, tokens, admit_rate, demand, ttl =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local rate, burst, per = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])

-- liveness: record this node, forget the expired ones
redis.call('ZADD', KEYS[2], now_ms + ttl, node)
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms)) do
  redis.call('HDEL', KEYS[3], 's:' .. dead, 'd:' .. dead, 'r:' .. dead, 't:' .. dead)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
redis.call('PEXPIRE', KEYS[2], ttl)

-- the global bucket, refilled to now
local cap = burst * per
local ceiling = cap + rate * tonumber(ARGV[10])
local level, last = cap, now
local v = redis.call('GET', KEYS[1])
if v and #v == 32 then
  local l, at, p = struct.unpack('<i8i8i8i8', v)
  if p ~= per then
    if l >= burst * p then l = cap else l = math.floor(l * per / p) end
  end
  level, last = math.min(l, ceiling), at
end
if now > last then
  if rate > 0 then level = math.min(level + (now - last) * rate, ceiling) end
  last = now
end

local applied = tonumber(redis.call('HGET', KEYS[3], 's:' .. node) or '0')
if seq > applied then
  level = math.max(level - tokens * per, -cap)
  redis.call('HSET', KEYS[3], 's:' .. node, seq)
end
-- Written on every reconcile, also with nothing to debit: the refill a
-- later push pays for must count from now, not from that push.
local value = struct.pack('<i8i8i8i8', level, last, per, rate)
local ms = 7 * 24 * 3600 * 1000 -- rate 0: as decide.lua
if rate > 0 then ms = math.ceil((ceiling - level) / rate / 1000) + 1000 end
redis.call('SET', KEYS[1], value, 'PX', string.format('%d', ms))
redis.call('HSET', KEYS[3], 'r:' .. node, admit_rate, 't:' .. node, now)
if demand >= 0 then
  redis.call('HSET', KEYS[3], 'd:' .. node, demand)
else
  redis.call('HDEL', KEYS[3], 'd:' .. node)
end

local live = redis.call('ZRANGE', KEYS[2], 0, -1)
local fleet, known, unpushed = 0, 0, 0
for _, n in ipairs(live) do
  local f = redis.call('HMGET', KEYS[3], 'd:' .. n, 'r:' .. n, 't:' .. n)
  if f[1] then
    fleet, known = fleet + tonumber(f[1]), known + 1
  end
  if n ~= node and f[2] and f[3] then
    unpushed = unpushed + tonumber(f[2]) * math.max(now - tonumber(f[3]), 0) / 1000000
  end
end
if known > 0 then fleet = fleet * #live / known end

-- tenant demands: this node's replace its last, then the fleet's totals
local names, pairs_ = {}, {}
for i = 11, #ARGV, 2 do
  names[#names + 1] = ARGV[i]
  pairs_[#pairs_ + 1], pairs_[#pairs_ + 2] = ARGV[i], ARGV[i + 1]
end
redis.call('DEL', KEYS[4])
local totals = {}
if #names > 0 then
  redis.call('HSET', KEYS[4], unpack(pairs_))
  redis.call('PEXPIRE', KEYS[4], ttl)
  local td = string.sub(KEYS[4], 1, #KEYS[4] - #node)
  for i = 1, #names do totals[i] = 0 end
  for _, n in ipairs(live) do
    local vals = redis.call('HMGET', td .. n, unpack(names))
    for i = 1, #names do
      if vals[i] then totals[i] = totals[i] + tonumber(vals[i]) end
    end
  end
end
redis.call('PEXPIRE', KEYS[3], math.max(ttl, 600000))
return {level - math.floor(unpushed * per), math.floor(fleet), #live, totals}
