package enforcer

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

// fairness measures each tenant's demand on the plane and, when that demand
// exceeds the global rate, computes every tenant's weighted max-min fair share
// with tier floors (scheduler.MaxMin). It runs as a tick inside the first
// decision whose time passes nextTick, so it follows the engine's time, real
// or virtual, and costs the fast path one atomic load when it is not due.
//
// A tenant's share is max(level×weight, floor share): the water level times
// its weight, or what its tier floor guarantees it. A tenant whose demand is
// below its share is not slowed by it; one above is paced to it by its share
// bucket. The global bucket stays in force as the hard limit.
type fairness struct {
	nextTick      atomic.Int64  // µs; the first decision at or after it runs the tick
	contended     atomic.Bool   // shares are in force
	levelBits     atomic.Uint64 // water level (tokens/s per unit weight), float64 bits
	epoch         atomic.Uint64 // allocation number; a tenant's floor share is valid for one epoch
	globalDenials atomic.Int64  // denials at the global level since the last tick

	mu       sync.Mutex // guards the fields below; held by the running tick
	lastTick int64
	ticks    uint64
	tenants  []*tenantState
	items    []scheduler.Item
	out      []float64
	floors   []float64
	byTier   [][]int
	tierItem []scheduler.Item
	tierOut  []float64
	scratch  scheduler.Scratch
}

// shareRate is the tenant's fair share in tokens per second.
func (f *fairness) shareRate(ts *tenantState) float64 {
	rate := math.Float64frombits(f.levelBits.Load()) * float64(ts.tenant.Weight)
	if ts.shareEpoch.Load() == f.epoch.Load() {
		rate = max(rate, math.Float64frombits(ts.floorShareBits.Load()))
	}
	return rate
}

// tick measures demand, reallocates contended capacity and prunes idle state.
// Only one tick runs at a time; a decision that finds one running goes on.
func (e *Engine) tick(now int64) {
	f := &e.fair
	if !f.mu.TryLock() {
		return
	}
	defer f.mu.Unlock()
	if now < f.nextTick.Load() {
		return // another decision ran this tick
	}
	f.nextTick.Store(now + e.settings.tickInterval.Microseconds())
	snap := e.snap.Load()
	elapsed := now - f.lastTick
	first := f.lastTick == 0
	f.lastTick = now
	f.ticks++
	denials := f.globalDenials.Swap(0)

	f.tenants = e.tenants.appendAll(f.tenants[:0])
	if first || elapsed <= 0 {
		for _, ts := range f.tenants {
			ts.offered.Store(0)
		}
		return
	}
	seconds := float64(elapsed) / 1e6
	alpha := 1 - math.Exp(-seconds/e.settings.demandWindow.Seconds())
	var total float64
	for _, ts := range f.tenants {
		instant := float64(ts.offered.Swap(0)) / seconds
		demand := math.Float64frombits(ts.demandBits.Load())
		demand += alpha * (instant - demand)
		if demand < 1e-9 {
			demand = 0
		}
		ts.demandBits.Store(math.Float64bits(demand))
		total += demand
	}

	capacity := snap.globalPerSec * (1 - e.settings.headroom)
	if snap.fairness == fairNone || (total < 0.9*capacity && denials == 0) {
		f.contended.Store(false)
	} else {
		f.allocate(snap, capacity)
	}
	e.prune(snap, now)
}

// allocate computes the fair shares of every tenant with demand and publishes
// them as a new epoch.
func (f *fairness) allocate(snap *snapshot, capacity float64) {
	n := len(f.tenants)
	f.items = f.items[:0]
	f.out = grow(f.out, n)
	f.floors = grow(f.floors, n)
	for len(f.byTier) < len(snap.floors) {
		f.byTier = append(f.byTier, nil)
	}
	for i := range f.byTier {
		f.byTier[i] = f.byTier[i][:0]
	}
	for i, ts := range f.tenants {
		// weight and tier were derived under ts.mu at the tenant's last
		// decision; reading them here races only with a policy swap, whose
		// effect the next tick picks up.
		ts.mu.Lock()
		weight, rank, synced := ts.tenant.Weight, ts.tierRank, ts.snap == snap
		ts.mu.Unlock()
		demand := math.Float64frombits(ts.demandBits.Load())
		if !synced || weight < 1 {
			weight, rank = 1, len(snap.floors)-1
		}
		f.items = append(f.items, scheduler.Item{Weight: float64(weight), Cap: demand})
		f.floors[i] = 0
		f.byTier[rank] = append(f.byTier[rank], i)
	}
	// Each tier's floor is shared among its tenants by weighted max-min on
	// their demand: the per-tenant lower bounds of the global allocation.
	for rank, members := range f.byTier {
		if snap.floors[rank] <= 0 || len(members) == 0 {
			continue
		}
		f.tierItem = f.tierItem[:0]
		for _, i := range members {
			f.tierItem = append(f.tierItem, scheduler.Item{Weight: f.items[i].Weight, Cap: f.items[i].Cap})
		}
		f.tierOut = grow(f.tierOut, len(members))
		scheduler.MaxMin(snap.floors[rank]*(capacity/snap.globalPerSec), f.tierItem, f.tierOut, &f.scratch)
		for j, i := range members {
			f.floors[i] = f.tierOut[j]
			f.items[i].Floor = f.tierOut[j]
		}
	}
	level := scheduler.MaxMin(capacity, f.items, f.out, &f.scratch)
	if math.IsInf(level, 1) {
		f.contended.Store(false)
		return
	}
	epoch := f.epoch.Load() + 1
	for i, ts := range f.tenants {
		ts.floorShareBits.Store(math.Float64bits(f.floors[i]))
		ts.shareEpoch.Store(epoch)
	}
	f.levelBits.Store(math.Float64bits(level))
	f.epoch.Store(epoch)
	f.contended.Store(true)
}

// prune forgets idle state, one registry shard per tick: unknown tenants
// whose state is as a fresh one's, and idle full api keys of every tenant.
func (e *Engine) prune(snap *snapshot, now int64) {
	if !e.swapMu.TryLock() {
		return // a policy swap is running; prune next time
	}
	defer e.swapMu.Unlock()
	cutoff := now - e.settings.idleTTL.Microseconds()
	sh := &e.tenants.shards[e.fair.ticks%registryShards]
	sh.mu.RLock()
	candidates := make([]*tenantState, 0, len(sh.tenants))
	for _, ts := range sh.tenants {
		candidates = append(candidates, ts)
	}
	sh.mu.RUnlock()
	for _, ts := range candidates {
		ts.mu.Lock()
		ts.pruneKeysLocked(cutoff, now)
		if snap.known[ts.name] == nil && ts.idleLocked(cutoff, now) {
			ts.removed = true
			e.tenants.remove(ts)
		}
		ts.mu.Unlock()
	}
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
