// Package keyspace names every Redis key of a quota plane: it is the one
// place that builds them. All keys of a plane carry the plane (namespace/
// name) as their hash tag, so every script call touches one Redis Cluster
// slot; a plane split into shards (spec.shards > 1) has one hash tag per
// shard for its decision state.
//
// The whole keyspace of plane P (holder H is a tenant's name behind its
// length, Holder; D an api key's digest, KeyDigest; N a node id; U an
// upstream) and who writes each key:
//
//	qp:{P}:policy                hash and pub/sub channel: the published policy versions (pkg/store, the manager)
//	qp:{P}:enforcers             hash: each enforcer's loaded version and rate (pkg/store, enforcers)
//	qp:{P}:enforcers:state       hash: each enforcer's mode and degradation (pkg/store, enforcers)
//	qp:{P}:upstream:plan         hash: the degraded upstreams' plan (pkg/upstream, the leader)
//	qp:{P}:upstream:nodes        hash: the enforcers exchanging with the plan (upstream.lua)
//	qp:{P}:upstream:U:demand     hash: demand per class on upstream U (upstream.lua)
//	qp:{P}:upstream:U:reports    list: passive reports of upstream U for the leader (enforcers)
//	qp:{P}:upstream:usage:N      string: node N's busiest tenants' admitted rates (enforcers)
//
// Decision state, under a shard's prefix (Prefix: qp:{P}: with one shard,
// qp:{P/s}: for shard s of several; the node keys are the plane's own).
// Every level's state is a key of its own, so that each expires on its own
// when it would be full again (pkg/lua bucket.lua):
//
//	g                  string: the global bucket (decide.lua, debit.lua, refund.lua, reconcile.lua)
//	pool               string: the burst pool's bucket (decide.lua, refund.lua)
//	d                  string: the demand counter the shards rebalance by (decide.lua)
//	t:H                string: tenant H's bucket (decide.lua, refund.lua, debit.lua, reconcile.lua)
//	a:H                string: tenant H's borrow allowance (decide.lua, refund.lua)
//	s:H                string: tenant H's share bucket, central fairness (decide.lua)
//	e:H:<endpoint>     string: tenant H's bucket of an endpoint (decide.lua, refund.lua, reconcile.lua)
//	k:H:D              string: the bucket of api key D of tenant H (decide.lua, refund.lua, reconcile.lua)
//	<level>:w          list: a tenant, endpoint or key level's sliding window instead of its bucket
//	<level>:n          hash: local-reconciled's demand record of a level, node → demand (reconcile.lua names it)
//	nodes              sorted set: the live nodes (heartbeat.lua, reconcile.lua)
//	rc                 hash: local-reconciled's pushes, demands and rates per node (reconcile.lua)
//	td:N               hash: node N's tenant demands (reconcile.lua)
//	fd:N               string: node N's fairness report (heartbeat.lua, central mode)
//
// Who may touch which of these keys is stated here too: EnforcerACL and
// ManagerACL (acl.go) are the Redis ACL users of the two components.
package keyspace

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Prefix is the prefix of a shard's decision keys: "qp:{P}:" or "qp:{P/s}:".
type Prefix string

// PlanePrefix is the prefix of every key of plane.
func PlanePrefix(plane string) Prefix { return Prefix("qp:{" + plane + "}:") }

// ShardPrefix is the prefix of shard of a plane split into shards > 1.
func ShardPrefix(plane string, shard int) Prefix {
	return Prefix("qp:{" + plane + "/" + strconv.Itoa(shard) + "}:")
}

// Policy names the plane's policy hash, also the pub/sub channel that hears
// of new versions.
func Policy(plane string) string { return string(PlanePrefix(plane)) + "policy" }

// Enforcers names the hash of the enforcers' reports.
func Enforcers(plane string) string { return string(PlanePrefix(plane)) + "enforcers" }

// EnforcerStates names the hash of the enforcers' states.
func EnforcerStates(plane string) string { return Enforcers(plane) + ":state" }

// UpstreamPlan names the plan of the plane's degraded upstreams.
func UpstreamPlan(plane string) string { return string(PlanePrefix(plane)) + "upstream:plan" }

// UpstreamNodes names the hash of the enforcers exchanging with the plan.
func UpstreamNodes(plane string) string { return string(PlanePrefix(plane)) + "upstream:nodes" }

// UpstreamDemand names the demand hash of one upstream.
func UpstreamDemand(plane, upstream string) string {
	return string(PlanePrefix(plane)) + "upstream:" + upstream + ":demand"
}

// UpstreamReports names the list of one upstream's passive reports.
func UpstreamReports(plane, upstream string) string {
	return string(PlanePrefix(plane)) + "upstream:" + upstream + ":reports"
}

// UpstreamUsage names node's usage report.
func UpstreamUsage(plane, node string) string {
	return string(PlanePrefix(plane)) + "upstream:usage:" + node
}

// Global names the shard's global bucket.
func (p Prefix) Global() string { return string(p) + "g" }

// Pool names the shard's burst pool bucket.
func (p Prefix) Pool() string { return string(p) + "pool" }

// Demand names the shard's demand counter.
func (p Prefix) Demand() string { return string(p) + "d" }

// Version1Until names the key that says until when scripts read a bucket
// missing from its tenant's hash from version 1's keys (pkg/lua
// bucket.lua, which derives the name from the hash's).
func (p Prefix) Version1Until() string { return string(p) + "v1" }

// Nodes names the plane's set of live nodes.
func (p Prefix) Nodes() string { return string(p) + "nodes" }

// Reconcile names local-reconciled's hash of pushes per node.
func (p Prefix) Reconcile() string { return string(p) + "rc" }

// TenantDemands names node's tenant demands (local-reconciled).
func (p Prefix) TenantDemands(node string) string { return string(p) + "td:" + node }

// FairReport names node's fairness report (central).
func (p Prefix) FairReport(node string) string { return string(p) + "fd:" + node }

// Holder is a tenant's name in key names: behind its length, since names
// that requests choose can hold any character, and prefixed they cannot
// run into the next part of a key or its suffixes.
func Holder(tenant string) string { return strconv.Itoa(len(tenant)) + ":" + tenant }

// KeyDigest names an api key in key names: 128 bits of its SHA-256 in hex,
// so that nothing read from Redis (a dump, SCAN, MONITOR, the slow log)
// shows an api key. Fixed-length hex, it needs no length prefix.
func KeyDigest(apiKey string) string {
	sum := sha256.Sum256([]byte(apiKey))
	return hex.EncodeToString(sum[:16])
}

// window names a level's sliding window instead of its bucket: a list,
// another kind of key, so a change of algorithm starts afresh.
func window(name string, window bool) string {
	if window {
		return name + ":w"
	}
	return name
}

// Tenant names holder's tenant level: its bucket, or its window.
func (p Prefix) Tenant(holder string, isWindow bool) string {
	return window(string(p)+"t:"+holder, isWindow)
}

// Allowance names holder's borrow allowance.
func (p Prefix) Allowance(holder string) string { return string(p) + "a:" + holder }

// Share names holder's share bucket (central fairness).
func (p Prefix) Share(holder string) string { return string(p) + "s:" + holder }

// Endpoint names holder's level of endpoint: its bucket, or its window.
func (p Prefix) Endpoint(holder, endpoint string, isWindow bool) string {
	return window(string(p)+"e:"+holder+":"+endpoint, isWindow)
}

// Key names the level of the api key whose digest is digest (KeyDigest)
// of holder: its bucket, or its window.
func (p Prefix) Key(holder, digest string, isWindow bool) string {
	return window(string(p)+"k:"+holder+":"+digest, isWindow)
}
