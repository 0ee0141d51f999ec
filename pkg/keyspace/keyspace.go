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
	"strings"
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
func Holder(tenant string) string {
	var b strings.Builder
	b.Grow(len(tenant) + 8)
	writeHolder(&b, tenant)
	return b.String()
}

func writeHolder(b *strings.Builder, tenant string) {
	var n [20]byte
	b.Write(strconv.AppendInt(n[:0], int64(len(tenant)), 10))
	b.WriteByte(':')
	b.WriteString(tenant)
}

// KeyDigest names an api key in key names: 128 bits of its SHA-256 in hex,
// so that nothing read from Redis (a dump, SCAN, MONITOR, the slow log)
// shows an api key. Fixed-length hex, it needs no length prefix.
func KeyDigest(apiKey string) string {
	var b strings.Builder
	b.Grow(digestLen)
	writeDigest(&b, apiKey)
	return b.String()
}

const digestLen = 32 // hex digits

func writeDigest(b *strings.Builder, apiKey string) {
	sum := sha256.Sum256([]byte(apiKey))
	var h [digestLen]byte
	hex.Encode(h[:], sum[:digestLen/2])
	b.Write(h[:])
}

// Tenant names holder's tenant level: its bucket, or its window.
func (p Prefix) Tenant(holder string, isWindow bool) string {
	return p.level(tenantLevel, holder, "", isWindow)
}

// Allowance names holder's borrow allowance.
func (p Prefix) Allowance(holder string) string { return p.level(allowanceLevel, holder, "", false) }

// Share names holder's share bucket (central fairness).
func (p Prefix) Share(holder string) string { return p.level(shareLevel, holder, "", false) }

// Endpoint names holder's level of endpoint: its bucket, or its window.
func (p Prefix) Endpoint(holder, endpoint string, isWindow bool) string {
	return p.level(endpointLevel, holder, endpoint, isWindow)
}

// Key names the level of the api key whose digest is digest (KeyDigest)
// of holder: its bucket, or its window.
func (p Prefix) Key(holder, digest string, isWindow bool) string {
	return p.level(keyLevel, holder, digest, isWindow)
}

// The kinds of a holder's levels.
const (
	tenantLevel    = "t:"
	allowanceLevel = "a:"
	shareLevel     = "s:"
	endpointLevel  = "e:"
	keyLevel       = "k:"
)

// level is the name of holder's level of kind under p: then ":" and part
// when there is one (an endpoint, a key's digest), and ":w" for a sliding
// window instead of a bucket (a list, another kind of key, so that a
// change of algorithm starts afresh).
func (p Prefix) level(kind, holder, part string, isWindow bool) string {
	var b strings.Builder
	b.Grow(len(p) + len(kind) + len(holder) + len(part) + 3)
	p.writeLevel(&b, kind, holder, part, isWindow)
	return b.String()
}

func (p Prefix) writeLevel(b *strings.Builder, kind, holder, part string, isWindow bool) {
	b.WriteString(string(p))
	b.WriteString(kind)
	b.WriteString(holder)
	if part != "" {
		b.WriteByte(':')
		b.WriteString(part)
	}
	if isWindow {
		b.WriteString(":w")
	}
}

// RequestLevels says which of a request's levels Request names, and
// which of them are sliding windows.
type RequestLevels struct {
	Tenant           string
	TenantWindow     bool
	Allowance, Share bool
	Endpoint         string // "" for none
	EndpointWindow   bool
	APIKey           string // "" for none; named by its digest
	KeyWindow        bool
}

// Request names r's levels under p, as Tenant, Allowance, Endpoint, Key
// and Share name them ("" for one r does not ask for), in one allocation:
// central names every decision's levels, and one by one they were six
// strings a decision.
func (p Prefix) Request(r *RequestLevels) (tenant, allowance, endpoint, key, share string) {
	var b strings.Builder
	b.Grow(p.requestLen(r))
	writeHolder(&b, r.Tenant)
	holder := b.String() // stays valid: later writes only append
	var digest string
	if r.APIKey != "" {
		start := b.Len()
		writeDigest(&b, r.APIKey)
		digest = b.String()[start:]
	}
	name := func(kind, part string, isWindow bool) string {
		start := b.Len()
		p.writeLevel(&b, kind, holder, part, isWindow)
		return b.String()[start:]
	}
	tenant = name(tenantLevel, "", r.TenantWindow)
	if r.Allowance {
		allowance = name(allowanceLevel, "", false)
	}
	if r.Endpoint != "" {
		endpoint = name(endpointLevel, r.Endpoint, r.EndpointWindow)
	}
	if r.APIKey != "" {
		key = name(keyLevel, digest, r.KeyWindow)
	}
	if r.Share {
		share = name(shareLevel, "", false)
	}
	return tenant, allowance, endpoint, key, share
}

// requestLen is the bytes Request writes for r: the holder, the key's
// digest, then each name.
func (p Prefix) requestLen(r *RequestLevels) int {
	holder := len(r.Tenant) + 2
	for n := len(r.Tenant); n >= 10; n /= 10 {
		holder++
	}
	name := len(p) + len(tenantLevel) + holder
	window := func(w bool) int {
		if w {
			return len(":w")
		}
		return 0
	}
	n := holder + name + window(r.TenantWindow)
	if r.Allowance {
		n += name
	}
	if r.Share {
		n += name
	}
	if r.Endpoint != "" {
		n += name + 1 + len(r.Endpoint) + window(r.EndpointWindow)
	}
	if r.APIKey != "" {
		n += digestLen + name + 1 + digestLen + window(r.KeyWindow)
	}
	return n
}
