package enforcer

import (
	"hash/maphash"
	"math"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// tenantState is everything the engine keeps about one tenant. mu guards all
// fields but the atomics.
//
// An engine may keep a million of them, so a state holds inline only what
// every tenant needs (160 bytes): its lock, its record, its counters, its
// tenant bucket, its first api key and its demand (the fairness tick's
// averages in float32, which are estimates). What only some tenants have —
// endpoint limits, a borrow allowance, a share bucket under contention, a
// trace, denials, a tier asked for — is in more, nil until one is needed.
type tenantState struct {
	mu       sync.Mutex
	id       uint32        // unique among live states: the order in which a group locks its tenants
	removed  bool          // pruned from the registry: look the tenant up again
	known    bool          // the policy names the tenant (tenant.Known)
	snap     *snapshot     // the snapshot the derived fields were derived from
	rec      *tenantRecord // the effective limits, from snap
	lastSeen int64         // µs of the last decision
	// offered accumulates the cost of requests that passed every level below
	// global since the last fairness tick: the tenant's demand on the plane.
	offered int64
	// arrivals counts those requests (not their cost): how many samples
	// the demand estimate rests on.
	arrivals int64
	// admitted and admittedCost count the admitted requests and their cost.
	admitted, admittedCost int64

	limit limiter // the tenant level
	keys  keyTable
	name  string

	// demandBits is the measured demand in tokens per second (float64
	// bits), written by the fairness tick.
	demandBits atomic.Uint64
	// partBits is the part of the tenant's fleet-wide demand that arrives
	// at this node (1 but in mode local-reconciled; float32 bits, stored
	// so that 0 stands for 1: setPart), written by the fairness tick.
	partBits atomic.Uint32
	// The moving averages behind demandBits (tokens/s) and the arrival
	// rate (requests/s); owned by the fairness tick.
	demandAverage, demandWeight, arrivalAverage float32

	more *tenantMore
}

// tenantMore is the part of a tenant's state that only some tenants need.
type tenantMore struct {
	// requestedTier is the tier the requests of a tenant the policy does
	// not name ask for ("" for the default).
	requestedTier string
	// endpoints are the endpoint level's limiters, aligned with
	// rec.endpoints (the endpoints on which the tenant has a limit); nil
	// until the tenant's first request to one of them (endpointLocked).
	endpoints []limiter
	// allowance is the borrow allowance (PerTenantCeiling, repaid at the
	// pool's refill rate) of a tenant of a plane with a burst pool, or one
	// that had one; nil for one that never had.
	allowance *limiter
	share     shareBucket
	// trace holds the tenant's last decisions from its first one (a tenant
	// the policy names) or its first denial (one it does not: most of a
	// million such tenants are never denied, and their traces would be
	// most of their memory); nil until then.
	trace    *traceRing
	denied   [len(Levels)]int64
	borrowed int64
}

// moreLocked is ts.more, made when the tenant has none.
func (ts *tenantState) moreLocked() *tenantMore {
	if ts.more == nil {
		ts.more = new(tenantMore)
	}
	return ts.more
}

// endpointsLocked are the tenant's endpoint limiters (tenantMore.endpoints).
func (ts *tenantState) endpointsLocked() []limiter {
	if ts.more == nil {
		return nil
	}
	return ts.more.endpoints
}

// endpointLocked is the tenant's limiter at slot (rec.endpointSlot) of
// its endpoint limiters, which are made at its first request to an
// endpoint where it has a limit: a tenant that never uses one (most
// tenants of a tier with an export limit never export) holds none, and
// the full buckets it would hold decide as no state does.
func (ts *tenantState) endpointLocked(slot int, snap *snapshot, now int64) *limiter {
	m := ts.moreLocked()
	if m.endpoints == nil {
		now = snap.changeTime(now)
		m.endpoints = make([]limiter, len(ts.rec.endpoints))
		for i, re := range ts.rec.endpoints {
			m.endpoints[i].resetShape(re.lim, snap.shapeOf(re.lim), now)
			m.endpoints[i].fit(snap, now)
		}
	}
	return &m.endpoints[slot]
}

// allowanceLocked is the tenant's borrow allowance, nil when it has none.
func (ts *tenantState) allowanceLocked() *limiter {
	if ts.more == nil {
		return nil
	}
	return ts.more.allowance
}

// requestedTier is the tier the requests of a tenant the policy does not
// name ask for. ts.mu is held.
func (ts *tenantState) requestedTier() string {
	if ts.more == nil {
		return ""
	}
	return ts.more.requestedTier
}

// part is the part of the tenant's fleet-wide demand that arrives at this
// node (partBits).
func (ts *tenantState) part() float64 {
	return float64(math.Float32frombits(ts.partBits.Load() ^ partOne))
}

// setPart sets part (partBits).
func (ts *tenantState) setPart(part float64) {
	ts.partBits.Store(math.Float32bits(float32(part)) ^ partOne)
}

// partOne is 1's float32 bits: partBits holds a part's bits xor partOne,
// so that the zero value stands for 1.
const partOne = 0x3f800000 // math.Float32bits(1)

// keyState is one api key's limiter.
type keyState struct {
	key      string // the api key, or overflowName
	limit    limiter
	lastSeen int64
	// many is the tenant's map of every key's state, held by the first
	// key's (keyTable.head) when the tenant has two or more; nil otherwise.
	many map[string]*keyState
}

// counters are a tenant's decision totals.
type counters struct {
	admitted     int64
	admittedCost int64
	denied       [len(Levels)]int64
	borrowed     int64
}

// countersLocked are the tenant's decision totals.
func (ts *tenantState) countersLocked() counters {
	c := counters{admitted: ts.admitted, admittedCost: ts.admittedCost}
	if m := ts.more; m != nil {
		c.denied, c.borrowed = m.denied, m.borrowed
	}
	return c
}

// recordLocked counts decision d, made at now, in the tenant's counters and
// writes it to its trace (tenantMore.trace).
func (ts *tenantState) recordLocked(now int64, d *Decision, apiKey string, endpoint *policy.Endpoint) {
	if d.Allow {
		ts.admitted++
		ts.admittedCost += d.Cost
		if d.Borrowed != 0 {
			ts.moreLocked().borrowed += d.Borrowed
		}
	} else {
		ts.moreLocked().denied[d.Level.index()]++
	}
	if ts.more == nil || ts.more.trace == nil {
		if d.Allow && !ts.known {
			return
		}
		ts.moreLocked().trace = new(traceRing)
	}
	ts.more.trace.record(now, d, apiKey, endpoint)
}

// recordGroupLocked records a request of a group: as recordLocked when the
// group was admitted or the request denied; a request that passed in a
// denied group is traced as undone (nothing was debited) and not counted.
func (ts *tenantState) recordGroupLocked(now int64, d *Decision, apiKey string, endpoint *policy.Endpoint, groupAllowed bool) {
	if groupAllowed || !d.Allow {
		ts.recordLocked(now, d, apiKey, endpoint)
		return
	}
	if ts.more != nil && ts.more.trace != nil {
		undone := Decision{Cost: d.Cost, Reason: reasonGroupUndone}
		ts.more.trace.record(now, &undone, apiKey, endpoint)
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
	ts.rec, ts.known = snap.recordOf(ts.name, ts.requestedTier())
	t := &ts.rec.tenant
	ts.limit.change(snap, t.Limit, now)
	ts.limit.fit(snap, now)
	if ts.allowanceLocked() == nil && snap.borrowCeiling != nil {
		// Every tenant of a plane with a pool, whether it may borrow or
		// not: its allowance follows every ceiling the plane has had, as
		// a tenant's own bucket follows its limit, so that two tenants
		// that never borrowed are never told apart by which tiers a past
		// policy let borrow.
		ts.moreLocked().allowance = new(limiter)
	}
	if a := ts.allowanceLocked(); a != nil {
		a.change(snap, snap.borrowCeiling, now)
	}

	// The endpoint limiters carry over only when the tenant has used one:
	// until then they are full, as new ones are (endpointLocked).
	var endpoints []limiter
	if limited := ts.rec.endpoints; limited != nil && ts.endpointsLocked() != nil {
		endpoints = make([]limiter, len(limited))
		for i, re := range limited {
			if l := ts.endpointLimiter(old, snap.endpoints[re.ep].Name); l != nil {
				endpoints[i] = *l
				endpoints[i].change(snap, re.lim, now)
			} else {
				endpoints[i].resetShape(re.lim, snap.shapeOf(re.lim), now)
			}
			endpoints[i].fit(snap, now)
		}
	}
	if ts.more != nil {
		ts.more.endpoints = endpoints
	}
	for ks := range ts.keys.all() {
		lim := p.KeyLimit(t, ks.key)
		if ks.key == overflowName {
			lim = p.KeyLimit(t, "")
		}
		if lim == nil { // the key has no limit any more
			ts.deleteKeyLocked(ks, keys)
			continue
		}
		ks.limit.change(snap, lim, now)
		ks.limit.fit(snap, now)
	}
	ts.snap = snap
}

// forEachLimiterLocked calls f with each of the tenant's limiters of its
// own levels: tenant, endpoints, keys.
func (ts *tenantState) forEachLimiterLocked(f func(*limiter)) {
	f(&ts.limit)
	eps := ts.endpointsLocked()
	for i := range eps {
		f(&eps[i])
	}
	for ks := range ts.keys.all() {
		f(&ks.limit)
	}
}

// deleteKeyLocked forgets an api key's state.
func (ts *tenantState) deleteKeyLocked(ks *keyState, keys *keyBudget) {
	ts.keys.remove(ks.key)
	keys.count.Add(-1)
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
	rate := perSecond(*ts.limit.limit())
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
	eps := ts.endpointsLocked()
	for i, re := range rec.endpoints {
		if ts.snap.endpoints[re.ep].Name == name && i < len(eps) {
			return &eps[i]
		}
	}
	return nil
}

// keyLocked returns the limiter for an api key, creating it when the key has
// a limit; nil when it has none. Keys the policy names always get their own
// state; beyond the budget other new keys share one overflow limiter with
// the tier's key limit, so a flood of distinct keys cannot grow memory.
func (ts *tenantState) keyLocked(key string, snap *snapshot, keys *keyBudget, now int64) *keyState {
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
	ks.limit.resetShape(lim, snap.shapeOf(lim), now)
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
	for _, l := range []*limiter{&ts.limit, ts.allowanceLocked()} {
		if l == nil {
			continue
		}
		l.settle(now)
		if !l.full() {
			return false
		}
	}
	eps := ts.endpointsLocked()
	for i := range eps {
		eps[i].settle(now)
		if !eps[i].full() {
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
	ids    atomic.Uint32 // the last tenantState.id given
	shards [registryShards]registryShard

	sortMu      sync.Mutex     // serialises appendAll's sorts, which share sortScratch
	sortScratch []*tenantState // appendAll's radix sort's other buffer, cleared between sorts
}

const registryShards = 64

type registryShard struct {
	mu      sync.RWMutex
	tenants tenantIndex
}

func (r *registry) init() { r.seed = maphash.MakeSeed() }

// hash is name's hash: its low bits pick the shard, the rest the slot in
// the shard's index.
func (r *registry) hash(name string) uint64 { return maphash.String(r.seed, name) }

func (r *registry) get(name string) *tenantState {
	h := r.hash(name)
	sh := &r.shards[h%registryShards]
	sh.mu.RLock()
	ts := sh.tenants.get(h/registryShards, name)
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
	h := r.hash(name)
	sh := &r.shards[h%registryShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if ts := sh.tenants.get(h/registryShards, name); ts != nil {
		return ts
	}
	ts := &tenantState{id: r.ids.Add(1), name: strings.Clone(name)}
	if tier != "" {
		ts.moreLocked().requestedTier = strings.Clone(tier)
	}
	sh.tenants.put(h/registryShards, ts, r.slot)
	r.count.Add(1)
	return ts
}

// slot is a state's hash in its shard's index (tenantIndex).
func (r *registry) slot(ts *tenantState) uint64 { return r.hash(ts.name) / registryShards }

// appendAll appends every tenant state to dst, in the order of their
// addresses in memory. Every caller walks them locking each one (the
// fairness tick every 100 ms, the reconcile, a swap), and a lock is a
// full barrier: in the index's hash order each state was a cache miss no
// other could overlap, 250 ns a tenant at 1,000,000 tenants, so that a
// tick took longer than its interval; in address order the hardware
// prefetches the walk (BenchmarkFairnessTick).
func (r *registry) appendAll(dst []*tenantState) []*tenantState {
	start := len(dst)
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.RLock()
		dst = sh.tenants.appendTo(dst)
		sh.mu.RUnlock()
	}
	r.sortMu.Lock()
	defer r.sortMu.Unlock()
	r.sortScratch = byAddress(dst[start:], r.sortScratch)
	return dst
}

// byAddress sorts s by address, with scratch (grown to len(s) and
// returned, cleared, to be passed again): a least-significant-digit radix
// sort, 11 bits a pass over the bits in which the addresses differ (three
// passes for a million states), where a comparison sort took 150 ms.
// Addresses only order the walk: the garbage collector does not move heap
// objects, and nothing converts one back to a pointer.
func byAddress(s, scratch []*tenantState) []*tenantState {
	if len(s) < 2 {
		return scratch
	}
	low, high := ^uintptr(0), uintptr(0)
	for _, ts := range s {
		a := uintptr(unsafe.Pointer(ts))
		low, high = min(low, a), max(high, a)
	}
	scratch = grow(scratch, len(s))
	const digit = 11
	var count [1 << digit]int
	src, dst := s, scratch
	for shift := 0; shift < bits.Len64(uint64(high-low)); shift += digit {
		clear(count[:])
		for _, ts := range src {
			count[(uintptr(unsafe.Pointer(ts))-low)>>shift&(1<<digit-1)]++
		}
		at := 0
		for d, n := range count {
			count[d], at = at, at+n
		}
		for _, ts := range src {
			d := (uintptr(unsafe.Pointer(ts)) - low) >> shift & (1<<digit - 1)
			dst[count[d]] = ts
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &s[0] { // an odd number of passes ended in scratch
		copy(s, src)
	}
	clear(scratch[:len(s)]) // it must not keep pruned states alive
	return scratch
}

// remove forgets a tenant if its state is still ts.
func (r *registry) remove(ts *tenantState) {
	h := r.hash(ts.name)
	sh := &r.shards[h%registryShards]
	sh.mu.Lock()
	if sh.tenants.remove(h/registryShards, ts, r.slot) {
		r.count.Add(-1)
	}
	sh.mu.Unlock()
}

// tenantIndex is a shard's states by name: an open-addressed table of
// pointers with linear probing, 3/4 full at most. A Go map of a million
// states costs some 40 bytes a state (a 24-byte slot, one control byte,
// and the room a table keeps to grow); this one 8 bytes a slot, 11 to 21
// a state. A lookup compares the names of the states it probes. The
// caller's lock guards it; the zero value is empty.
type tenantIndex struct {
	slots []*tenantState // a power of two long, or empty
	n     int
}

// get is the state named name, whose hash is h; nil when there is none.
func (t *tenantIndex) get(h uint64, name string) *tenantState {
	mask := uint64(len(t.slots) - 1)
	for i := h & mask; len(t.slots) > 0; i = (i + 1) & mask {
		ts := t.slots[i]
		if ts == nil || ts.name == name {
			return ts
		}
	}
	return nil
}

// put adds ts, whose name (of hash h) has no state yet; hash gives the
// hash of any state, to grow the table.
func (t *tenantIndex) put(h uint64, ts *tenantState, hash func(*tenantState) uint64) {
	if 4*(t.n+1) > 3*len(t.slots) {
		old := t.slots
		t.slots = make([]*tenantState, max(8, 2*len(old)))
		for _, o := range old {
			if o != nil {
				t.insert(hash(o), o)
			}
		}
	}
	t.insert(h, ts)
	t.n++
}

func (t *tenantIndex) insert(h uint64, ts *tenantState) {
	mask := uint64(len(t.slots) - 1)
	i := h & mask
	for t.slots[i] != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = ts
}

// remove takes ts (of hash h) out, reporting whether it was there. The
// states after it in its run move back (no tombstones), each to the
// earliest slot its probe reaches.
func (t *tenantIndex) remove(h uint64, ts *tenantState, hash func(*tenantState) uint64) bool {
	if len(t.slots) == 0 {
		return false
	}
	mask := uint64(len(t.slots) - 1)
	i := h & mask
	for t.slots[i] != ts {
		if t.slots[i] == nil {
			return false
		}
		i = (i + 1) & mask
	}
	t.slots[i] = nil
	t.n--
	for j := (i + 1) & mask; t.slots[j] != nil; j = (j + 1) & mask {
		home := hash(t.slots[j]) & mask
		// The state at j may move to the hole at i unless its home lies
		// cyclically in (i, j]: it would then be found before the hole.
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.slots[i], t.slots[j] = t.slots[j], nil
			i = j
		}
	}
	if t.n == 0 {
		t.slots = nil // a shard emptied gives its table back
	}
	return true
}

// appendTo appends every state to dst.
func (t *tenantIndex) appendTo(dst []*tenantState) []*tenantState {
	for _, ts := range t.slots {
		if ts != nil {
			dst = append(dst, ts)
		}
	}
	return dst
}
