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
//	qp:{P}:upstream:usage:N      node N's busiest tenants' admitted rates (enforcers)
//
// Decision state, under a shard's prefix (Prefix: qp:{P}: with one shard,
// qp:{P/s}: for shard s of several; the node keys are the plane's own):
//
//	g                  string: the global bucket (decide.lua, debit.lua, refund.lua, reconcile.lua)
//	pool               string: the burst pool's bucket (decide.lua, refund.lua)
//	d                  string: the demand counter the shards rebalance by (decide.lua)
//	h:H                hash: tenant H's buckets (decide.lua, refund.lua, debit.lua, reconcile.lua):
//	                   field t its tenant limit, a its borrow allowance, s its share
//	                   bucket (central fairness), e:<endpoint> its endpoint limits, and
//	                   x the hash's expiry (pkg/lua bucket.lua)
//	k:H:D              string: the bucket of api key D of tenant H
//	t:H:w              list: tenant H's sliding window
//	e:H:<endpoint>:w   list: an endpoint's sliding window
//	k:H:D:w            list: api key D's sliding window
//	<level>:n          hash: local-reconciled's demand record of a tenant, endpoint or
//	                   key level, node → demand (reconcile.lua); <level> is the level's
//	                   Name (its bucket's name before version 2 of this layout)
//	nodes              sorted set: the live nodes (heartbeat.lua, reconcile.lua)
//	rc                 hash: local-reconciled's pushes, demands and rates per node (reconcile.lua)
//	td:N               hash: node N's tenant demands (reconcile.lua)
//	fd:N               string: node N's fairness report (heartbeat.lua, central mode)
//
// Version 2 of this layout (this one) moved a tenant's tenant, allowance,
// share and endpoint buckets from keys of their own (t:H, a:H, s:H, e:H:E)
// into fields of one hash per tenant: one read and one
// write per tenant and batch instead of one per level. Scripts read a field
// missing from its hash from its key of version 1, the Level's Name (the
// migration: a bucket
// an earlier enforcer wrote is carried over, not taken as full), and those
// keys expire on their own. Api key buckets keep keys of their own: their
// number is the requests' choice, and a key expires alone (a hash field
// cannot before Redis 7.4), so a tenant's hash holds only what its policy
// bounds.
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

// Nodes names the plane's set of live nodes.
func (p Prefix) Nodes() string { return string(p) + "nodes" }

// Reconcile names local-reconciled's hash of pushes per node.
func (p Prefix) Reconcile() string { return string(p) + "rc" }

// TenantDemands names node's tenant demands (local-reconciled).
func (p Prefix) TenantDemands(node string) string { return string(p) + "td:" + node }

// FairReport names node's fairness report (central).
func (p Prefix) FairReport(node string) string { return string(p) + "fd:" + node }

// Level is where a level's state lives: the key Key, or, when Field is not
// empty, the field Field of the hash Key. Name is the level's own name,
// unique in the plane: its key in version 1 of the layout (which
// pkg/lua's bucket.lua derives again from Key and Field, to migrate), and
// what its local-reconciled demand record is named after.
type Level struct {
	Key, Field string
	Name       string
}

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

// TenantHash names the hash of tenant holder's buckets.
func (p Prefix) TenantHash(holder string) string { return string(p) + "h:" + holder }

// The window suffix: a sliding window is a list, another kind of key than
// a bucket, so a change of algorithm starts afresh.
const windowSuffix = ":w"

// Tenant is holder's tenant level: a field of its hash, or its window.
func (p Prefix) Tenant(holder string, window bool) Level {
	name := string(p) + "t:" + holder
	if window {
		return Level{Key: name + windowSuffix, Name: name + windowSuffix}
	}
	return Level{Key: p.TenantHash(holder), Field: "t", Name: name}
}

// Allowance is holder's borrow allowance: a field of its hash.
func (p Prefix) Allowance(holder string) Level {
	return Level{Key: p.TenantHash(holder), Field: "a", Name: string(p) + "a:" + holder}
}

// Share is holder's share bucket (central fairness): a field of its hash.
func (p Prefix) Share(holder string) Level {
	return Level{Key: p.TenantHash(holder), Field: "s", Name: string(p) + "s:" + holder}
}

// Endpoint is holder's level of endpoint: a field of its hash, or its
// window.
func (p Prefix) Endpoint(holder, endpoint string, window bool) Level {
	name := string(p) + "e:" + holder + ":" + endpoint
	if window {
		return Level{Key: name + windowSuffix, Name: name + windowSuffix}
	}
	return Level{Key: p.TenantHash(holder), Field: "e:" + endpoint, Name: name}
}

// Key is the level of the api key whose digest is digest (KeyDigest) of
// holder: a key of its own, bucket or window.
func (p Prefix) Key(holder, digest string, window bool) Level {
	name := string(p) + "k:" + holder + ":" + digest
	if window {
		name += windowSuffix
	}
	return Level{Key: name, Name: name}
}

// DemandRecord names local-reconciled's demand record of level l.
func DemandRecord(l Level) string { return l.Name + ":n" }
