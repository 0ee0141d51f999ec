-- heartbeat.lua: record that a node is alive and count the live nodes of a
-- plane.
--
-- KEYS[1]  the plane's node set (a sorted set: member node id, score the
--          ms at which the node is presumed dead)
-- ARGV[1]  node id
-- ARGV[2]  ttl in ms: the node is live until now + ttl unless it beats again
--
-- Returns the number of live nodes, this one included.
--
-- Side effects: sets this node's expiry, removes the nodes whose expiry has
-- passed, and sets the set's own expiry to the ttl (an abandoned plane
-- leaves nothing behind). Time is Redis TIME: one clock for the fleet.
--
-- Complexity: O(log N + expired nodes).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
