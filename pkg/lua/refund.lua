-- refund.lua: give back what decide.lua debited for requests that a group
-- spanning the shards of a plane (a Redis Cluster) could not keep: their
-- shard admitted them, another shard denied its part of the group. Each
-- record undoes one debit of one level: a bucket gets its tokens back, up
-- to its burst; a window loses the entry the debit added. bucket.lua comes
-- in front of it.
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

local now = clock(ARGV[1])
local decided = tonumber(ARGV[2])
local records = ARGV[3]
local applied = 0
for i, key in ipairs(KEYS) do
  local alg, rate, burst, per, tokens = struct.unpack('<i8i8i8i8i8', records, 40 * (i - 1) + 1)
  if alg == 1 then
    local cap = burst * per
    local level, last = read_bucket(redis.call('GET', key), rate, burst, per, cap)
    if not level then level, last = cap, now end
    if now > last then
      if rate > 0 then level = math.min(level + (now - last) * rate, cap) end
      last = now
    end
    level = math.min(level + tokens * per, cap)
    write_bucket(key, level, last, rate, per, cap, 1000)
    applied = applied + 1
  elseif alg == 2 then
    local at, cost = read_window(key)
    for j = 1, #at do
      if at[j] >= decided and cost[j] == tokens then
        redis.call('LREM', key, 1, string.format('%d:%d', at[j], cost[j]))
        applied = applied + 1
        break
      end
    end
  end
end
return applied
