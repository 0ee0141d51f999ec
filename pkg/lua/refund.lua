-- refund.lua: give back what decide.lua debited for requests that a group
-- spanning the shards of a plane (a Redis Cluster) could not keep: their
-- shard admitted them, another shard denied its part of the group. Each
-- record undoes one debit of one level: a bucket gets its tokens back, up
-- to its burst; a window loses the entry the debit added.
--
-- KEYS[i]  the level of record i (a bucket or a window, as decide.lua keeps
--          them; a key may come more than once); all keys share one hash
--          tag
-- ARGV[1]  now in µs, or 0 to read Redis TIME: when the buckets are
--          brought up to before the tokens come back
-- ARGV[2]  the time decide.lua decided at (its reply's first value), in µs
-- ARGV[3]  the records: #KEYS records of 5 little-endian int64, algorithm
--          (1 token bucket, 2 sliding window), rate, burst, period µs, and
--          the tokens to give back
--
-- Returns the number of records applied (a window whose entry is gone, as
-- after it expired, applies none: there is nothing left to give back).
--
-- Side effects: a bucket is refilled to now, then credited the tokens,
-- capped at its burst (what it would hold had the debit never happened,
-- but for refill it lost to the cap meanwhile), and written with an expiry
-- at the time it would be full, as decide.lua writes it. A window loses
-- the oldest entry of that cost at or after ARGV[2]: the debit's own entry
-- (decide.lua appends at the later of its time and the window's latest
-- entry), or one as old or older of the same cost, never a later one, so
-- a refund never frees a window sooner than the debit's own entry would.
--
-- Complexity: O(#KEYS) and, for a window, O(entries) ≤ its rate.

local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local decided = tonumber(ARGV[2])
local records = ARGV[3]
local applied = 0
for i, key in ipairs(KEYS) do
  local alg, rate, burst, per, tokens = struct.unpack('<i8i8i8i8i8', records, 40 * (i - 1) + 1)
  if alg == 1 then
    local cap = burst * per
    local level, last = cap, now
    local v = redis.call('GET', key)
    if v and #v == 32 then
      local l, t, p = struct.unpack('<i8i8i8i8', v)
      if p ~= per then
        if l >= burst * p then l = cap else l = math.floor(l * per / p) end
      end
      level, last = math.min(l, cap), t
    end
    if now > last then
      if rate > 0 then level = math.min(level + (now - last) * rate, cap) end
      last = now
    end
    level = math.min(level + tokens * per, cap)
    local ms = 7 * 24 * 3600 * 1000 -- rate 0: as decide.lua
    if rate > 0 then ms = math.ceil((cap - level) / rate / 1000) + 1000 end
    redis.call('SET', key, struct.pack('<i8i8i8i8', level, last, per, rate), 'PX', string.format('%d', ms))
    applied = applied + 1
  elseif alg == 2 then
    local items = redis.call('LRANGE', key, 0, -1)
    for _, item in ipairs(items) do
      local a, c = string.match(item, '^(%d+):(%d+)$')
      if tonumber(a) >= decided and tonumber(c) == tokens then
        redis.call('LREM', key, 1, item)
        applied = applied + 1
        break
      end
    end
  end
end
return applied
