-- heartbeat.lua: record that a node is alive and count the live nodes of a
-- plane; with a demand report (central mode, a plane that shares by
-- fairness), also store the node's report and return every live node's,
-- so that each node computes the fleet's fair shares from the same figures.
--
-- KEYS[1]  the plane's node set (a sorted set: member node id, score the
--          ms at which the node is presumed dead)
-- KEYS[2]  with a report: this node's report, a string the script does
--          not read (pkg/enforcer, central_fair.go, writes and reads it);
--          the other live nodes' are read by the same name with their ids
--          in place of this one's (in the same slot: one hash tag; not
--          declared, since which nodes are live is known only here)
-- KEYS[3]  with a report: the plane's global bucket (decide.lua's format),
--          read, never written
-- ARGV[1]  node id
-- ARGV[2]  ttl in ms: the node is live until now + ttl unless it beats again
-- ARGV[3]  optional: this node's report (an empty string: none)
-- ARGV[4]  with a report: its ttl in ms
--
-- Returns the number of live nodes, this one included; with a report, an
-- array: {live nodes, now in µs (Redis TIME), the global bucket's value
-- (false when it has none), then for every live node in the order of
-- their ids, its id and its report (false when it has none)}.
--
-- Side effects: sets this node's expiry, removes the nodes whose expiry has
-- passed, and sets the set's own expiry to the ttl (an abandoned plane
-- leaves nothing behind); with a report, stores it with its ttl. Time is
-- Redis TIME: one clock for the fleet.
--
-- Complexity: O(log N + expired nodes); with a report, O(N log N + the
-- bytes of the live nodes' reports).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
local live = redis.call('ZCARD', KEYS[1])
if not ARGV[3] or ARGV[3] == '' then
  return live
end

redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
local out = {live, tonumber(t[1]) * 1000000 + tonumber(t[2]), redis.call('GET', KEYS[3])}
local prefix = string.sub(KEYS[2], 1, #KEYS[2] - #ARGV[1])
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
table.sort(ids)
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('GET', prefix .. id)
end
return out
