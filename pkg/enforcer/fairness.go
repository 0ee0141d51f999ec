package enforcer

import (
	"iter"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

// fairness measures each tenant's demand on the plane and, when that demand
// exceeds the global rate, shares the global rate by weighted max-min
// (scheduler.MaxMin), every tier keeping its floor as far as it wants it:
// among all the tenants by their weights (the plane's shareBy tenant, the
// default), or hierarchically (shareBy tier), first among tiers by their
// weights and floors (among tiers that want more than their share, the
// lower-weight one is cut more), then within each tier among its tenants. It
// runs as a tick claimed by the first decision whose time passes nextTick,
// so it follows the engine's time, real or virtual, and costs the fast path
// one atomic load when not due.
//
// The outcome is one water level per tier: a tenant's fair share is its
// tier's level times its weight. A tenant below its share is not slowed by
// it; one above is paced to it by its share bucket; a tier whose whole demand
// fits gets an infinite level. The global bucket stays in force as the limit.
type fairness struct {
	nextTick  atomic.Int64 // µs; the first decision at or after it runs the tick
	contended atomic.Bool  // shares are in force
	// contendedSince is when shares came into force (µs): where a tenant
	// paced for the first time starts saving its share.
	contendedSince atomic.Int64
	epoch          atomic.Uint64
	globalDenials  atomic.Int64 // denials at the global level since the last tick
	// levelBits holds, per tier rank, the tier's water level: fair share
	// per unit of tenant weight in tokens per second (float64 bits).
	levelBits [policy.MaxTiers]atomic.Uint64

	// levelsSeq is the seq of the snapshot the water levels were computed
	// for: tier ranks change with the policy, so levels of another are void.
	levelsSeq atomic.Uint64

	mu       sync.Mutex // guards the fields below; held by the running tick
	lastTick int64
	ticks    uint64
	tenants  []*tenantState
	demands  []float64 // per tenant: the demand the allocation shares by, tokens/s
	weights  []float64 // per tenant, read with the tenant's lock at this tick
	ranks    []int
	caps     []float64 // per tenant: the most its own limit lets through, tokens/s
	byTier   [policy.MaxTiers][]scheduler.Item
	tiers    []scheduler.Item
	all      []scheduler.Item // shareBy tenant: the tenants of the tiers not at their floors
	out      []float64
	scratch  scheduler.Scratch
	// unmeasured is the demand of the tenants whose own averages have
	// not started (modes local and local-reconciled; central keeps its
	// own, per node, in centralFair).
	unmeasured tierTail
}

// tierTail is, per tier rank, the demand of the tenants whose own averages
// have not started (measureDemand returned 0 though they were offered
// something: a tenant's average starts at its second arrival): a moving
// average of their offered tokens per tier over the demand window, with
// its weight, as measureDemand's. Together they are dense enough to be
// measured at once, though each is too sparse to be. Left out, the tail's
// many small claims would be missing from the allocation, its tier's level
// would run high, and the tier over its share (free +22%, enterprise −24%
// at one node in the scale simulation, docs/scale.md). They are claimed
// as wanted in full: too sparse to be measured, they are below any level
// that matters. (Arrivals a measured tenant's average does not yet
// reflect are not counted: a whale's spike that ends would be claimed in
// full for a while, and starve its tier.)
type tierTail struct {
	offered [policy.MaxTiers]int64 // tokens since the last fold
	average [policy.MaxTiers]float64
	weight  float64
}

// fold takes the tokens offered since the last fold, seconds ago, into the
// averages and yields each tier rank's demand that is above zero, tokens/s.
func (t *tierTail) fold(tiers int, seconds float64, window time.Duration) iter.Seq2[int, float64] {
	alpha := 1 - math.Exp(-seconds/max(window.Seconds(), 1))
	t.weight += alpha * (1 - t.weight)
	for k := range tiers {
		t.average[k] += alpha * (float64(t.offered[k])/seconds - t.average[k])
		if t.average[k] < minTailDemand*t.weight {
			// Gone: a claim decaying towards zero would reach the
			// allocation's arithmetic as subnormal weights, and pace the
			// tenants that are measured wrongly.
			t.average[k] = 0
		}
	}
	t.offered = [policy.MaxTiers]int64{}
	return t.demands(tiers)
}

// demands yields each tier rank's demand that is above zero, tokens/s, as
// of the last fold.
func (t *tierTail) demands(tiers int) iter.Seq2[int, float64] {
	return func(yield func(int, float64) bool) {
		for k := range tiers {
			if demand := t.average[k] / t.weight; demand > 0 && !yield(k, demand) {
				return
			}
		}
	}
}

// minTailDemand is the least demand a tierTail claims, tokens/s: a token a
// thousand seconds is below any level that matters.
const minTailDemand = 1e-3

// claimTick reports whether the caller, deciding at now, is the one to run
// the tick that is due; the next is due an interval later.
func (f *fairness) claimTick(now int64, interval time.Duration) bool {
	next := f.nextTick.Load()
	return now >= next && f.nextTick.CompareAndSwap(next, now+interval.Microseconds())
}

// shareRate is the tenant's fair share on this node in tokens per second:
// its tier's level times its weight, times the part of its fleet-wide
// demand that arrives here (1 but in mode local-reconciled).
func (f *fairness) shareRate(ts *tenantState) float64 {
	level := math.Float64frombits(f.levelBits[ts.rec.tierRank].Load())
	if math.IsInf(level, 1) {
		return level // the tier's whole demand fits: no pacing, whatever the part
	}
	return level * float64(ts.rec.tenant.Weight) * ts.part()
}

// tick measures demand, reallocates contended capacity and prunes idle state.
// The decision that claims it (claimTick) runs it: inline in DecideAt, so
// that virtual time is exact, and in its own goroutine from Decide, so that
// no request waits for it. Ticks run one at a time.
func (e *Engine) tick(now int64) {
	f := &e.fair
	f.mu.Lock()
	defer f.mu.Unlock()
	if now <= f.lastTick {
		return // a later tick ran first (Decide runs them in goroutines)
	}
	snap := e.snap.Load()
	elapsed := now - f.lastTick
	first := f.lastTick == 0
	f.lastTick = now
	f.ticks++
	denials := f.globalDenials.Swap(0)
	defer e.prune(now)
	if snap.fairness == fairNone {
		// First come, first served: no demand to measure, nothing to share.
		f.contended.Store(false)
		f.lastTick = 0 // measure afresh if a policy turns fairness on
		return
	}

	// In mode local-reconciled the allocation is in a frame as wide as
	// the fleet's tenants are spread (spread, at most scale, the factor
	// from this node's share of the plane to the whole; reconcile.go):
	// this node's capacity, floors, tenants' caps and demands scaled up
	// by spread, a tenant the fleet reported at its fleet-wide demand in
	// that frame; each tenant is then paced at the part of its share that
	// its demand here is of its demand in the frame. The levels are the
	// fleet's when the last reconcile brought them and the tenants are
	// pinned rather than spread (fleetView, allocate).
	scale, spread, fleet, fleetLevels := e.fleetView()
	f.tenants = e.tenants.appendAll(f.tenants[:0])
	f.demands = grow(f.demands, len(f.tenants))
	f.weights = grow(f.weights, len(f.tenants))
	f.ranks = grow(f.ranks, len(f.tenants))
	f.caps = grow(f.caps, len(f.tenants))
	seconds := float64(elapsed) / 1e6
	step := e.demandStep(seconds, maxDemandWindow)
	var total float64
	for i, ts := range f.tenants {
		ts.mu.Lock()
		offered, arrivals := ts.offered, ts.arrivals
		ts.offered, ts.arrivals = 0, 0
		// A tenant not yet moved to this policy counts with weight 1 in
		// the lowest tier until it is.
		f.weights[i], f.ranks[i], f.caps[i] = 1, len(snap.floors)-1, math.Inf(1)
		if ts.snap == snap && ts.rec.tenant.Weight >= 1 {
			f.weights[i], f.ranks[i] = float64(ts.rec.tenant.Weight), ts.rec.tierRank
			f.caps[i] = ts.sustainableRate(snap) * spread
		}
		ts.mu.Unlock()
		if first {
			continue
		}
		demand := e.measureDemand(ts, offered, arrivals, &step)
		ts.demandBits.Store(math.Float64bits(demand))
		if demand <= 0 && offered > 0 {
			f.unmeasured.offered[f.ranks[i]] += offered
		}
		// The tenant's fleet-wide demand: what the fleet reported (at
		// least this node's own), or, for a tenant not among this node's
		// busiest, its demand here as if spread as those are (fleetDemand).
		whole, part := demand*spread, 1.0
		if d, ok := fleet[ts.name]; ok {
			whole = max(d*spread/scale, demand)
		}
		if demand > 0 && spread != 1 {
			part = demand / whole // in (0, 1]; 1 when the demand is gone
		}
		ts.setPart(part)
		f.demands[i] = whole
		total += whole
	}
	if first {
		f.unmeasured = tierTail{}
		return
	}
	// The tail no tenant's average holds yet, per tier, as claimants
	// wanting it in full (in local-reconciled, spread as a tenant outside
	// the fleet's view is).
	for k, demand := range f.unmeasured.fold(len(snap.floors), seconds, e.settings.demandWindow) {
		f.demands = append(f.demands, demand*spread)
		f.weights = append(f.weights, demand*spread/unattributedRatio)
		f.ranks = append(f.ranks, k)
		f.caps = append(f.caps, math.Inf(1))
		total += demand * spread
	}

	f.reallocate(snap, spread, total, denials, e.globalFill(now), e.settings.headroom, now, fleetLevels)
}

// reallocate shares the plane's global rate (scale times the snapshot's)
// when it is contended: when the demand, total tokens/s, comes near it,
// requests were denied at the global level since the last tick, or the
// global bucket is below half full (fill, 0 to 1). Mode local and
// local-reconciled call it from tick with this node's figures, mode
// central from its fleet exchange with the fleet's (central_fair.go).
func (f *fairness) reallocate(snap *snapshot, scale, total float64, denials int64, fill, headroom float64, now int64, fleet *[policy.MaxTiers]float64) {
	capacity := snap.globalPerSec * scale * (1 - headroom - refillBias(fill))
	if snap.globalPerSec <= 0 || (total < 0.9*capacity && denials == 0 && fill > 0.5) {
		// A global limit that never refills has no rate to share.
		f.contended.Store(false)
	} else {
		f.allocate(snap, capacity, now, fleet)
	}
}

// measureDemand folds one tick's offered tokens and arrivals into the
// tenant's demand estimate and returns it (tokens/s), an exponential
// moving average over a window of at least demandWindow and long enough to
// hold demandSamples arrivals, up to maxWindow (maxDemandWindow; in mode
// central, where a node sees its part of a tenant's arrivals, as many
// times longer as there are nodes, so that a node's estimate rests on as
// many arrivals as one engine's would).
//
// Why the window follows the arrival rate: the allocation caps each
// tenant's claim at its estimated demand, min(estimate, level), and min is
// concave, so a noisy estimate understates what a tenant below the level
// really takes. A tenant sending one request a second, averaged over one
// second, is estimated at 0 most ticks and at several requests a second
// right after each arrival; summed over the thousands of such tenants of a
// free tier, the allocation believes they take less than they do, sets the
// tier's level too high, and the tier runs over its share (by 30% in
// experiment 5 of docs/experiments.md). Averaging each tenant over a fixed
// number of its own arrivals bounds the estimate's relative noise at
// about 1/√(2·demandSamples) whatever its rate, while a busy tenant keeps a
// short window: a whale's spike is seen at once and its end within a
// window of demandWindow.
func (e *Engine) measureDemand(ts *tenantState, offered, arrivals int64, step *demandStep) float64 {
	seconds := step.seconds
	// The averages are kept in float32 (a million tenants' state) and
	// computed in float64.
	average, weight, arrivalAverage := float64(ts.demandAverage), float64(ts.demandWeight), float64(ts.arrivalAverage)
	fresh := weight == 0
	if fresh && arrivals > 0 {
		// The arrival that starts a tenant's average is there because the
		// average starts with it: counted, it would add one arrival to
		// every small tenant's few and overstate their demand (by a third
		// for a tenant at 0.3/s over its first 10 s). The arrivals after
		// it are an unbiased sample; a busy tenant loses one of many.
		offered -= offered / arrivals
		arrivals--
	}
	instant, arrivalRate := float64(offered)/seconds, float64(arrivals)/seconds
	// The window follows the rate measured so far, never this tick's: a
	// window chosen from the sample it averages would be short whenever a
	// request arrived and long when none did, and bias the average up.
	alpha := step.longestAlpha
	if !fresh {
		if rate := arrivalAverage / weight; rate > 0 {
			alpha = step.alpha(demandSamples / rate)
		}
	}
	// A moving average started at zero underestimates a new tenant's
	// demand for several time constants; dividing by the weight the
	// average has gathered so far (as Adam does) removes that bias, so a
	// surge of new demand is seen at the first tick.
	average += alpha * (instant - average)
	arrivalAverage += alpha * (arrivalRate - arrivalAverage)
	weight += alpha * (1 - weight)
	demand := average / weight
	if demand < 1e-9 && weight > 0.99 {
		// Idle for some windows: start the average afresh, so a tenant
		// that comes back is measured as a new one is, whether or not its
		// state was pruned meanwhile. (A fresh average stays at 0 until
		// the tenant's second arrival.)
		demand, average, weight, arrivalAverage = 0, 0, 0, 0
	}
	ts.demandAverage, ts.demandWeight, ts.arrivalAverage = float32(average), float32(weight), float32(arrivalAverage)
	return demand
}

// demandStep is what every tenant's measureDemand of one tick shares: the
// seconds since the last, and the weight 1 - e^(-seconds/window) of this
// tick in an average over window for the two windows most tenants have,
// the shortest (demandWindow: a busy tenant's) and the longest (a slow
// one's, and a new one's): one exponential a tick rather than one a
// tenant (a third of a tick over a million tenants).
type demandStep struct {
	seconds                     float64
	shortest, longest           float64 // windows, s
	shortestAlpha, longestAlpha float64
}

func (e *Engine) demandStep(seconds float64, maxWindow time.Duration) demandStep {
	s := demandStep{seconds: seconds, shortest: e.settings.demandWindow.Seconds(), longest: maxWindow.Seconds()}
	s.shortestAlpha, s.longestAlpha = 1-math.Exp(-seconds/s.shortest), 1-math.Exp(-seconds/s.longest)
	return s
}

// alpha is the weight of this tick in an average over window, clamped to
// [shortest, longest].
func (s *demandStep) alpha(window float64) float64 {
	switch window = min(max(s.shortest, window), s.longest); window {
	case s.longest:
		return s.longestAlpha
	case s.shortest:
		return s.shortestAlpha
	}
	return 1 - math.Exp(-s.seconds/window)
}

const (
	// demandSamples is how many arrivals a tenant's demand is averaged
	// over (measureDemand): relative noise about 1/√512 ≈ 4.4%. Noise
	// matters most for the tenants near their tier's level, whose claims
	// min(estimate, level) it biases low (TestZipfOverloadAdmitsFairShares
	// admitted 0.6% over the global rate at 64, 0.3% at 256).
	demandSamples = 256
	// maxDemandWindow bounds the averaging window of the slowest tenants.
	maxDemandWindow = 16 * time.Second
)

// refillBias is the fraction of the global rate to leave unallocated so
// that a global bucket run below half full (fill, 0 to 1) refills: shares
// that add up to exactly the global rate would leave it wherever
// contention found it, empty after a surge, and then every bit of noise
// denies someone at random. Up to maxRefillBias is held back, in
// proportion to how far below half the bucket is.
func refillBias(fill float64) float64 { return maxRefillBias * max(0, 0.5-fill) / 0.5 }

// globalFill is how full the engine's own global bucket is at now, 0 to 1
// (1 without a global limit).
func (e *Engine) globalFill(now int64) float64 {
	pl := &e.plane
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if !pl.global.active() {
		return 1
	}
	pl.global.settle(now)
	return float64(pl.global.level) / float64(pl.global.capacity())
}

const maxRefillBias = 0.1

// allocate computes every tier's water level and publishes them, at now
// (µs), sharing capacity (tokens/s, in reallocate's frame). The claimants
// are f.demands, f.weights, f.ranks and f.caps, index by index: the
// tenants of tick, or the fleet's in mode central (central_fair.go). With
// fleet, the fleet's levels a local-reconciled node found from the
// nodes' claim curves (claim.go), it publishes those instead: a node's
// own allocation cannot give each tier of its tenants its fleet-wide
// level (with tenants pinned to 100 nodes, a node holding a whale raised
// to its tier's floor and free tenants paced them at one level between
// the two, and the tiers left their shares by 10%; docs/scale.md).
func (f *fairness) allocate(snap *snapshot, capacity float64, now int64, fleet *[policy.MaxTiers]float64) {
	tiers := len(snap.floors)
	var levels [policy.MaxTiers]float64
	contended := false
	if fleet != nil {
		levels = *fleet
		for k := range tiers {
			contended = contended || !math.IsInf(levels[k], 1)
		}
	} else {
		for k := range tiers {
			f.byTier[k] = f.byTier[k][:0]
		}
		for i := range f.demands {
			if demand := f.demands[i]; demand > 0 {
				// Demand counts only requests that passed the tenant's own
				// levels, but one denied at global leaves its tokens, so the
				// next is counted too: the tenant's own limit caps the claim.
				f.byTier[f.ranks[i]] = append(f.byTier[f.ranks[i]], scheduler.Item{Weight: f.weights[i], Cap: min(demand, f.caps[i])})
			}
		}
		levelsOf := f.levelsByTier
		if snap.shareByTenant {
			levelsOf = f.levelsByTenant
		}
		contended = levelsOf(snap, capacity, &levels)
	}
	if !contended {
		f.contended.Store(false)
		return
	}
	for k := range tiers {
		f.levelBits[k].Store(math.Float64bits(levels[k]))
	}
	f.levelsSeq.Store(snap.seq)
	f.epoch.Add(1)
	if !f.contended.Load() {
		f.contendedSince.Store(now)
	}
	f.contended.Store(true)
}

// floor is tier rank k's floor in capacity's frame: floors shrink with what
// is held back of the global rate.
func (s *snapshot) floor(k int, capacity float64) float64 {
	return s.floors[k] * capacity / s.globalPerSec
}

// levelsByTier (shareBy tier) shares capacity among the tiers by weighted
// max-min with their weights and floors, each tier capped by its tenants'
// claims, then each tier's share among its tenants by theirs: one water
// level per tier. It reports false when every claim fits (no contention).
func (f *fairness) levelsByTier(snap *snapshot, capacity float64, levels *[policy.MaxTiers]float64) bool {
	tiers := len(snap.floors)
	f.tiers = f.tiers[:0]
	for k := range tiers {
		f.tiers = append(f.tiers, scheduler.Item{Weight: float64(snap.tierWeights[k]), Floor: snap.floor(k, capacity), Cap: claims(f.byTier[k])})
	}
	f.out = grow(f.out, tiers+len(f.demands))
	if math.IsInf(scheduler.MaxMin(capacity, f.tiers, f.out, &f.scratch), 1) {
		return false
	}
	tierShare := f.out[:tiers:tiers]
	for k := range tiers {
		levels[k] = math.Inf(1)
		if len(f.byTier[k]) > 0 && tierShare[k] < f.tiers[k].Cap {
			levels[k] = scheduler.MaxMin(tierShare[k], f.byTier[k], f.out[tiers:], &f.scratch)
		}
	}
	return true
}

// levelsByTenant (shareBy tenant, seed 002's definition) shares capacity
// among all the tenants by weighted max-min, one water level λ for every
// tier, then raises each tier whose tenants' allocation falls short of its
// floor to the floor. At level λ tier k gets
//
//	x_k(λ) = max(F_k, S_k(λ))   S_k(λ) = Σ_{i in k} min(λ·w_i, c_i)
//
// with F_k its floor at most its claims (all floors scaled alike when they
// add up to more than the capacity, as scheduler.MaxMin does), and λ is
// the level at which the x_k add up to the capacity. It is found by fixing
// tiers at their floors: the level over the tiers not yet fixed only falls
// as tiers are fixed, so a tier found below its floor stays below it; at
// most one pass per tier. A fixed tier's own level is its floor shared
// among its tenants. It reports false when every claim fits.
func (f *fairness) levelsByTenant(snap *snapshot, capacity float64, levels *[policy.MaxTiers]float64) bool {
	tiers := len(snap.floors)
	var floors [policy.MaxTiers]float64
	var fixed [policy.MaxTiers]bool
	var total, floorSum float64
	for k := range tiers {
		c := claims(f.byTier[k])
		floors[k] = min(snap.floor(k, capacity), c)
		total += c
		floorSum += floors[k]
	}
	if total <= capacity {
		return false
	}
	if floorSum > capacity {
		for k := range tiers {
			floors[k] *= capacity / floorSum
		}
	}
	rest := capacity
	for {
		f.all = f.all[:0]
		for k := range tiers {
			if !fixed[k] {
				f.all = append(f.all, f.byTier[k]...)
			}
		}
		f.out = grow(f.out, len(f.all))
		level := scheduler.MaxMin(max(rest, 0), f.all, f.out, &f.scratch)
		more := false
		for k := range tiers {
			if !fixed[k] && floors[k] > 0 && allocationAt(f.byTier[k], level) < floors[k] {
				fixed[k], more = true, true
				rest -= floors[k]
			}
		}
		if !more {
			for k := range tiers {
				levels[k] = level
			}
			break
		}
	}
	for k := range tiers {
		if fixed[k] {
			f.out = grow(f.out, len(f.byTier[k]))
			levels[k] = scheduler.MaxMin(floors[k], f.byTier[k], f.out, &f.scratch)
		}
	}
	return true
}

// claims is the sum of items' caps.
func claims(items []scheduler.Item) float64 {
	var sum float64
	for _, it := range items {
		sum += it.Cap
	}
	return sum
}

// allocationAt is Σ min(level·weight, cap) over items: what they get at
// water level level without floors.
func allocationAt(items []scheduler.Item, level float64) float64 {
	var sum float64
	for _, it := range items {
		sum += min(level*it.Weight, it.Cap)
	}
	return sum
}

// prune forgets idle state, one registry shard per tick: unknown tenants
// whose state is as a fresh one's, and idle full api keys of every tenant.
func (e *Engine) prune(now int64) {
	if !e.swapMu.TryLock() {
		return // a policy swap is running; prune next time
	}
	defer e.swapMu.Unlock()
	snap := e.snap.Load() // under swapMu: no swap can name a tenant we forget
	cutoff := now - e.settings.idleTTL.Microseconds()
	sh := &e.tenants.shards[e.fair.ticks%registryShards]
	sh.mu.RLock()
	candidates := sh.tenants.appendTo(e.swapScratch[:0])
	sh.mu.RUnlock()
	e.swapScratch = candidates
	defer clear(candidates)
	for _, ts := range candidates {
		ts.mu.Lock()
		ts.pruneKeysLocked(cutoff, now, &e.keys)
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
