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

	limit limiter // the tenant level
	// endpoints are the endpoint level's limiters, aligned with
	// rec.endpoints (the endpoints on which the tenant has a limit).
	endpoints []limiter
	// lastKey caches the most recent api key's state: most traffic of a
	// tenant comes through few keys.
	lastKey      string
	lastKeyState *keyState
	keys         keyTable

	share shareBucket
	// allowance is the borrow allowance (PerTenantCeiling, repaid at the
	// pool's refill rate) of a tenant of a plane with a burst pool, or one
	// that had one; nil for one that never had.
	allowance *limiter
	// trace holds the tenant's last decisions from its first one (a tenant
	// the policy names) or its first denial (one it does not: most of a
	// million such tenants are never denied, and their traces would be
	// most of their memory); nil until then.
	trace *traceRing

	name          string
	requestedTier string        // the tier the first request asked for (unknown tenants)
	rec           *tenantRecord // the effective limits, from snap

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

// keyState is one api key's limiter.
type keyState struct {
	key      string // the api key, or overflowName
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
// writes it to its trace (tenantState.trace).
func (ts *tenantState) recordLocked(now int64, d *Decision, apiKey string, endpoint *policy.Endpoint) {
	if d.Allow {
		ts.stats.admitted++
		ts.stats.admittedCost += d.Cost
		ts.stats.borrowed += d.Borrowed
	} else {
		ts.stats.denied[d.Level.index()]++
	}
	if ts.trace == nil {
		if d.Allow && !ts.known {
			return
		}
		ts.trace = new(traceRing)
	}
	ts.trace.record(now, d, apiKey, endpoint)
}

// recordGroupLocked records a request of a group: as recordLocked when the
// group was admitted or the request denied; a request that passed in a
// denied group is traced as undone (nothing was debited) and not counted.
func (ts *tenantState) recordGroupLocked(now int64, d *Decision, apiKey string, endpoint *policy.Endpoint, groupAllowed bool) {
	if groupAllowed || !d.Allow {
		ts.recordLocked(now, d, apiKey, endpoint)
		return
	}
	if ts.trace != nil {
		undone := Decision{Cost: d.Cost, Reason: reasonGroupUndone}
		ts.trace.record(now, &undone, apiKey, endpoint)
	}
}

// overflowName names the state shared by keys (and tenants) beyond the bounds.
const overflowName = "\x00overflow"

// syncLocked derives the tenant's limits from snap, carrying bucket state
// across changes.
func (ts *tenantState) syncLocked(snap *snapshot, now int64, keys *keyBudget) {
	now = snap.changeTime(now)
	p := snap.policy
	old := ts.rec
	ts.rec, ts.known = snap.recordOf(ts.name, ts.requestedTier)
	t := &ts.rec.tenant
	ts.lastKey, ts.lastKeyState = "", nil // the key's state may change below (overflow, deletion)
	ts.limit.change(t.Limit, now)
	ts.limit.fit(snap, now)
	if ts.allowance == nil && snap.borrowCeiling != nil {
		// Every tenant of a plane with a pool, whether it may borrow or
		// not: its allowance follows every ceiling the plane has had, as
		// a tenant's own bucket follows its limit, so that two tenants
		// that never borrowed are never told apart by which tiers a past
		// policy let borrow.
		ts.allowance = new(limiter)
	}
	if ts.allowance != nil {
		ts.allowance.change(snap.borrowCeiling, now)
	}

	var endpoints []limiter
	if limited := ts.rec.endpoints; limited != nil {
		endpoints = make([]limiter, len(limited))
		for i, re := range limited {
			if l := ts.endpointLimiter(old, snap.endpoints[re.ep].Name); l != nil {
				endpoints[i] = *l
				endpoints[i].change(re.lim, now)
			} else {
				endpoints[i].reset(re.lim, now)
			}
			endpoints[i].fit(snap, now)
		}
	}
	ts.endpoints = endpoints
	for ks := range ts.keys.all() {
		lim := p.KeyLimit(t, ks.key)
		if ks.key == overflowName {
			lim = p.KeyLimit(t, "")
		}
		if lim == nil { // the key has no limit any more
			ts.deleteKeyLocked(ks, keys)
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
	for ks := range ts.keys.all() {
		f(&ks.limit)
	}
}

// deleteKeyLocked forgets an api key's state.
func (ts *tenantState) deleteKeyLocked(ks *keyState, keys *keyBudget) {
	ts.keys.remove(ks.key)
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

// admits reports whether ts may hold one more key state of its own.
func (k *keyBudget) admits(ts *tenantState) bool {
	return ts.keys.len() < k.perTenant && k.count.Load() < k.total
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
	if ts.rec.mayBorrow && snap.pool != nil {
		rate += perSecond(*snap.pool)
	}
	return rate
}

// endpointLimiter finds the tenant's limiter for the endpoint named name
// in the snapshot it was last synced to, whose record was rec; nil when it
// had none.
func (ts *tenantState) endpointLimiter(rec *tenantRecord, name string) *limiter {
	if ts.snap == nil || rec == nil {
		return nil
	}
	for i, re := range rec.endpoints {
		if ts.snap.endpoints[re.ep].Name == name && i < len(ts.endpoints) {
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
	if ks := ts.keys.get(key); ks != nil {
		return ks
	}
	lim := snap.policy.KeyLimit(&ts.rec.tenant, key)
	if lim == nil {
		return nil
	}
	named := snap.policy.NamesKey(&ts.rec.tenant, key)
	if !named && !keys.admits(ts) {
		if ks := ts.keys.get(overflowName); ks != nil {
			return ks
		}
		if lim = snap.policy.KeyLimit(&ts.rec.tenant, ""); lim == nil {
			return nil
		}
		key = overflowName
	} else {
		key = strings.Clone(key) // do not pin the caller's buffer
	}
	ks := &keyState{key: key}
	ks.limit.reset(lim, now)
	ks.limit.fit(snap, now)
	ts.keys.put(ks)
	keys.count.Add(1)
	return ks
}

// idleLocked reports whether the tenant has been idle since before cutoff
// and holds nothing a fresh state would not: forgetting it changes no decision.
func (ts *tenantState) idleLocked(cutoff, now int64) bool {
	if ts.lastSeen > cutoff || ts.keys.len() > 0 {
		return false
	}
	for _, l := range []*limiter{&ts.limit, ts.allowance} {
		if l == nil {
			continue
		}
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
	for ks := range ts.keys.all() {
		if ks.lastSeen > cutoff {
			continue
		}
		ks.limit.settle(now)
		if ks.limit.full() {
			ts.deleteKeyLocked(ks, keys)
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
