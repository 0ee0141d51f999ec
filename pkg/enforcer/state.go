package enforcer

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// tenantState is everything the engine keeps about one tenant. mu guards all
// fields but the atomics. Fields are ordered by how often a decision touches
// them, so that an uncontended decision reads as few cache lines as it can.
type tenantState struct {
	mu       sync.Mutex
	id       uint64    // unique, never changes: the order in which a group locks its tenants
	removed  bool      // pruned from the registry: look the tenant up again
	known    bool      // the policy names the tenant (tenant.Known)
	snap     *snapshot // the snapshot the derived fields were derived from
	lastSeen int64     // µs of the last decision
	// offered accumulates the cost of requests that passed every level below
	// global since the last fairness tick: the tenant's demand on the plane.
	offered int64
	// arrivals counts those requests (not their cost): how many samples
	// the demand estimate rests on.
	arrivals int64
	stats    counters

	limit     limiter   // the tenant level
	endpoints []limiter // per endpoint of snap, aligned with snap.endpoints; in epInline when few
	epInline  [inlineEndpoints]limiter
	// lastKey caches the most recent api key's state: most traffic of a
	// tenant comes through few keys.
	lastKey      string
	lastKeyState *keyState
	// hashedKey is the api key whose short hash is keyHash: the trace
	// stores a key's hash, never the key, and most of a tenant's traffic
	// comes through few keys. Beside lastKey: the same cache lines.
	hashedKey string
	keyHash   [shortKeyHashBytes]byte
	keys      map[string]*keyState

	tierRank  int
	mayBorrow bool
	share     shareBucket
	allowance limiter // borrow allowance: PerTenantCeiling, repaid at the pool's refill rate
	trace     traceRing

	name          string
	requestedTier string        // the tier the first request asked for (unknown tenants)
	tenant        policy.Tenant // the effective limits, from snap

	// demandBits is the measured demand in tokens per second (float64
	// bits), written by the fairness tick.
	demandBits atomic.Uint64
	// partBits is the part of the tenant's fleet-wide demand that arrives
	// at this node (float64 bits; 1 but in mode local-reconciled), written
	// by the fairness tick.
	partBits atomic.Uint64
	// The moving averages behind demandBits (tokens/s) and the arrival
	// rate (requests/s); owned by the fairness tick.
	demandAverage, demandWeight, arrivalAverage float64
}

// inlineEndpoints is how many endpoint limiters live inside tenantState,
// saving a pointer chase on every decision of a plane with few endpoints.
const inlineEndpoints = 4

// keyState is one api key's limiter.
type keyState struct {
	limit    limiter
	lastSeen int64
}

// counters are a tenant's decision totals.
type counters struct {
	admitted     int64
	admittedCost int64
	denied       [len(Levels)]int64
	borrowed     int64
}

// recordLocked counts decision d, made at now, in the tenant's counters and
// writes it to its trace.
func (ts *tenantState) recordLocked(now int64, d *Decision, apiKey string, endpoint *policy.Endpoint) {
	if d.Allow {
		ts.stats.admitted++
		ts.stats.admittedCost += d.Cost
		ts.stats.borrowed += d.Borrowed
	} else {
		ts.stats.denied[d.Level.index()]++
	}
	h, hasKey := ts.keyHashLocked(apiKey)
	ts.trace.record(now, d, h, hasKey, endpoint)
}

// recordGroupLocked records a request of a group: as recordLocked when the
// group was admitted or the request denied; a request that passed in a
// denied group is traced as undone (nothing was debited) and not counted.
func (ts *tenantState) recordGroupLocked(now int64, d *Decision, apiKey string, endpoint *policy.Endpoint, groupAllowed bool) {
	if groupAllowed || !d.Allow {
		ts.recordLocked(now, d, apiKey, endpoint)
		return
	}
	undone := Decision{Cost: d.Cost, Reason: reasonGroupUndone}
	h, hasKey := ts.keyHashLocked(apiKey)
	ts.trace.record(now, &undone, h, hasKey, endpoint)
}

// keyHashLocked is the short hash of an api key (policy.ShortKeyHash, as
// bytes); ok is false for no key. Computed once per change of key.
func (ts *tenantState) keyHashLocked(key string) (h [shortKeyHashBytes]byte, ok bool) {
	if key == "" {
		return h, false
	}
	if key != ts.hashedKey {
		ts.hashedKey, ts.keyHash = key, shortKeyHash(key)
	}
	return ts.keyHash, true
}

// overflowName names the state shared by keys (and tenants) beyond the bounds.
const overflowName = "\x00overflow"

// syncLocked derives the tenant's limits from snap, carrying bucket state
// across changes.
func (ts *tenantState) syncLocked(snap *snapshot, now int64, keys *keyBudget) {
	now = snap.changeTime(now)
	p := snap.policy
	t, known := p.Tenant(ts.name)
	if !known {
		t, _ = p.DefaultTenant(ts.name, ts.requestedTier)
	}
	ts.tenant, ts.known = t, known
	ts.lastKey, ts.lastKeyState = "", nil // the key's state may change below (overflow, deletion)
	ts.tierRank = snap.tierRank[t.Tier]
	ts.mayBorrow = p.MayBorrow(&t)
	ts.limit.change(t.Limit, now)
	ts.limit.fit(snap, now)
	ts.allowance.change(snap.borrowCeiling, now)

	var inline [inlineEndpoints]limiter
	var endpoints []limiter
	if n := len(snap.endpoints); n <= inlineEndpoints {
		endpoints = inline[:n]
	} else {
		endpoints = make([]limiter, n)
	}
	for i := range snap.endpoints {
		lim := p.EndpointLimit(&t, i)
		if old := ts.endpointLimiter(snap.endpoints[i].Name); old != nil {
			endpoints[i] = *old
			endpoints[i].change(lim, now)
		} else {
			endpoints[i].reset(lim, now)
		}
		endpoints[i].fit(snap, now)
	}
	if len(endpoints) <= inlineEndpoints {
		// Written only now: the loop above read the old limiters, which
		// may live in epInline.
		ts.epInline = inline
		endpoints = ts.epInline[:len(endpoints)]
	}
	ts.endpoints = endpoints
	for key, ks := range ts.keys {
		lim := p.KeyLimit(&t, key)
		if key == overflowName {
			lim = p.KeyLimit(&t, "")
		}
		if lim == nil { // the key has no limit any more
			ts.deleteKeyLocked(key, ks, keys)
			continue
		}
		ks.limit.change(lim, now)
		ks.limit.fit(snap, now)
	}
	ts.snap = snap
}

// forEachLimiterLocked calls f with each of the tenant's limiters of its
// own levels: tenant, endpoints, keys.
func (ts *tenantState) forEachLimiterLocked(f func(*limiter)) {
	f(&ts.limit)
	for i := range ts.endpoints {
		f(&ts.endpoints[i])
	}
	for _, ks := range ts.keys {
		f(&ks.limit)
	}
}

// deleteKeyLocked forgets an api key's state.
func (ts *tenantState) deleteKeyLocked(key string, ks *keyState, keys *keyBudget) {
	delete(ts.keys, key)
	keys.count.Add(-1)
	if ks == ts.lastKeyState {
		ts.lastKey, ts.lastKeyState = "", nil
	}
}

// keyBudget bounds the api keys with state: per tenant and in all.
type keyBudget struct {
	perTenant int
	total     int64
	count     atomic.Int64 // key states in all tenants
}

// sustainableRate is the most the tenant's own level lets through in the
// long run, in tokens per second: its limit's rate, plus the pool's refill
// rate when it may borrow (its debt is repaid at that rate); +Inf without a
// tenant limit. Endpoint and key limits are per endpoint and key, and not
// counted.
func (ts *tenantState) sustainableRate(snap *snapshot) float64 {
	if !ts.limit.active() {
		return math.Inf(1)
	}
	rate := perSecond(*ts.limit.lim)
	if ts.mayBorrow && snap.pool != nil {
		rate += perSecond(*snap.pool)
	}
	return rate
}

// endpointLimiter finds the tenant's limiter for an endpoint of the snapshot
// it was last synced to.
func (ts *tenantState) endpointLimiter(name string) *limiter {
	if ts.snap == nil {
		return nil
	}
	for i := range ts.snap.endpoints {
		if ts.snap.endpoints[i].Name == name && i < len(ts.endpoints) {
			return &ts.endpoints[i]
		}
	}
	return nil
}

// keyLocked returns the limiter for an api key, creating it when the key has
// a limit; nil when it has none. Keys the policy names always get their own
// state; beyond the budget other new keys share one overflow limiter with
// the tier's key limit, so a flood of distinct keys cannot grow memory.
func (ts *tenantState) keyLocked(key string, snap *snapshot, keys *keyBudget, now int64) *keyState {
	if ts.lastKeyState != nil && key == ts.lastKey {
		return ts.lastKeyState
	}
	ks := ts.keyLookupLocked(key, snap, keys, now)
	if ks != nil {
		ts.lastKey, ts.lastKeyState = key, ks
	}
	return ks
}

func (ts *tenantState) keyLookupLocked(key string, snap *snapshot, keys *keyBudget, now int64) *keyState {
	if ks, ok := ts.keys[key]; ok {
		return ks
	}
	lim := snap.policy.KeyLimit(&ts.tenant, key)
	if lim == nil {
		return nil
	}
	named := snap.policy.NamesKey(&ts.tenant, key)
	if !named && (len(ts.keys) >= keys.perTenant || keys.count.Load() >= keys.total) {
		if ks, ok := ts.keys[overflowName]; ok {
			return ks
		}
		if lim = snap.policy.KeyLimit(&ts.tenant, ""); lim == nil {
			return nil
		}
		key = overflowName
	} else {
		key = strings.Clone(key) // do not pin the caller's buffer
	}
	if ts.keys == nil {
		ts.keys = make(map[string]*keyState)
	}
	ks := &keyState{}
	ks.limit.reset(lim, now)
	ks.limit.fit(snap, now)
	ts.keys[key] = ks
	keys.count.Add(1)
	return ks
}

// idleLocked reports whether the tenant has been idle since before cutoff
// and holds nothing a fresh state would not: forgetting it changes no decision.
func (ts *tenantState) idleLocked(cutoff, now int64) bool {
	if ts.lastSeen > cutoff || len(ts.keys) > 0 {
		return false
	}
	for _, l := range []*limiter{&ts.limit, &ts.allowance} {
		l.settle(now)
		if !l.full() {
			return false
		}
	}
	for i := range ts.endpoints {
		ts.endpoints[i].settle(now)
		if !ts.endpoints[i].full() {
			return false
		}
	}
	return true
}

// pruneKeysLocked forgets keys idle since before cutoff whose limiters are full.
func (ts *tenantState) pruneKeysLocked(cutoff, now int64, keys *keyBudget) {
	for key, ks := range ts.keys {
		if ks.lastSeen > cutoff {
			continue
		}
		ks.limit.settle(now)
		if ks.limit.full() {
			ts.deleteKeyLocked(key, ks, keys)
		}
	}
}

// registry holds every tenant state, sharded to keep lookups of unknown
// tenants cheap under concurrency. Known tenants are also reachable lock-free
// through the snapshot's known map.
type registry struct {
	seed   maphash.Seed
	count  atomic.Int64
	ids    atomic.Uint64 // the last tenantState.id given
	shards [registryShards]registryShard
}

const registryShards = 64

type registryShard struct {
	mu      sync.RWMutex
	tenants map[string]*tenantState
}

func (r *registry) init() {
	r.seed = maphash.MakeSeed()
	for i := range r.shards {
		r.shards[i].tenants = make(map[string]*tenantState)
	}
}

func (r *registry) shard(name string) *registryShard {
	return &r.shards[maphash.String(r.seed, name)%registryShards]
}

func (r *registry) get(name string) *tenantState {
	sh := r.shard(name)
	sh.mu.RLock()
	ts := sh.tenants[name]
	sh.mu.RUnlock()
	return ts
}

// getOrCreate returns the tenant's state, creating it. Beyond limit states
// (when limit > 0) new tenants share one overflow state, which has the
// default tier whatever they ask. The bound may be passed by the number of
// creations racing at the moment it is reached.
func (r *registry) getOrCreate(name, tier string, limit int) *tenantState {
	if ts := r.get(name); ts != nil {
		return ts
	}
	if limit > 0 && r.count.Load() >= int64(limit) {
		name, tier = overflowName, ""
		if ts := r.get(name); ts != nil {
			return ts
		}
	}
	sh := r.shard(name)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ts := sh.tenants[name]; ts != nil {
		return ts
	}
	ts := &tenantState{id: r.ids.Add(1), name: strings.Clone(name), requestedTier: strings.Clone(tier)}
	ts.partBits.Store(math.Float64bits(1))
	sh.tenants[ts.name] = ts
	r.count.Add(1)
	return ts
}

// appendAll appends every tenant state to dst.
func (r *registry) appendAll(dst []*tenantState) []*tenantState {
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.RLock()
		for _, ts := range sh.tenants {
			dst = append(dst, ts)
		}
		sh.mu.RUnlock()
	}
	return dst
}

// remove forgets a tenant if its state is still ts.
func (r *registry) remove(ts *tenantState) {
	sh := r.shard(ts.name)
	sh.mu.Lock()
	if sh.tenants[ts.name] == ts {
		delete(sh.tenants, ts.name)
		r.count.Add(-1)
	}
	sh.mu.Unlock()
}
