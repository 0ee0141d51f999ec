#!lua flags=no-writes
-- peek.lua: the tokens left at levels of a plane, as decide.lua would see
-- them now, without changing anything: the debug view of mode central.
-- The no-writes flag makes Redis refuse any write this script might try,
-- and lets it run on a replica (EVALSHA_RO). bucket.lua comes in front of
-- it (after this line's flags).
--
-- KEYS     the levels to read: bucket or sliding-window keys as decide.lua
--          names them (pkg/enforcer's central.go), each with one hash tag
-- ARGV[1]  the limit on each key, as decide.lua's ARGV[2]: #KEYS records of
--          4 little-endian int64, algorithm (0 none, 1 token bucket,
--          2 sliding window), rate, burst, period µs
-- ARGV[2]  now in µs, or 0 to read Redis TIME (what production does)
--
-- Returns {now, then per key 2 integers: the tokens left (what decide.lua's
-- remaining() gives after refilling to now: a bucket's level floored to
-- whole tokens, a window's limit less the costs still in it; a missing
-- record is a full bucket or an empty window; 0 for algorithm 0), and 1
-- when Redis holds a record for the key, 0 when not}.
--
-- State read, as decide.lua reads it (bucket.lua): a bucket written with
-- another period has its tokens rescaled; a window's clock is the later
-- of now and its newest entry. A record of another shape (a key of another
-- kind) reads as missing, as decide.lua reads it.
--
-- Side effects: none.
--
-- Complexity: O(keys + window entries).

local unpack4 = '<i8i8i8i8'

local now = clock(ARGV[2])
local limits = ARGV[1]

local out = {now}
for i = 1, #KEYS do
  local alg, rate, burst, per = struct.unpack(unpack4, limits, 32 * (i - 1) + 1)
  local left, present = 0, 0
  if alg == 1 then
    local cap = burst * per
    local level = cap
    local l, last = read_bucket(redis.call('GET', KEYS[i]), rate, burst, per, cap)
    if l then
      present, level = 1, l
      if now > last then
        local elapsed = now - last
        if rate > 0 and elapsed >= math.ceil(cap / rate) then
          level = cap
        else
          level = math.min(level + elapsed * rate, cap)
        end
      end
    end
    left = idiv(level, per)
  elseif alg == 2 then
    local at, cost = read_window(KEYS[i])
    if #at > 0 then present = 1 end
    local t = math.max(now, at[#at] or 0) - per
    local sum = 0
    for j = 1, #at do
      if at[j] > t then sum = sum + cost[j] end
    end
    left = math.max(rate - sum, 0)
  end
  out[#out + 1] = left
  out[#out + 1] = present
end
return out
