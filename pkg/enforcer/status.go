package enforcer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// LimitStatus is one limit in force and what is left of it.
type LimitStatus struct {
	Level Level
	// Name is the endpoint the limit belongs to, or the api key's short
	// hash (policy.ShortKeyHash: never the key), or "(other keys)" for the
	// limiter keys beyond the engine's bound share; empty for the global
	// and tenant levels.
	Name      string
	Limit     policy.Limit
	Remaining int64
}

// TenantStatus is what the engine knows about one tenant: its live limits
// and remaining tokens per level, its fair share and debt, its counters and
// its recent decisions. The enforcer's debug view serves it.
type TenantStatus struct {
	Tenant    string
	Known     bool // the policy names the tenant
	Tier      string
	Weight    int64
	MayBorrow bool
	// Limits lists the tenant's limits: tenant, then endpoints, then keys
	// that have state, each sorted by name.
	Limits []LimitStatus
	// Debt is what the tenant owes the burst pool, in tokens.
	Debt int64
	// Demand is the tenant's measured demand on the plane in tokens per
	// second; FairShare its share of contended global capacity (0 when the
	// plane is not contended).
	Demand    float64
	FairShare float64
	// Counters since the tenant's state was created.
	Admitted     int64
	AdmittedCost int64
	Denied       map[Level]int64
	Borrowed     int64
	// Trace holds the last TraceLength decisions, newest first: since the
	// first for a tenant the policy names, since the first denial for one
	// it does not (the package doc's Memory).
	Trace         []TraceEntry
	PolicyVersion int64
}

// otherKeys names the key limiter shared by keys beyond the engine's bounds.
const otherKeys = "(other keys)"

type keyStatus struct {
	name  string
	state *keyState
}

// PlaneStatus is the state shared by every tenant.
type PlaneStatus struct {
	Global        LimitStatus
	PoolRemaining int64 // tokens left in the burst pool; 0 without a pool
	Contended     bool
	// WaterLevels are, per tier (in policy order), the fair share per unit
	// of tenant weight while contended; +Inf for a tier whose demand fits.
	WaterLevels     []float64
	Tenants         int // tenants with state
	PolicyVersion   int64
	PolicyHash      string
	FairnessEpoch   uint64
	FairnessEnabled bool
}

// TenantStatusAt returns the tenant's status at now; ok is false when the
// engine has no state for it. Reading changes nothing: remaining tokens are
// computed on copies, so a status read never moves a bucket or a window. A
// tenant not decided since the last policy swap shows the limits of the
// policy it was last decided under (PolicyVersion says which).
func (e *Engine) TenantStatusAt(now time.Time, name string) (s TenantStatus, ok bool) {
	snap := e.snap.Load()
	ts := snap.known[name]
	if ts == nil {
		if ts = e.tenants.get(name); ts == nil {
			return TenantStatus{}, false
		}
	}
	nowUs := now.UnixMicro()
	contended := snap.fairness != fairNone && e.fair.contended.Load()

	ts.mu.Lock()
	defer ts.mu.Unlock()
	s = TenantStatus{
		Tenant: ts.name, Known: snap.known[name] != nil,
		Demand:        math.Float64frombits(ts.demandBits.Load()),
		Admitted:      ts.admitted,
		AdmittedCost:  ts.admittedCost,
		Denied:        make(map[Level]int64, len(Levels)),
		PolicyVersion: snap.policy.Version(),
	}
	for _, l := range Levels {
		s.Denied[l] = 0
	}
	if m := ts.more; m != nil {
		s.Borrowed, s.Trace = m.borrowed, m.trace.newestFirst()
		for i, l := range Levels {
			s.Denied[l] = m.denied[i]
		}
	}
	if ts.snap == nil {
		// No decision of the engine's own yet (none at all, or only Redis's
		// in mode central): the policy's view, counters and trace, no local
		// limits.
		rec, _ := snap.recordOf(name, ts.requestedTier())
		s.Tier, s.Weight, s.MayBorrow = rec.tenant.Tier, rec.tenant.Weight, rec.mayBorrow
		return s, true
	}
	s.Known, s.Tier, s.Weight, s.MayBorrow = ts.known, ts.rec.tenant.Tier, ts.rec.tenant.Weight, ts.rec.mayBorrow
	s.PolicyVersion = ts.snap.policy.Version()
	if contended && ts.snap == snap {
		s.FairShare = e.fair.shareRate(ts)
	}
	if a := ts.allowanceLocked(); a != nil && a.active() {
		s.Debt = a.burst() - a.remainingAt(nowUs)
	}
	add := func(level Level, name string, l *limiter) {
		if l.active() {
			s.Limits = append(s.Limits, LimitStatus{Level: level, Name: name, Limit: *l.limit(), Remaining: l.remainingAt(nowUs)})
		}
	}
	add(LevelTenant, "", &ts.limit)
	eps := ts.endpointsLocked()
	for i, re := range ts.rec.endpoints {
		var l limiter
		if i < len(eps) {
			l = eps[i]
		} else { // not made yet (tenantState.endpointLocked): full
			l.reset(re.lim, nowUs)
			l.fit(ts.snap, nowUs)
		}
		add(LevelEndpoint, ts.snap.endpoints[re.ep].Name, &l)
	}
	// Keys by their short hash, never by themselves: the status is for
	// debug views and logs.
	keys := make([]keyStatus, 0, ts.keys.len())
	for ks := range ts.keys.all() {
		name := otherKeys
		if ks.key != overflowName {
			name = policy.ShortKeyHash(ks.key)
		}
		keys = append(keys, keyStatus{name, ks})
	}
	slices.SortFunc(keys, func(a, b keyStatus) int { return strings.Compare(a.name, b.name) })
	for _, k := range keys {
		add(LevelKey, k.name, &k.state.limit)
	}
	return s, true
}

// PlaneStatusAt returns the plane's shared state at now, without changing it.
func (e *Engine) PlaneStatusAt(now time.Time) PlaneStatus {
	snap := e.snap.Load()
	nowUs := now.UnixMicro()
	s := PlaneStatus{
		Global:          LimitStatus{Level: LevelGlobal, Limit: *snap.global},
		PolicyVersion:   snap.policy.Version(),
		PolicyHash:      snap.policy.Hash(),
		FairnessEnabled: snap.fairness != fairNone,
	}
	pl := &e.plane
	pl.mu.Lock()
	if pl.snap == nil { // no decision yet: full
		s.Global.Remaining = snap.global.Burst
		if snap.pool != nil {
			s.PoolRemaining = snap.pool.Burst
		}
	} else {
		s.Global.Remaining = pl.global.remainingAt(nowUs)
		if pl.pool.active() {
			s.PoolRemaining = pl.pool.remainingAt(nowUs)
		}
	}
	pl.mu.Unlock()
	s.Contended = s.FairnessEnabled && e.fair.contended.Load()
	if s.Contended {
		for k := range snap.floors {
			s.WaterLevels = append(s.WaterLevels, math.Float64frombits(e.fair.levelBits[k].Load()))
		}
	}
	s.FairnessEpoch = e.fair.epoch.Load()
	s.Tenants = int(e.tenants.count.Load())
	return s
}

// BackendStatus says which backend decides and how it fares.
type BackendStatus struct {
	// Mode is the plane's backend.
	Mode policy.Mode
	// Degraded is true while Redis is unavailable and the plane's
	// failureMode decides: in central mode while the circuit breaker is
	// open, in local-reconciled from the third reconcile in a row that
	// failed to the next that succeeds.
	Degraded bool
	// Nodes is the live nodes of the fleet as the heartbeats count them
	// (1 in mode local).
	Nodes int64
	// ScriptCalls, Decisions and Failures count the calls of decide.lua
	// (reconcile.lua in local-reconciled), the decisions they made and the
	// calls that failed; Fallbacks counts decisions made by the
	// failureMode.
	ScriptCalls, Decisions, Failures, Fallbacks int64
	// FleetLevel is, in mode local-reconciled, the fleet's global level in
	// tokens as this node's last reconcile pulled it: below zero, the fleet
	// admitted that much beyond the global limit (the overage the next
	// reconcile pays back). 0 in the other modes.
	FleetLevel float64
}

// BackendStatus reports the backend in force.
func (e *Engine) BackendStatus() BackendStatus {
	p := e.policy.Load()
	s := BackendStatus{Mode: p.Mode(), Nodes: 1}
	if c := e.central; c != nil {
		s.Degraded = c.breaker.open.Load()
		s.Nodes = c.fleet.nodes.Load()
		s.ScriptCalls, s.Decisions = c.stats.calls.Load(), c.stats.decisions.Load()
		s.Failures, s.Fallbacks = c.stats.failures.Load(), c.stats.degraded.Load()
		if s.Mode == policy.ModeLocalReconciled {
			r := &e.reconciler.stats
			s.Degraded = e.reconciler.degraded.Load()
			s.ScriptCalls, s.Failures, s.Fallbacks = r.runs.Load(), r.failures.Load(), r.fallbacks.Load()
			if per := p.Spec().Global.PeriodMicros(); per > 0 {
				s.FleetLevel = float64(r.fleetLevel.Load()) / float64(per) // token·µs per µs of the period
			}
		}
	}
	return s
}

// NodeID is the engine's name in its fleet (WithNodeID).
func (e *Engine) NodeID() string { return e.nodeID }

// RedisStatus is the fleet's state of one tenant's levels in Redis, in mode
// central: what decide.lua would find there at At.
type RedisStatus struct {
	// At is the Redis TIME the levels were read at.
	At time.Time
	// Global is the plane's global bucket; in a plane split into shards,
	// the sum of the shards' parts (each shard's part of the limit).
	Global LimitStatus
	// Limits are the tenant's limits as TenantStatus lists them: tenant,
	// then endpoints, then the api keys the policy names for the tenant
	// (its key overrides and key hashes) that have state in Redis, by
	// their short hash. Keys the policy does not name are not listed:
	// Redis names their state by a digest of the key, which the engine
	// cannot enumerate without the key.
	Limits []LimitStatus
	// Pool is the burst pool (nil without one); Allowance the tenant's
	// borrow allowance (nil when it may not borrow), whose burst less its
	// remaining tokens is its debt to the pool.
	Pool, Allowance *LimitStatus
}

// ErrNotCentral is what RedisStatusOf answers while the plane is not in
// mode central.
var ErrNotCentral = errors.New("the plane is not in mode central")

// RedisStatusOf reads tenant's levels from Redis at Redis TIME with
// peek.lua, which writes nothing: every decision of the fleet meets these
// buckets, so they are the tenant's state in mode central (this node's own
// state idles until Redis fails). A split tenant's levels are summed over
// its parts (an api key's state lives in one part). It takes one script
// call per shard the tenant or the global level lives in, each bounded by
// the Redis timeout.
func (e *Engine) RedisStatusOf(ctx context.Context, tenant string) (RedisStatus, error) {
	c := e.central
	if c == nil {
		return RedisStatus{}, ErrNotCentral
	}
	snap := c.snap.Load()
	if snap == nil {
		return RedisStatus{}, ErrNotCentral
	}
	p := snap.policy
	t, known := p.Tenant(tenant)
	if !known {
		var tier string
		if ts := e.tenants.get(tenant); ts != nil {
			ts.mu.Lock()
			tier = ts.requestedTier()
			ts.mu.Unlock()
		}
		var ok bool
		if t, ok = p.DefaultTenant(tenant, tier); !ok {
			return RedisStatus{}, fmt.Errorf("tenant %q: the plane denies tenants it does not name", tenant)
		}
	}
	levels := tenantLevels(snap, &t)
	k := len(snap.shardPrefixes)
	home, parts := 0, int64(1)
	if k > 1 {
		home, parts = homeShard(k, t.Name), max(t.Shards, 1)
	}
	st := RedisStatus{Global: LimitStatus{Level: LevelGlobal, Limit: *snap.global}}
	if snap.pool != nil {
		st.Pool = &LimitStatus{Limit: *snap.pool}
	}
	if p.MayBorrow(&t) {
		st.Allowance = &LimitStatus{Limit: *snap.borrowCeiling}
	}
	found := make([]bool, len(levels))
	for shard := range k {
		part := (shard - home + k) % k
		ofTenant := int64(part) < parts
		read, err := c.peekShard(ctx, snap, shard, &t, levels, parts, ofTenant)
		if err != nil {
			return RedisStatus{}, err
		}
		st.At = read.at
		st.Global.Remaining += read.global
		if st.Pool != nil {
			st.Pool.Remaining += read.pool
		}
		if !ofTenant {
			continue
		}
		if st.Allowance != nil {
			st.Allowance.Remaining += read.allowance
		}
		for i := range levels {
			switch {
			case levels[i].Level != LevelKey:
				levels[i].Remaining += read.levels[i]
			case read.present[i] && (!found[i] || read.levels[i] < levels[i].Remaining):
				// A key's state lives in one part; the others read full.
				levels[i].Remaining, found[i] = read.levels[i], true
			}
		}
	}
	for i, l := range levels {
		if l.Level != LevelKey || found[i] {
			st.Limits = append(st.Limits, l.LimitStatus)
		}
	}
	return st, nil
}

// tenantLevel is one of a tenant's levels and how Redis names its state
// in a shard.
type tenantLevel struct {
	LimitStatus
	redisName func(keyspace.Prefix) string
}

// tenantLevels lists t's tenant, endpoint and key levels, in TenantStatus
// order (keys by short hash), with how Redis names each.
func tenantLevels(snap *snapshot, t *policy.Tenant) []tenantLevel {
	p := snap.policy
	holder := keyspace.Holder(t.Name)
	key := func(digest string, lim *policy.Limit) func(keyspace.Prefix) string {
		return func(prefix keyspace.Prefix) string { return prefix.Key(holder, digest, isWindow(lim)) }
	}
	var out []tenantLevel
	if lim := t.Limit; lim != nil {
		out = append(out, tenantLevel{LimitStatus{Level: LevelTenant, Limit: *lim},
			func(prefix keyspace.Prefix) string { return prefix.Tenant(holder, isWindow(lim)) }})
	}
	for i := range snap.endpoints {
		if lim := p.EndpointLimit(t, i); lim != nil {
			name := snap.endpoints[i].Name
			out = append(out, tenantLevel{LimitStatus{Level: LevelEndpoint, Name: name, Limit: *lim},
				func(prefix keyspace.Prefix) string { return prefix.Endpoint(holder, name, isWindow(lim)) }})
		}
	}
	// The keys the policy names: overrides by the key, the rest by hash.
	var keys []tenantLevel
	overridden := make(map[string]bool, len(t.Keys))
	for i := range t.Keys {
		k := &t.Keys[i]
		overridden[policy.HashKey(k.Key)] = true
		keys = append(keys, tenantLevel{LimitStatus{Level: LevelKey, Name: policy.ShortKeyHash(k.Key), Limit: k.Limit}, key(keyspace.KeyDigest(k.Key), &k.Limit)})
	}
	if tr, ok := p.Tier(t.Tier); ok && tr.Key != nil {
		for _, h := range t.KeyHashes {
			if overridden[h] {
				continue
			}
			digest := strings.TrimPrefix(h, policy.KeyHashPrefix)
			keys = append(keys, tenantLevel{LimitStatus{Level: LevelKey, Name: digest[:12], Limit: *tr.Key}, key(digest[:32], tr.Key)})
		}
	}
	slices.SortFunc(keys, func(a, b tenantLevel) int { return strings.Compare(a.Name, b.Name) })
	return append(out, keys...)
}

// shardRead is what peek.lua read in one shard.
type shardRead struct {
	at                      time.Time
	global, pool, allowance int64
	levels                  []int64 // as tenantLevels, when the tenant lives in the shard
	present                 []bool
}

// peekShard reads one shard's part of the global level and the pool and,
// when ofTenant, the tenant's levels there (each the part's share of the
// limit, for a tenant split in parts).
func (c *central) peekShard(ctx context.Context, snap *snapshot, shard int, t *policy.Tenant, levels []tenantLevel, parts int64, ofTenant bool) (shardRead, error) {
	prefix := snap.shardPrefixes[shard]
	part := func(l *policy.Limit) *policy.Limit {
		if parts <= 1 {
			return l
		}
		share := l.Share(1/float64(parts), snap.maxCost)
		return &share
	}
	var a batchArgs
	global, pool := c.shardLimits(snap, shard)
	a.reset(prefix, global, pool)
	allowance := int64(0)
	var at []int64 // the levels' indexes in KEYS
	if ofTenant {
		if snap.policy.MayBorrow(t) {
			allowance = a.add(prefix.Allowance(keyspace.Holder(t.Name)), part(snap.borrowCeiling))
		}
		for i := range levels {
			lim := &levels[i].Limit
			if levels[i].Level != LevelKey {
				lim = part(lim)
			}
			at = append(at, a.add(levels[i].redisName(prefix), lim))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.e.settings.redisTimeout)
	defer cancel()
	reply, err := lua.Peek.RunCall(ctx, c.client, lua.PeekCall(&a.levels, 0)).Int64Slice()
	if err == nil && len(reply) != 1+lua.PeekReplyFields*a.levels.Len() {
		err = fmt.Errorf("peek.lua answered %d values for %d keys", len(reply), a.levels.Len())
	}
	if err != nil {
		return shardRead{}, fmt.Errorf("read the plane's levels from Redis: %w", err)
	}
	left := func(idx int64) (int64, bool) {
		return reply[1+lua.PeekReplyFields*(idx-1)], reply[2+lua.PeekReplyFields*(idx-1)] == 1
	}
	r := shardRead{at: time.UnixMicro(reply[0])}
	r.global, _ = left(1)
	r.pool, _ = left(2)
	if allowance > 0 {
		r.allowance, _ = left(allowance)
	}
	if ofTenant {
		r.levels, r.present = make([]int64, len(levels)), make([]bool, len(levels))
		for i := range levels {
			r.levels[i], r.present[i] = left(at[i])
		}
	}
	return r, nil
}

// TierLoad is one tier of the policy in force and its tenants that have
// state on this engine, summed.
type TierLoad struct {
	Name         string
	Weight       int64
	FloorPercent int64
	// Floor is the tier's floor in tokens per second: FloorPercent of the
	// global rate.
	Floor float64
	// Tenant and Key are the tier's default limits (nil when it has none).
	Tenant, Key *policy.Limit
	// Tenants counts the tier's tenants with state.
	Tenants int
	// Demand sums the tenants' measured demand (tokens/s); FairShare what
	// max-min fairness lets them take of contended global capacity, the
	// sum of each one's min(demand, fair share) (0 when the plane is not
	// contended).
	Demand, FairShare float64
	// Counters since the tenants' states were created.
	Admitted, AdmittedCost int64
	Denied                 map[Level]int64
}

// TenantLoad is one tenant's demand, fair share and counters.
type TenantLoad struct {
	Tenant string
	Tier   string
	Known  bool
	Weight int64
	// Demand is the tenant's measured demand (tokens/s); FairShare its
	// share of contended global capacity (0 when the plane is not
	// contended, +Inf when its tier's whole demand fits).
	Demand, FairShare      float64
	Admitted, AdmittedCost int64
	Denied                 int64 // at every level
}

// LoadStatus is the plane's tiers and busiest tenants on this engine.
type LoadStatus struct {
	// Tiers are the policy's, in policy order.
	Tiers []TierLoad
	// Top are the tenants with the highest demand (then admitted tokens,
	// then name), highest first.
	Top []TenantLoad
	// Denied sums every tenant's denials by level.
	Denied map[Level]int64
	// Contended says fair shares are in force.
	Contended bool
}

// otherTenants names, in LoadStatus, the state shared by the tenants
// beyond the engine's bound.
const otherTenants = "(other tenants)"

// MaxTopTenants bounds PlaneLoad's top.
const MaxTopTenants = 100

// PlaneLoad sums the tenants with state by tier and picks the top (at
// most MaxTopTenants) by demand. It reads what decisions and the
// fairness tick already keep, so it adds nothing to a decision; a read
// visits every tenant state once, holding each one's lock as long as a
// copy of its counters takes (the fairness tick visits them all every
// interval), and allocates a pointer per tenant.
func (e *Engine) PlaneLoad(top int) LoadStatus {
	top = min(max(top, 0), MaxTopTenants)
	snap := e.snap.Load()
	spec := snap.policy.Spec()
	s := LoadStatus{
		Tiers:     make([]TierLoad, len(spec.Tiers)),
		Denied:    make(map[Level]int64, len(Levels)),
		Contended: snap.fairness != fairNone && e.fair.contended.Load(),
	}
	for i, t := range spec.Tiers {
		s.Tiers[i] = TierLoad{Name: t.Name, Weight: t.Weight, FloorPercent: t.FloorPercent, Floor: snap.floors[i],
			Tenant: t.Tenant, Key: t.Key, Denied: make(map[Level]int64, len(Levels))}
	}
	for _, l := range Levels {
		s.Denied[l] = 0
	}
	for _, ts := range e.tenants.appendAll(make([]*tenantState, 0, e.tenants.count.Load()+64)) {
		tl := TenantLoad{Tenant: ts.name, Demand: math.Float64frombits(ts.demandBits.Load())}
		if ts.name == overflowName {
			tl.Tenant = otherTenants
		}
		ts.mu.Lock()
		c := ts.countersLocked()
		if ts.snap == nil {
			rec, known := snap.recordOf(ts.name, ts.requestedTier())
			tl.Tier, tl.Weight, tl.Known = rec.tenant.Tier, rec.tenant.Weight, known
		} else {
			tl.Tier, tl.Weight, tl.Known = ts.rec.tenant.Tier, ts.rec.tenant.Weight, ts.known
		}
		if s.Contended && ts.snap == snap {
			tl.FairShare = e.fair.shareRate(ts)
		}
		ts.mu.Unlock()
		tl.Admitted, tl.AdmittedCost = c.admitted, c.admittedCost
		var tier *TierLoad
		if rank, ok := snap.tierRank[tl.Tier]; ok {
			tier = &s.Tiers[rank]
			tier.Tenants++
			tier.Demand += tl.Demand
			tier.Admitted += c.admitted
			tier.AdmittedCost += c.admittedCost
			if s.Contended {
				share := tl.FairShare
				if ts.snap != snap {
					share = math.Inf(1) // not yet under this policy: not paced
				}
				tier.FairShare += min(tl.Demand, share)
			}
		}
		for i, l := range Levels {
			tl.Denied += c.denied[i]
			s.Denied[l] += c.denied[i]
			if tier != nil {
				tier.Denied[l] += c.denied[i]
			}
		}
		s.Top = insertTop(s.Top, tl, top)
	}
	return s
}

// insertTop inserts t into top, sorted by busiest first, keeping at most
// n entries.
func insertTop(top []TenantLoad, t TenantLoad, n int) []TenantLoad {
	busier := func(a, b *TenantLoad) bool {
		if a.Demand != b.Demand {
			return a.Demand > b.Demand
		}
		if a.AdmittedCost != b.AdmittedCost {
			return a.AdmittedCost > b.AdmittedCost
		}
		return a.Tenant < b.Tenant
	}
	if n == 0 || (len(top) == n && !busier(&t, &top[n-1])) {
		return top
	}
	i, _ := slices.BinarySearchFunc(top, t, func(a, b TenantLoad) int {
		if busier(&a, &b) {
			return -1
		}
		return 1
	})
	if len(top) == n {
		top = top[:n-1]
	}
	return slices.Insert(top, i, t)
}
