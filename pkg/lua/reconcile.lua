-- reconcile.lua: one node's reconcile in local-reconciled mode. The node
-- pushes the tokens it admitted since its last push, its admission rate and
-- its demand, and pulls the fleet's view: the global level as of now and
-- the live nodes' total demand, from which it sizes its share. bucket.lua
-- comes in front of it.
--
-- KEYS[1]  the global bucket (decide.lua's format: central and
--          local-reconciled share it, so a change of mode keeps the state)
-- KEYS[2]  the plane's node set (heartbeat.lua's format)
-- KEYS[3]  the reconcile hash, per node: "s:<node>" its last applied push,
--          "d:<node>" its demand, "r:<node>" its admission rate (tokens
--          per second), "t:<node>" the time of its last push (µs) and
--          "c:<node>" its claim curves (ARGV[13]); "c:=" the live nodes'
--          curves summed and "c:@" the ms they were
-- KEYS[4]  this node's tenant demands: a hash, tenant → "tokens/s:weight".
--          The other live nodes' are read too, by the same name with their
--          ids (in the same slot: one hash tag; not declared, since which
--          nodes are live is known only here)
-- ARGV[1]  node id
-- ARGV[2]  push sequence number: a push whose number is not above the
--          node's last applied one is not applied again (a retry after a
--          lost reply never counts twice)
-- ARGV[3]  tokens admitted in this push
-- ARGV[4]  the node's admission rate since its last push, tokens/s
-- ARGV[5]  the node's claim: its demand, less what its busiest tenants ask
--          beyond their fleet-wide fair shares (tokens/s; -1 before the
--          node has measured it)
-- ARGV[6]  ttl in ms: the node is live until now + ttl
-- ARGV[7..9]  the global limit: rate, burst, period µs
-- ARGV[10] the span this push covers, µs: the reconcile interval, or,
--          when longer, the time since the node took what the push before
--          it carries (a retried push after Redis was out of the node's
--          reach, and the one after it, span the outage). The buckets may hold that
--          span's refill above their burst for this push: its admissions
--          were made during the span, at the node's parts of the limits,
--          and capped at the burst the refill that paid for them would be
--          lost (after an outage of a whole fleet at its limits, the push
--          would leave the buckets up to a burst below empty, and tenants
--          under their limits denied). A level above the burst only ever
--          lowers what nodes hold (they keep the lower of theirs and their
--          part of it), and any script that reads the bucket next caps it
--          at its own ceiling.
-- ARGV[11] the node's lower-level buckets (tenant, endpoint and api key
--          limits): #KEYS-4 records of 6 little-endian int64, algorithm
--          (1 token bucket, 2 sliding window), rate, burst, period µs, the
--          tokens the node admitted at the level since its last push, and
--          its demand on the level (thousandths of a token per second),
--          for KEYS[5..]
-- ARGV[12] now in µs, or 0 to read Redis TIME (what production does: one
--          clock for the fleet). A given now is a simulation's virtual
--          time, which does not pass at Redis's pace: the keys' expiries,
--          in Redis's real time, are then at least an hour, and liveness
--          and the freshness of demand reports follow the given time alone.
-- ARGV[13] the node's claim curves (pkg/enforcer claim.go): what its
--          tenants of each tier claim at each of 64 water levels, as
--          little-endian float64 (tokens/s), tier after tier in rank
--          order, or empty for none (a plane without fairness)
-- ARGV[14..] triples of tenant name, the node's demand for it (tokens/s)
--          and its fairness weight: the node's busiest tenants
-- KEYS[5..] the lower-level buckets of ARGV[11], named as decide.lua names
--          them (a mode change keeps their state); each has a demand
--          record beside it, its name and ":n" (same slot, not declared):
--          a hash, node → "<demand>:<ms of the report>", and "=" →
--          "<sum> <ms>", sum the reports it holds and ms at most the time
--          of the oldest of them. A push replaces its node's report in the
--          sum, but once a report may be older than the ttl (ms + ttl is
--          past) it sweeps the record: drops the reports older than the
--          ttl and counts the sum anew, ms the oldest left. The fleet's
--          demand is the sum: the reports younger than the ttl, as when
--          every push read every report. That was O(nodes) a bucket and
--          half of a reconcile's Redis time at 100 nodes round robin
--          (docs/scale.md); a bucket with one reporter (routing pinned by
--          tenant) is swept every third push. A record of the previous
--          script (no "=") is swept on its first push; the previous
--          script drops "=", which it cannot read, and the next push
--          counts the record anew.
--
-- Returns {the global level as of now in token·µs: the bucket after this
-- push, less what the other live nodes admitted since their last pushes
-- (their rate × the time since; may be negative: the fleet owes tokens);
-- the live nodes' total demand, tokens/s (nodes that have not measured
-- theirs count as the average of those that have); the live nodes; for
-- each tenant of ARGV[14..], in order, the live nodes' total demand; the
-- fleet's claim curves: the live nodes' curves of ARGV[13]'s shape summed
-- (a node that pushed none, or curves of another number of tiers, counts
-- as its demand at every level of the last tier), in ARGV[13]'s format,
-- or false when this node pushed none; for each bucket of
-- KEYS[5..], in order, its level as of now in token·µs (0 for a window)
-- and the fleet's demand on it in thousandths of a token per second}.
--
-- Side effects: debits the global bucket (down to minus its burst),
-- records the node's push, rate, demand and liveness, forgets nodes whose
-- liveness expired, and sets expiries on everything it writes.
--
-- Complexity: O(T + B + expired nodes), T the tenants all live nodes
-- pushed (at most 128 each), B the buckets of this push; once an interval,
-- for the first push after it, O(64 K N), K the tiers, N the live nodes;
-- and a bucket's sweep, O(N), once a report in it may be older than the ttl.

local node, seq, tokens, admit_rate, demand, ttl =
  ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = tonumber(ARGV[12])
local hold = 0 -- ms: the least expiry of every key written (see ARGV[12])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  hold = 3600000
end
local now_ms = math.floor(now / 1000)
local rate, burst, per = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])

-- liveness: record this node, forget the expired ones
redis.call('ZADD', KEYS[2], now_ms + ttl, node)
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now_ms)) do
  redis.call('HDEL', KEYS[3], 's:' .. dead, 'd:' .. dead, 'r:' .. dead, 't:' .. dead, 'c:' .. dead)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
redis.call('PEXPIRE', KEYS[2], math.max(ttl, hold))

-- the global bucket, refilled to now
local cap = burst * per
local span = tonumber(ARGV[10])
local ceiling = cap + rate * span
-- A missing bucket is full: it expires once it would be full again (plus
-- a second). A push that spans more than an interval (after an outage)
-- may find it expired meanwhile, full and refilling on since, not to lose
-- the span's refill: it counts it full plus the span's refill beyond one
-- interval (the reconcile interval is the ttl's third, ARGV[6]).
local expired = math.max(span - math.floor(ttl * 1000 / 3), 0)
local level, last = read_bucket(redis.call('GET', KEYS[1]), rate, burst, per, ceiling)
if not level then level, last = cap + rate * expired, now end
if now > last then
  if rate > 0 then level = math.min(level + (now - last) * rate, ceiling) end
  last = now
end

local applied = tonumber(redis.call('HGET', KEYS[3], 's:' .. node) or '0')
local fresh = seq > applied
if fresh then
  level = math.max(level - tokens * per, -cap)
  redis.call('HSET', KEYS[3], 's:' .. node, seq)
end
-- Written on every reconcile, also with nothing to debit: the refill a
-- later push pays for must count from now, not from that push.
write_bucket(KEYS[1], level, last, rate, per, ceiling, 1000, hold)
redis.call('HSET', KEYS[3], 'r:' .. node, admit_rate, 't:' .. node, now)
if demand >= 0 then
  redis.call('HSET', KEYS[3], 'd:' .. node, demand)
else
  redis.call('HDEL', KEYS[3], 'd:' .. node)
end
local POINTS = 64
local CURVE = '<' .. string.rep('d', POINTS)
local curves = #ARGV[13] / (8 * POINTS) -- tiers, each a curve of POINTS
if curves >= 1 and curves == math.floor(curves) then
  redis.call('HSET', KEYS[3], 'c:' .. node, ARGV[13])
else
  curves = 0
  redis.call('HDEL', KEYS[3], 'c:' .. node)
end

-- The fleet's claim curves are summed over the live nodes once an
-- interval (the ttl's third), by the first push after it, and kept in
-- KEYS[3] ("c:=", "c:@" the ms they were summed): the pushes in between
-- read the sum. Summing them on every push was O(nodes) a push, 16% of a
-- reconcile's Redis time at 100 nodes round robin once the demand records
-- kept their sums.
local interval_ms = math.floor(ttl / 3)
local stamp = tonumber(redis.call('HGET', KEYS[3], 'c:@') or '')
local summed = stamp ~= nil and now_ms >= stamp and now_ms - stamp < interval_ms
local curve, sum_curves = false, false
if curves > 0 then
  if summed then curve = redis.call('HGET', KEYS[3], 'c:=') end
  if not curve or #curve ~= #ARGV[13] then curve, sum_curves = {}, true end
end

local live = redis.call('ZRANGE', KEYS[2], 0, -1)
local fleet, known, unpushed = 0, 0, 0
local flat = 0 -- the demand of nodes without curves of this shape
if sum_curves then
  for i = 1, curves * POINTS do curve[i] = 0 end
end
for _, n in ipairs(live) do
  local f = redis.call('HMGET', KEYS[3], 'd:' .. n, 'r:' .. n, 't:' .. n)
  if f[1] then
    fleet, known = fleet + tonumber(f[1]), known + 1
  end
  if n ~= node and f[2] and f[3] then
    unpushed = unpushed + tonumber(f[2]) * math.max(now - tonumber(f[3]), 0) / 1000000
  end
  if sum_curves then
    local c = n == node and ARGV[13] or redis.call('HGET', KEYS[3], 'c:' .. n)
    if c and #c == #ARGV[13] then
      for k = 0, curves - 1 do
        local v = {struct.unpack(CURVE, c, 8 * POINTS * k + 1)}
        for g = 1, POINTS do curve[POINTS * k + g] = curve[POINTS * k + g] + v[g] end
      end
    elseif f[1] then
      flat = flat + tonumber(f[1])
    end
  end
end
if known > 0 then fleet = fleet * #live / known end
if sum_curves then
  local packed = {}
  for k = 0, curves - 1 do
    if k == curves - 1 then
      for g = 1, POINTS do curve[POINTS * k + g] = curve[POINTS * k + g] + flat end
    end
    packed[k + 1] = struct.pack(CURVE, unpack(curve, POINTS * k + 1, POINTS * (k + 1)))
  end
  curve = table.concat(packed)
  redis.call('HSET', KEYS[3], 'c:=', curve, 'c:@', now_ms)
end

-- Tenant demands: this node's replace its last ("demand:weight"), then
-- the fleet's, summed over the live nodes. (Kept as the curves are, once
-- an interval, they cost the tenants spread over the nodes their fair
-- shares: 10 nodes round robin, p90 36 -> 42.5%, TestScaleSim.)
local names, fields = {}, {}
for i = 14, #ARGV, 3 do
  names[#names + 1] = ARGV[i]
  fields[#fields + 1], fields[#fields + 2] = ARGV[i], ARGV[i + 1] .. ':' .. ARGV[i + 2]
end
redis.call('DEL', KEYS[4])
if #names > 0 then
  redis.call('HSET', KEYS[4], unpack(fields))
  redis.call('PEXPIRE', KEYS[4], math.max(ttl, hold))
end
local td = string.sub(KEYS[4], 1, #KEYS[4] - #node)
local sums = {}
for _, n in ipairs(live) do
  local all = redis.call('HGETALL', td .. n)
  for i = 1, #all, 2 do
    local d = string.match(all[i + 1], '^(%d+):%d+$')
    if d then sums[all[i]] = (sums[all[i]] or 0) + tonumber(d) end
  end
end
local totals = {}
for i, name in ipairs(names) do totals[i] = sums[name] or 0 end

-- The lower-level buckets: each as the global one (a push debits it once),
-- and its demand record (see KEYS[5..]).
local interval = span
local SUM = '='
local levels = {}
for i = 5, #KEYS do
  local alg, brate, bburst, bper, btokens, bdemand = struct.unpack('<i8i8i8i8i8i8', ARGV[11], 48 * (i - 5) + 1)
  local key = KEYS[i]
  local blevel = 0
  if alg == 1 then
    local bcap = bburst * bper
    local bceil = bcap + brate * interval
    local l, at = read_bucket(redis.call('GET', key), brate, bburst, bper, bceil)
    if not l then l, at = bcap + brate * expired, now end
    if now > at then
      if brate > 0 then l = math.min(l + (now - at) * brate, bceil) end
      at = now
    end
    if fresh then l = math.max(l - btokens * bper, -bcap) end
    write_bucket(key, l, at, brate, bper, bceil, 1000, hold)
    blevel = l
  end
  -- the demand record: this node's rate replaces its last in the sum,
  -- unless a report in it may be older than the ttl: then it is swept
  local dkey = key .. ':n'
  local f = redis.call('HMGET', dkey, node, SUM)
  local d, oldest = string.match(f[2] or '', '^(%d+) (%d+)$')
  d, oldest = tonumber(d), tonumber(oldest)
  if d and now_ms >= oldest and now_ms < oldest + ttl then
    d = d - (tonumber(string.match(f[1] or '', '^(%d+):')) or 0) + bdemand
  else
    d, oldest = bdemand, now_ms
    local all = redis.call('HGETALL', dkey)
    for j = 1, #all, 2 do
      local r, at = string.match(all[j + 1], '^(%d+):(%d+)$')
      at = tonumber(at)
      if r and at + ttl > now_ms then
        if all[j] ~= node then d, oldest = d + tonumber(r), math.min(oldest, at) end
      elseif all[j] ~= SUM then
        redis.call('HDEL', dkey, all[j])
      end
    end
  end
  redis.call('HSET', dkey, node, bdemand .. ':' .. now_ms, SUM, d .. ' ' .. oldest)
  redis.call('PEXPIRE', dkey, math.max(ttl, hold))
  levels[#levels + 1] = blevel
  levels[#levels + 1] = d
end

redis.call('PEXPIRE', KEYS[3], math.max(ttl, 600000, hold))
return {level - math.floor(unpushed * per), math.floor(fleet), #live, totals, curve, levels}
