package keyspace

import "strings"

// The Redis ACL users of a quota plane's components, with only the commands
// and keys each needs: the one place that states them. The trial Redis's
// manifests (config/redis, the Helm chart's files/) carry these rules,
// checked by config/trust_test.go; the tests of pkg/redisconn run the
// enforcer in every mode and the manager's publisher against a Redis with
// exactly these users and find no denial in ACL LOG.
//
// Scripts run with their caller's rights: the keys an EVALSHA declares are
// checked for reading and writing before the script runs, and every command
// a script calls and every key it touches is checked against the calling
// user. So the enforcer user, which may call any script by SHA, still
// cannot write the policy store (its rights there are read-only, and
// PUBLISH is not among its commands), and the manager user cannot run a
// decision script (the decision keys are not its).
//
// Neither user may run KEYS, SCAN, FLUSH*, CONFIG, DEBUG, MONITOR, ACL or
// any other administrative command. Operators' tools that list planes
// (quotactl status, which SCANs) run as another user.

// connection are the commands every client sends besides go-redis's
// handshake (HELLO and AUTH are always allowed; pkg/redisconn turns CLIENT
// SETINFO off): PING (the manager's readiness, pub/sub health checks) and
// transactions.
var connection = []string{"+ping", "+multi", "+exec", "+discard"}

// scriptCommands call the embedded scripts by SHA and load them after
// NOSCRIPT (pkg/lua Script.Run).
var scriptCommands = []string{"+evalsha", "+script|load"}

// EnforcerACL is the enforcer user's rules for the planes matched by
// planes ("*": every plane; otherwise one plane's name, namespace/name,
// whose shards it covers too): its scripts (decide, debit, refund,
// reconcile, heartbeat, peek, upstream) with the commands they call, the
// reports it writes, read-only access to the policy store and the upstream
// plan (the manager's), and a subscription to the store's channel.
func EnforcerACL(planes string) []string {
	rules := []string{"resetkeys", "resetchannels", "-@all"}
	rules = append(rules, connection...)
	rules = append(rules, scriptCommands...)
	rules = append(rules,
		// called by the scripts, and on their own (a node leaving the
		// live set, dropping its reconcile fields, its reports)
		"+time", "+get", "+set", "+del", "+incrby", "+pexpire",
		"+hget", "+hmget", "+hset", "+hdel", "+hgetall", "+hkeys",
		"+rpush", "+lrange", "+lrem", "+ltrim",
		"+zadd", "+zcard", "+zrem", "+zrange", "+zrangebyscore", "+zremrangebyscore",
		// the policy store: read and follow
		"+subscribe", "+unsubscribe",
	)
	for _, tag := range tags(planes) {
		p := "qp:{" + tag + "}:"
		for _, k := range []string{"g", "pool", "d", "v1", "nodes", "rc", "td:*", "fd:*", "t:*", "a:*", "s:*", "e:*", "k:*"} {
			rules = append(rules, "~"+p+k) // decision state
		}
		rules = append(rules,
			"~"+p+"enforcers", "~"+p+"enforcers:state", // its reports
			// The upstream exchange: the leader's plan read-only (the
			// enforcer reads it with HMGET; upstream.lua does not declare
			// it, since Redis checks a script's declared keys for
			// writing), the gate nodes and demand (upstream.lua), its
			// passive reports and usage.
			"%R~"+p+"upstream:plan", "~"+p+"upstream:nodes", "~"+p+"upstream:*:demand", "~"+p+"upstream:*:reports", "~"+p+"upstream:usage:*",
			"%R~"+p+"policy", "&"+p+"policy", // the policy store: read, subscribe
		)
	}
	return rules
}

// ManagerACL is the manager user's rules for the planes matched by planes
// (as EnforcerACL): the policy store (publish.lua, which stores a version
// and PUBLISHes its notice; the sources it reads back), the enforcers'
// reports (read), and the upstream leader's plan (write) and inputs (read;
// reports drained).
func ManagerACL(planes string) []string {
	rules := []string{"resetkeys", "resetchannels", "-@all"}
	rules = append(rules, connection...)
	rules = append(rules, scriptCommands...)
	rules = append(rules,
		// publish.lua
		"+hget", "+hset", "+hdel", "+hkeys", "+publish",
		// the store's reads, the fleet's reports, the upstream plan
		"+hmget", "+hgetall", "+time", "+hincrby", "+pexpire", "+del", "+lpop", "+mget",
	)
	for _, tag := range tags(planes) {
		p := "qp:{" + tag + "}:"
		rules = append(rules,
			"~"+p+"policy", "&"+p+"policy",
			"%R~"+p+"enforcers", "%R~"+p+"enforcers:state",
			"~"+p+"upstream:plan", "%R~"+p+"upstream:nodes", "~"+p+"upstream:*:reports", "%R~"+p+"upstream:usage:*",
		)
	}
	return rules
}

// tags are the hash tags of planes' keys: every tag ("*"), or one plane's
// and its shards'. Plane names (Kubernetes namespace/name) hold no glob
// characters.
func tags(planes string) []string {
	if planes == "*" || planes == "" {
		return []string{"*"}
	}
	return []string{planes, planes + "/*"}
}

// ACLLine is rules as one line (an ACL file's "user" line, after the name,
// state and password).
func ACLLine(rules []string) string { return strings.Join(rules, " ") }
