-- decide.lua: decide a batch of requests against a plane's hierarchy, in
-- order, atomically: the global bucket, then per request the tenant bucket
-- (with borrowing from the burst pool up to the tenant's allowance), the
-- endpoint limit and the api key limit. It is the Go engine's decision
-- (pkg/enforcer, decideLocked with no fair-share pacing) in Lua: the same
-- integer arithmetic, the same order, the same answers.
--
-- KEYS[1]            global bucket
-- KEYS[2]            burst pool bucket (any name when there is no pool)
-- KEYS[3+4(i-1)+0]   request i: tenant limit
-- KEYS[3+4(i-1)+1]   request i: tenant borrow allowance (ceiling bucket)
-- KEYS[3+4(i-1)+2]   request i: endpoint limit (per tenant)
-- KEYS[3+4(i-1)+3]   request i: api key limit (per tenant)
--   All keys share one hash tag: one call touches one cluster slot.
--
-- ARGV[1]  now in µs, or 0 to read Redis TIME (what production does: one
--          clock for the whole fleet; a given time is for simulations and
--          tests that replay the Go engine)
-- ARGV[2]  n, the number of requests
-- ARGV[3..5]  global: rate, burst, period µs (a token bucket)
-- ARGV[6..9]  pool: rate, burst (0: no pool), period µs, borrow ceiling
-- ARGV[10+15(i-1)...] request i, 15 fields:
--   cost, reserve (token·µs of the global bucket the request must leave:
--   tier floors), may borrow (0|1), then for the tenant, endpoint and key
--   levels each: algorithm (0 none, 1 token bucket, 2 sliding window),
--   rate, burst, period µs.
--
-- Returns {now, then per request 6 integers: allowed (0|1), level (0 none,
-- 1 global, 2 tenant, 3 endpoint, 4 key), reason (0 none, 1 global,
-- 2 reserve, 3 tenant, 4 tenant borrow ceiling, 5 pool dry, 6 endpoint,
-- 7 key), retry after µs (capped at one hour), remaining tokens, borrowed}.
--
-- Units: tokens are integers; a bucket's level is token·µs (tokens × period
-- µs), so refill is exact integer arithmetic. Policy bounds burst × period
-- to 2^53, where doubles are still exact integers.
--
-- State: a bucket is the string "level:last:period" (level in token·µs,
-- last refill µs, the period the level is scaled by); a missing bucket is
-- full. A sliding window is a list of "at:cost" entries, oldest first; a
-- missing window is empty. Keys are written only when a request debits
-- them, once per call however many requests touch them, with an expiry at
-- the time they would be full (or empty) again, when losing them changes
-- nothing. Buckets with rate 0 never refill and never expire.
--
-- Side effects: debits the levels of allowed requests; denied requests
-- change nothing.
--
-- Complexity: O(n) key reads and writes, each distinct key read and
-- written at most once; a sliding window costs O(entries) ≤ its rate.
-- A denied borrowing request costs up to 32 more evaluations (bisection
-- for its retry time), in Lua only.

local HOUR = 3600000000
local INF = math.huge

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(a / b) for integers a ≥ 0, b > 0 up to 2^53, exactly: the float
-- quotient is off by at most one.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local states = {} -- key -> state, loaded once per call
local order = {}  -- keys in load order, for the write-back

local function bucket(key, rate, burst, per)
  local b = states[key]
  if b then return b end
  local cap = burst * per
  b = {bucket = true, key = key, rate = rate, burst = burst, per = per, cap = cap, inv = 1 / per,
    fill = (rate > 0) and math.ceil(cap / rate) or INF, level = cap, last = now}
  local v = redis.call('GET', key)
  if v then
    local l, t, p = string.match(v, '^(-?%d+):(%d+):(%d+)$')
    l, t, p = tonumber(l), tonumber(t), tonumber(p)
    if l then
      if p ~= per then -- the period changed: rescale the tokens
        if l >= burst * p then l = cap else l = math.floor(l * per / p) end
      end
      b.level, b.last = math.min(l, cap), t
    end
  end
  states[key] = b
  order[#order + 1] = key
  return b
end

local function window(key, rate, per)
  local w = states[key]
  if w then return w end
  w = {bucket = false, key = key, rate = rate, per = per, at = {}, cost = {}, head = 1, sum = 0, loaded = 0, latest = 0}
  local items = redis.call('LRANGE', key, 0, -1)
  for i, item in ipairs(items) do
    local at, c = string.match(item, '^(%d+):(%d+)$')
    w.at[i], w.cost[i] = tonumber(at), tonumber(c)
    w.sum = w.sum + w.cost[i]
    w.latest = w.at[i]
  end
  w.loaded = #items
  states[key] = w
  order[#order + 1] = key
  return w
end

-- level returns the state of one level, or nil when it has no limit.
local function level(key, alg, rate, burst, per)
  if alg == 1 then return bucket(key, rate, burst, per) end
  if alg == 2 then return window(key, rate, per) end
  return nil
end

local function settle(s)
  if s.bucket then
    if now > s.last then
      local elapsed = now - s.last
      s.last = now
      if elapsed >= s.fill then
        s.level = s.cap
      else
        s.level = math.min(s.level + elapsed * s.rate, s.cap)
      end
    end
    return
  end
  s.latest = math.max(s.latest, now)
  local t = s.latest
  while s.head <= #s.at and s.at[s.head] <= t - s.per do
    s.sum = s.sum - s.cost[s.head]
    s.head = s.head + 1
  end
end

local function covers(s, cost)
  if s.bucket then return cost <= s.burst and cost * s.per <= s.level end
  return s.sum + cost <= s.rate
end

local function never(s, cost)
  if s.bucket then return cost > s.burst end
  return cost > s.rate
end

local function take(s, cost)
  if s.bucket then
    s.level = s.level - cost * s.per
  else
    s.latest = math.max(s.latest, now)
    s.at[#s.at + 1], s.cost[#s.cost + 1] = s.latest, cost
    s.sum = s.sum + cost
  end
  s.dirty = true
end

local function remaining(s)
  if not s.bucket then return math.max(s.rate - s.sum, 0) end
  if s.level <= 0 then return -idiv(-s.level + s.per - 1, s.per) end
  return idiv(s.level, s.per)
end

local function estimate(s)
  if not s.bucket then return math.max(s.rate - s.sum, 0) end
  return s.level * s.inv
end

-- the tokens s would hold at time at, without changing it
local function remaining_at(s, at)
  if s.bucket then
    local c = {bucket = true, level = s.level, last = s.last, rate = s.rate, cap = s.cap, fill = s.fill, per = s.per}
    local saved = now
    now = at
    settle(c)
    now = saved
    return remaining(c)
  end
  local t = math.max(at, s.latest)
  local sum = s.sum
  for i = s.head, #s.at do
    if s.at[i] > t - s.per then break end
    sum = sum - s.cost[i]
  end
  return math.max(s.rate - sum, 0)
end

-- µs until a bucket holds need token·µs
local function bucket_wait(s, need)
  need = need - s.level
  if need <= 0 then return 1 end
  if s.rate == 0 then return INF end
  return math.max(idiv(need + s.rate - 1, s.rate) + math.max(s.last - now, 0), 1)
end

local function retry_after(s, cost)
  if never(s, cost) then return INF end
  if s.bucket then return bucket_wait(s, cost * s.per) end
  local excess = s.sum + cost - s.rate
  for i = s.head, #s.at do
    excess = excess - s.cost[i]
    if excess <= 0 then return math.max(s.at[i] + s.per - now, 1) end
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
  local hi = math.min(own_wait, HOUR)
  if not passes(hi) then return own_wait end
  local lo = 0
  while hi - lo > 1 do
    local mid = lo + math.floor((hi - lo) / 2)
    if passes(mid) then hi = mid else lo = mid end
  end
  return hi
end

local n = tonumber(ARGV[2])
local g = bucket(KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]))
local pool_rate, pool_burst, pool_per, ceiling = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local pool = nil
if pool_burst > 0 then pool = bucket(KEYS[2], pool_rate, pool_burst, pool_per) end

local out = {now}
for i = 1, n do
  local a, k = 10 + 15 * (i - 1), 3 + 4 * (i - 1)
  local cost, reserve, may_borrow = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), ARGV[a + 2] == '1'
  local tl = level(KEYS[k], tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]))
  local lower, lower_s, reason, borrow = 0, nil, 0, 0
  local allowance, el, kl = nil, nil, nil
  if tl then
    settle(tl)
    if not covers(tl, cost) then
      lower, lower_s, reason = 2, tl, 3
      if may_borrow and pool and not never(tl, cost) then
        local short = math.max(cost - remaining(tl), 0)
        allowance = bucket(KEYS[k + 1], pool_rate, ceiling, pool_per)
        settle(allowance)
        if covers(allowance, short) then
          lower, borrow = 0, short
        else
          reason = 4
        end
      end
    end
  end
  if lower == 0 then
    el = level(KEYS[k + 2], tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8]), tonumber(ARGV[a + 9]), tonumber(ARGV[a + 10]))
    if el then
      settle(el)
      if not covers(el, cost) then lower, lower_s, reason = 3, el, 6 end
    end
  end
  if lower == 0 then
    kl = level(KEYS[k + 3], tonumber(ARGV[a + 11]), tonumber(ARGV[a + 12]), tonumber(ARGV[a + 13]), tonumber(ARGV[a + 14]))
    if kl then
      settle(kl)
      if not covers(kl, cost) then lower, lower_s, reason = 4, kl, 7 end
    end
  end

  settle(g)
  local global_ok = cost <= g.burst and cost * g.per + reserve <= g.level
  if global_ok and borrow > 0 then
    settle(pool)
    if not covers(pool, borrow) then lower, lower_s, reason = 2, tl, 5 end
  end
  local allow = global_ok and lower == 0
  local lvl, retry, rem, borrowed = 0, 0, 0, 0
  if allow then
    take(g, cost)
    if tl and cost - borrow > 0 then take(tl, cost - borrow) end
    if borrow > 0 then
      take(allowance, borrow)
      take(pool, borrow)
      borrowed = borrow
    end
    if el then take(el, cost) end
    if kl then take(kl, cost) end
    -- the tokens left at the tightest level, compared by estimate
    rem = remaining(g)
    local tightest, est = nil, rem
    for _, s in ipairs({tl or false, el or false, kl or false}) do
      if s and estimate(s) < est then tightest, est = s, estimate(s) end
    end
    if tightest then rem = math.min(remaining(tightest), rem) end
    reason = 0
  elseif not global_ok then
    lvl, reason, rem = 1, 1, remaining(g)
    if never(g, cost) or cost * g.per + reserve > g.cap then
      retry = INF
    else
      retry = bucket_wait(g, cost * g.per + reserve)
    end
    if reserve > 0 and covers(g, cost) then reason = 2 end
  else
    lvl, rem = lower, remaining(lower_s)
    retry = retry_after(lower_s, cost)
    if lower == 2 and may_borrow and pool then
      settle(pool)
      retry = borrow_wait(tl, allowance, pool, cost, retry)
    end
  end
  if retry > HOUR then retry = HOUR end
  out[#out + 1] = allow and 1 or 0
  out[#out + 1] = lvl
  out[#out + 1] = reason
  out[#out + 1] = retry
  out[#out + 1] = rem
  out[#out + 1] = borrowed
end

-- Write back what changed, once per key.
for _, key in ipairs(order) do
  local s = states[key]
  if s.dirty then
    if s.bucket then
      local v = string.format('%d:%d:%d', s.level, s.last, s.per)
      if s.rate > 0 then
        local ms = math.ceil((s.cap - s.level) / s.rate / 1000) + 1000
        redis.call('SET', key, v, 'PX', string.format('%d', ms))
      else
        redis.call('SET', key, v)
      end
    else
      if s.head > 1 then redis.call('LTRIM', key, s.head - 1, -1) end
      for i = s.loaded + 1, #s.at do
        redis.call('RPUSH', key, string.format('%d:%d', s.at[i], s.cost[i]))
      end
      redis.call('PEXPIRE', key, string.format('%d', math.ceil(s.per / 1000) + 1000))
    end
  end
end
return out
