-- decide.lua: decide a batch of requests against a plane's hierarchy, in
-- order, atomically: the global bucket, then per request the tenant limit
-- (with borrowing from the burst pool up to the tenant's allowance), the
-- endpoint limit and the api key limit, and the request's fair share
-- when the plane is contended. It is the Go engine's decision
-- (pkg/enforcer, decideLocked) in Lua: the same integer arithmetic, the
-- same order, the same answers. bucket.lua comes in front of it.
--
-- KEYS     the distinct keys the batch touches, each once: KEYS[1] is the
--          global bucket, KEYS[2] the burst pool (any name without a
--          pool), KEYS[3] the demand counter (see ARGV[4]). All keys share
--          one hash tag: one call, one cluster slot (pkg/keyspace names
--          them). A global with no limit
--          (algorithm 0) is no level: the batch is decided at the levels
--          below it (local-reconciled's limits too small to split over its
--          nodes, pkg/enforcer hybrid.go).
-- ARGV[1]  now in µs, or 0 to read Redis TIME (what production does: one
--          clock for the whole fleet; a given time is for simulations and
--          tests that replay the Go engine)
-- ARGV[2]  the limit on each key: #KEYS records of 4 little-endian int64,
--          algorithm (0 none, 1 token bucket, 2 sliding window, 3 share
--          bucket), rate, burst, period µs
-- ARGV[3]  the requests: records of 9 little-endian int64, cost, reserve
--          (token·µs of the global bucket the request must leave: tier
--          floors, or the part kept for tenants within their fair share),
--          may borrow (0|1), then the indexes in KEYS of its tenant limit,
--          borrow allowance, endpoint limit and api key limit (0: the
--          level has no limit), then its group: 0 for a request decided
--          alone; requests in a row with the same group (not 0) are one
--          group, decided all or nothing (see Groups); then the index in
--          KEYS of its tenant's share bucket (0: the tenant is not paced)
-- ARGV[4]  1 to add the batch's cost, admitted or not, to the demand
--          counter (a plane split into shards rebalances their parts of the
--          global limit by it); 0 not to
--
-- Returns {now, then per request 7 integers: allowed (0|1), level (0 none,
-- 1 global, 2 tenant, 3 endpoint, 4 key), reason (0 none, 1 global,
-- 2 reserve, 3 tenant, 4 tenant borrow ceiling, 5 pool dry, 6 endpoint,
-- 7 key, 8 fair share: level 1), retry after µs (capped at one hour),
-- remaining tokens, borrowed,
-- and the level whose tokens remaining counts (1-4: the tightest when
-- allowed, the denying one when denied)}.
--
-- Units: tokens are integers; a bucket's level is token·µs (tokens × period
-- µs), so refill is exact integer arithmetic. Policy bounds burst × period
-- to 2^53, where doubles are still exact integers.
--
-- State: a bucket or a window as bucket.lua keeps them; a missing bucket
-- is full. A bucket read with another period has its tokens rescaled, and
-- one read with another rate or period is written back, so that its expiry
-- follows the limit in force. A missing window is empty. A key is read at most once per call, when a
-- request first needs it, and written at most once, when a request debited
-- it, with an expiry at the time it would be full (or empty) again, when
-- losing it changes nothing. A bucket with rate 0 never refills; it expires
-- a week after its last debit.
--
-- Share buckets pace a tenant at its weighted fair share of the contended
-- global rate, fleet-wide (pkg/enforcer, central_fair.go): a token bucket
-- whose rate is the share (the caller sends the share in force with every
-- request, so it changes as the fleet's demand does), checked with the
-- global level, after the levels below it. It differs from a limit's
-- bucket in three ways, as the Go engine's shareBucket does: a bucket
-- holding min(cost, burst) admits the request and may go into debt, repaid
-- at the share (a request costlier than the bucket is paced, never refused
-- for good); a missing bucket holds what its first request needs, not its
-- burst (thousands of small tenants starting full would each run over
-- their shares for a while); and it stays a minute after it would be full
-- again, so that an idle tenant comes back to a full bucket.
--
-- Groups: the requests of a group are decided in order, each on top of the
-- debits of the earlier ones (two requests of one tenant need both costs
-- at its level). When one of them is denied, every level the group touched
-- (global, pool, tenant, allowance, endpoint, key; buckets and windows) is
-- restored to what it was before the group's first request, in this
-- call's state, before the next request is decided: each request's reply
-- is its own decision (allowed for one that passed given the earlier
-- ones), but none of them is debited. The caller reads the group's
-- outcome from its requests: admitted when all were allowed.
--
-- Side effects: debits the levels of allowed requests (of groups whose
-- requests were all allowed); denied requests and denied groups change
-- nothing (but the demand counter, when asked).
--
-- Complexity: O(requests + distinct keys); a sliding window costs
-- O(entries) ≤ its rate, and restoring it after a denied group the entries
-- the group added. A denied borrowing request costs up to 32 more
-- evaluations (bisection for its retry time), in Lua only.

local HOUR = 3600000000
local INF = math.huge
local unpack4 = '<i8i8i8i8'
local unpack_request = '<i8i8i8i8i8i8i8i8i8'
-- a share bucket stays this long after it would be full again
local SHARE_LINGER_MS = 60000

-- A level's state is an array; these name its slots.
local BUCKET, LEVEL, LAST, RATE, BURST, PER, CAP, INV, FILL, DIRTY = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
-- true in a share bucket (alg 3); past the slots windows use
local SHARE = 13
-- windows: BUCKET false, then
local SUM, HEAD, AT, COST, LOADED, LATEST = 2, 3, 4, 5, 6, 7
-- and, past the slots buckets use, its rate and period
local WRATE, WPER = 11, 12

local now = clock(ARGV[1])
local limits, requests = ARGV[2], ARGV[3]

local states = {} -- index in KEYS -> state, loaded on first use

-- settle refills a bucket to now, or drops a window's entries older than
-- its period. now is one time for the whole call, so a state is settled
-- once, when level loads it: after that it stays settled (a request's
-- debit does not move its time; a group's restore puts back a settled
-- state). remaining_at settles a copy at another time.
local function settle(s)
  if s[BUCKET] then
    if now > s[LAST] then
      local elapsed = now - s[LAST]
      s[LAST] = now
      if elapsed >= s[FILL] then
        s[LEVEL] = s[CAP]
      else
        s[LEVEL] = min(s[LEVEL] + elapsed * s[RATE], s[CAP])
      end
    end
    return
  end
  if now > s[LATEST] then s[LATEST] = now end
  local t, at, cost, h = s[LATEST] - s[WPER], s[AT], s[COST], s[HEAD]
  while at[h] and at[h] <= t do
    s[SUM] = s[SUM] - cost[h]
    h = h + 1
  end
  s[HEAD] = h
end

-- level returns the state of KEYS[i], or nil when i is 0 or it has no limit;
-- cost is the request that needs it first (a missing share bucket holds
-- what it needs).
local function level(i, cost)
  if i == 0 then return nil end
  local s = states[i]
  if s then return s end
  local alg, rate, burst, per = sunpack(unpack4, limits, 32 * (i - 1) + 1)
  if alg == 1 or alg == 3 then
    local cap = burst * per
    s = {true, cap, now, rate, burst, per, cap, 1 / per, (rate > 0) and ceil(cap / rate) or INF, false}
    if alg == 3 then s[SHARE], s[LEVEL] = true, min(cost or 0, burst) * per end
    local l, last, rewrite = read_bucket(call('GET', KEYS[i]), rate, burst, per, cap)
    if l then s[LEVEL], s[LAST], s[DIRTY] = l, last, rewrite end
  elseif alg == 2 then
    local at, costs, sum = read_window(KEYS[i])
    s = {false, sum, 1, at, costs, #at, at[#at] or 0, false, false, false, rate, per}
  else
    return nil
  end
  settle(s)
  states[i] = s
  return s
end

local function covers(s, cost)
  if s[SHARE] then return min(cost, s[BURST]) * s[PER] <= s[LEVEL] end
  if s[BUCKET] then return cost <= s[BURST] and cost * s[PER] <= s[LEVEL] end
  return s[SUM] + cost <= s[WRATE]
end

local function never(s, cost)
  if s[SHARE] then return false end
  if s[BUCKET] then return cost > s[BURST] end
  return cost > s[WRATE]
end

local function take(s, cost)
  if s[BUCKET] then
    s[LEVEL] = s[LEVEL] - cost * s[PER]
  else
    if now > s[LATEST] then s[LATEST] = now end
    local n = #s[AT] + 1
    s[AT][n], s[COST][n] = s[LATEST], cost
    s[SUM] = s[SUM] + cost
  end
  s[DIRTY] = true
end

local function remaining(s)
  if not s[BUCKET] then return max(s[WRATE] - s[SUM], 0) end
  local l = s[LEVEL]
  if l <= 0 then return -idiv(-l + s[PER] - 1, s[PER]) end
  return idiv(l, s[PER])
end

local function estimate(s)
  if s[BUCKET] then return s[LEVEL] * s[INV] end
  return max(s[WRATE] - s[SUM], 0)
end

-- the tokens s would hold at time at, without changing it
local function remaining_at(s, at)
  if s[BUCKET] then
    local c = {true, s[LEVEL], s[LAST], s[RATE], s[BURST], s[PER], s[CAP], s[INV], s[FILL]}
    local saved = now
    now = at
    settle(c)
    now = saved
    return remaining(c)
  end
  local t = max(at, s[LATEST]) - s[WPER]
  local sum, times, costs = s[SUM], s[AT], s[COST]
  for i = s[HEAD], #times do
    if times[i] > t then break end
    sum = sum - costs[i]
  end
  return max(s[WRATE] - sum, 0)
end

-- µs until a bucket holds need token·µs
local function bucket_wait(s, need)
  need = need - s[LEVEL]
  if need <= 0 then return 1 end
  if s[RATE] == 0 then return INF end
  return max(idiv(need + s[RATE] - 1, s[RATE]) + max(s[LAST] - now, 0), 1)
end

local function retry_after(s, cost)
  if never(s, cost) then return INF end
  if s[SHARE] then return bucket_wait(s, min(cost, s[BURST]) * s[PER]) end
  if s[BUCKET] then return bucket_wait(s, cost * s[PER]) end
  local excess, times, costs = s[SUM] + cost - s[WRATE], s[AT], s[COST]
  for i = s[HEAD], #times do
    excess = excess - costs[i]
    if excess <= 0 then return max(times[i] + s[WPER] - now, 1) end
  end
  return 1
end

-- the earliest wait after which a borrowing tenant passes its level: its
-- own tokens, or its own plus a loan both allowance and pool can give
local function borrow_wait(own, allowance, pool, cost, own_wait)
  if never(own, cost) then return own_wait end
  local function passes(wait)
    local at = now + wait
    local short = cost - remaining_at(own, at)
    return short <= 0 or (remaining_at(allowance, at) >= short and remaining_at(pool, at) >= short)
  end
  local hi = min(own_wait, HOUR)
  if not passes(hi) then return own_wait end
  local lo = 0
  while hi - lo > 1 do
    local mid = lo + floor((hi - lo) / 2)
    if passes(mid) then hi = mid else lo = mid end
  end
  return hi
end

local g = level(1)
local pool = level(2)

-- A group's undo: the state of every level it touched, as before its first
-- request; nil outside a group.
local saved = nil

-- use returns the state of KEYS[i] (as level) and, inside a group, saves it
-- the first time the group touches it.
local function use(i, cost)
  local s = states[i] or level(i, cost)
  if s and saved and not saved[i] then
    if s[BUCKET] then
      saved[i] = {s, s[LEVEL], s[LAST], s[DIRTY]}
    else
      saved[i] = {s, s[SUM], s[HEAD], #s[AT], s[LATEST], s[DIRTY]}
    end
  end
  return s
end

-- restore puts every level the group touched back as it was.
local function restore()
  for _, v in pairs(saved) do
    local s = v[1]
    if s[BUCKET] then
      s[LEVEL], s[LAST], s[DIRTY] = v[2], v[3], v[4]
    else
      local at, cost = s[AT], s[COST]
      for j = #at, v[4] + 1, -1 do
        at[j], cost[j] = nil, nil
      end
      s[SUM], s[HEAD], s[LATEST], s[DIRTY] = v[2], v[3], v[5], v[6]
    end
  end
end

local out = {now}
local o = 1
local offered = 0
local group, group_ok = 0, true
for pos = 1, #requests, 72 do
  local cost, reserve, may_borrow, ti, ai, ei, ki, grp, si = sunpack(unpack_request, requests, pos)
  if grp ~= group then -- the previous group ends, another begins
    if saved and not group_ok then restore() end
    group, group_ok, saved = grp, true, nil
    if grp ~= 0 then
      saved = {}
      use(1)
      use(2)
    end
  end
  offered = offered + cost
  local tl = use(ti)
  local lower, lower_s, reason, borrow = 0, nil, 0, 0
  local allowance, el, kl = nil, nil, nil
  if tl then
    if not covers(tl, cost) then
      lower, lower_s, reason = 2, tl, 3
      if may_borrow == 1 and pool and not never(tl, cost) then
        local short = max(cost - remaining(tl), 0)
        allowance = use(ai)
        if covers(allowance, short) then
          lower, borrow = 0, short
        else
          reason = 4
        end
      end
    end
  end
  if lower == 0 then
    el = use(ei)
    if el then
      if not covers(el, cost) then lower, lower_s, reason = 3, el, 6 end
    end
  end
  if lower == 0 then
    kl = use(ki)
    if kl then
      if not covers(kl, cost) then lower, lower_s, reason = 4, kl, 7 end
    end
  end

  local global_ok = true -- a batch without a global limit: see KEYS
  if g then
    global_ok = cost <= g[BURST] and cost * g[PER] + reserve <= g[LEVEL]
  end
  local sh, share_ok = nil, true
  if si ~= 0 then
    sh = use(si, cost)
    share_ok = covers(sh, cost)
  end
  if global_ok and share_ok and borrow > 0 then
    if not covers(pool, borrow) then lower, lower_s, reason = 2, tl, 5 end
  end
  local allowed, lvl, retry, rem, borrowed, bound = 0, 0, 0, 0, 0, 1
  if global_ok and share_ok and lower == 0 then
    allowed = 1
    if g then take(g, cost) end
    if sh then take(sh, cost) end
    if tl and cost - borrow > 0 then take(tl, cost - borrow) end
    if borrow > 0 then
      take(allowance, borrow)
      take(pool, borrow)
      borrowed = borrow
    end
    if el then take(el, cost) end
    if kl then take(kl, cost) end
    -- the tokens left at the tightest level, compared by estimate
    rem = g and remaining(g) or HOUR
    local tightest, tlevel, est = nil, 1, rem
    local e = tl and estimate(tl)
    if e and e < est then tightest, tlevel, est = tl, 2, e end
    e = el and estimate(el)
    if e and e < est then tightest, tlevel, est = el, 3, e end
    if kl and estimate(kl) < est then tightest, tlevel = kl, 4 end
    if tightest then
      local r = remaining(tightest)
      if r <= rem then rem, bound = r, tlevel end
    end
    reason = 0
  elseif not global_ok then
    lvl, reason, rem = 1, 1, remaining(g)
    if never(g, cost) or cost * g[PER] + reserve > g[CAP] then
      retry = INF
    else
      retry = bucket_wait(g, cost * g[PER] + reserve)
    end
    if reserve > 0 and covers(g, cost) then reason = 2 end
  elseif not share_ok then
    lvl, reason, rem = 1, 8, g and remaining(g) or 0
    retry = retry_after(sh, cost)
  else
    lvl, rem = lower, remaining(lower_s)
    retry = retry_after(lower_s, cost)
    if lower == 2 and may_borrow == 1 and pool then
      retry = borrow_wait(tl, allowance, pool, cost, retry)
    end
  end
  if retry > HOUR then retry = HOUR end
  if allowed == 0 then
    bound = lvl
    group_ok = false
  end
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6], out[o + 7] = allowed, lvl, reason, retry, rem, borrowed, bound
  o = o + 7
end
if saved and not group_ok then restore() end

if ARGV[4] == '1' then
  call('INCRBY', KEYS[3], string.format('%d', offered))
  call('PEXPIRE', KEYS[3], 86400000)
end

-- Write back what changed, once per key.
for i, s in pairs(states) do
  if s[DIRTY] then
    if s[BUCKET] then
      write_bucket(KEYS[i], s[LEVEL], s[LAST], s[RATE], s[PER], s[CAP], s[SHARE] and SHARE_LINGER_MS or 1000)
    else
      local at, cost = s[AT], s[COST]
      if s[HEAD] > 1 then call('LTRIM', KEYS[i], s[HEAD] - 1, -1) end
      for j = s[LOADED] + 1, #at do
        call('RPUSH', KEYS[i], string.format('%d:%d', at[j], cost[j]))
      end
      call('PEXPIRE', KEYS[i], string.format('%d', ceil(s[WPER] / 1000) + 1000))
    end
  end
end
return out
