package enforcer

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

// reconciler is the local-reconciled backend's loop. Decisions are local:
// the engine's own state enforces this node's share of every limit
// (policy.Share). Every reconcileInterval the node
//
//   - pushes the global tokens it admitted since its last push (numbered,
//     so that a retry after a lost reply is not counted twice), its rate of
//     admission, its claim on the plane, the demand of its busiest
//     tenants and its claim curves (claim.go: what its tenants of each
//     tier claim at every water level), and keeps itself live in the
//     plane's node set;
//   - pulls the fleet's global level as of now (the bucket in Redis,
//     refilled at the global rate and debited by every node's pushes, less
//     what the other nodes admitted since their last pushes, estimated
//     from their rates), the live nodes' total claim, each of its busiest
//     tenants' fleet-wide demand, and the live nodes' claim curves summed,
//     from which it finds the fleet's water levels, which its fairness
//     tick paces its tenants by where they are pinned (fleetView);
//   - sizes its share by its claim: (1-shareFloor) × its part of the
//     fleet's claims + shareFloor / nodes, at most doubling per reconcile.
//     A node's claim is its demand less what its tenants ask beyond their
//     fleet-wide fair shares (at those levels), so a node that serves a
//     whale, or many tenants above their shares, does not take
//     capacity from one whose tenants are within their shares
//     (TestReconciledFairnessAcrossNodes). Shares add up to one when the
//     figures are current, so what idle nodes leave goes to busy ones;
//   - pays its part of any debt: its local global bucket comes down to its
//     share of the fleet's level when that is lower. A fleet level below
//     zero means the fleet admitted more than the limit: shares computed
//     from demand figures of different ages can add up to more than one
//     for a while, and nodes that join are counted only at the others'
//     next reconcile.
//
// So the overage is what the shares over-allocate in an interval, paid back
// the next (TestReconciledOverage measures it: within a few percent at
// 50ms and 200ms; at 1s the pay-back overshoots and leaves capacity
// unused). A node that dies stops counting when its liveness expires,
// three intervals after its last reconcile, and its share goes to the
// others at their next reconcile.
//
// The fairness tick shares in a frame as wide as the fleet's tenants are
// spread (fleetView): the node's capacity, floors, caps and each tenant's
// demand here scaled up by how many times a busy tenant's fleet-wide
// demand its demand here is (the median over the busiest it pushed, at
// most the factor to the whole plane), and each tenant paced here at the
// part of its fair share that its demand here is of its demand in that
// frame. With round robin that is the whole plane, each tenant at its
// fleet-wide demand; with tenants pinned to nodes it is the node's own
// share of the plane, shared among the node's own tenants, whose
// reconciled claims size the shares (TestScaleSim's pinned fleet).
//
// Lower levels (tenant, endpoint, key) are reconciled per bucket, each
// node's part of a tenant's limits following where the tenant's demand is
// (reconcile_levels.go), so that any routing, round robin, pinned by tenant
// or key, or skewed, gets each limit within a few percent
// (TestReconciledLevelsFollowRouting).
//
// When Redis is unreachable the node keeps its share (bounded local
// enforcement) and pushes what it admitted when Redis is back. That push
// lets the fleet's buckets refill for the whole span it covers, not only
// up to their burst, also those that expired meanwhile: the nodes
// admitted at their parts all along, and a fleet within its limits during
// the outage owes nothing after it
// (TestReconciledOutageDoesNotStarveTenantsUnderTheirLimit).
type reconciler struct {
	e *Engine

	share atomic.Uint64 // float64 bits: the fraction of the plane this node enforces

	mu sync.Mutex // serialises reconciles; guards what follows
	// seq numbers pushes. It starts at the process's start time in µs, so
	// that a node id reused by a new process (a StatefulSet's pod) pushes
	// above what its predecessor did.
	seq     int64
	pending int64 // tokens of the last push, until Redis confirms it
	pushed  int64 // the plane's admitted count up to the last push
	// collected is the µs at which the pending push took what was
	// admitted, from the µs at which the push before it did (0 before
	// the first): the span of admissions the push carries, which after
	// failed reconciles is the whole outage (reconcile.lua's ARGV[10]),
	// for it and for the push it follows.
	collected, from int64
	admitted        int64   // the plane's admitted count at the last reconcile (for the rate)
	offered         int64   // the plane's offered count at the last reconcile
	lastRun         int64   // µs of the last reconcile; 0 before the first since begin
	demand          float64 // tokens per second, smoothed over reconciles
	// fair is what this node's tenants claim at the fleet's water levels,
	// as of the last reconcile (claim.go), when fairOK: the node's claim
	// on the plane, so that a node whose demand is a whale's beyond its
	// share, or many small tenants' beyond theirs, does not take capacity
	// from one whose tenants are within theirs. Without it (a plane
	// without fairness, or before the fleet's curves) the node claims its
	// demand.
	fair    float64
	fairOK  bool
	claims  claimBins         // this node's tenants, binned for its claim curves
	maxmin  scheduler.Scratch // for the fleet's levels
	scratch []*tenantState
	// unconfirmed says the last push got no reply: it goes again as it
	// was (pending and pendingBuckets), and what was admitted since waits
	// for the next.
	unconfirmed    bool
	pendingBuckets []levelBucket
	buckets        []levelBucket      // reused by collectBuckets
	ratios         []float64          // reused for fleetDemand.spread
	demands        map[string]float64 // this node's demand per bucket it pushes, tokens/s

	fleet atomic.Pointer[fleetDemand]
	stats reconcileStats
	// failures counts the reconciles in a row that Redis did not answer;
	// degraded is set at the breaker's threshold of them and cleared by
	// the next that succeeds: meanwhile the plane's failureMode decides
	// (failOver).
	failures int
	degraded atomic.Bool
}

// fleetDemand is what the last reconcile brought back of the fleet's
// demand per tenant (tokens/s, for this node's busiest tenants), and when.
//
// spread is a tenant's fleet-wide demand over its demand here, the
// median over those busiest tenants (0: none to tell): about the number
// of nodes when a balancer spreads each tenant over the fleet, about 1
// when it pins each tenant to a node. The fairness tick counts a tenant
// the fleet did not report at its demand here times spread. (It counted
// it times the node's factor to the whole plane, as if spread: with
// tenants pinned to 10 nodes each small tenant was counted 10 times over,
// and the tiers left their fair shares by 15–40%: TestScaleSim's pinned
// fleet.)
type fleetDemand struct {
	byTenant map[string]float64
	spread   float64
	// levels are the fleet's water levels per tier rank of policy (nil
	// without them): the tick paces by them.
	levels *[policy.MaxTiers]float64
	policy *policy.Policy
	at     int64 // µs
}

// maxFleetTenants bounds the tenants whose demand a node pushes and pulls
// per reconcile: its busiest, where fairness has something to share.
const maxFleetTenants = 128

type reconcileStats struct {
	runs, failures, reshares atomic.Int64
	fallbacks                atomic.Int64 // decisions failOver made
	fleetLevel               atomic.Int64 // token·µs, from the last pull
}

// shareFloor is the part of the plane split evenly among live nodes
// whatever their demand, so that a node whose demand just arrived is not
// at zero until the next reconcile. It is taken from the nodes that claim
// more than an even share and given to those that claim less: at 0.1 a
// pinned fleet of 100 nodes admitted 7.0% off its nodes' fair claims at
// the median and its enterprise tier 14% below its share, at 0.02 2.2%
// and 8% (TestScaleSimLarge, docs/scale.md; before the tick paced by the
// fleet's levels, which took both to 1.9% and 1.4%).
const shareFloor = 0.02

// A new share is installed (which moves every tenant's state to a new local
// policy: O(tenants)) when it is shrinkThreshold below the share in force or
// growThreshold above it; smaller changes wait. Shrinking promptly keeps
// the shares' sum from staying above one (overage); growing lazily leaves
// a little capacity unused at worst.
const (
	shrinkThreshold = 0.01
	growThreshold   = 0.05
)

func newReconciler(e *Engine) *reconciler {
	r := &reconciler{e: e, seq: time.Now().UnixMicro(), demands: map[string]float64{}}
	r.evenShare()
	return r
}

// reset starts local-reconciled mode (New, or a policy that switches to
// it): what the node admitted before is not this mode's to push, and the
// first reconcile after it sizes the node's share before it decides on its
// own.
//
// reset comes first, before the policy in the new mode is visible to the
// loop, then reconcile.
func (r *reconciler) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	pl := &r.e.plane
	pl.mu.Lock()
	r.pushed, r.admitted, r.offered = pl.admitted, pl.admitted, pl.offered
	pl.mu.Unlock()
	r.pending, r.lastRun, r.demand, r.fair, r.fairOK = 0, 0, 0, 0, false
	r.evenShare()
	r.unconfirmed, r.pendingBuckets = false, nil
	clear(r.demands)
	// What the limiters counted in another mode is not this mode's to push.
	r.scratch = r.e.tenants.appendAll(r.scratch[:0])
	for _, ts := range r.scratch {
		ts.mu.Lock()
		ts.forEachLimiterLocked((*limiter).clearCounters)
		ts.mu.Unlock()
	}
	clear(r.scratch)
}

func (r *reconciler) fraction() float64 { return math.Float64frombits(r.share.Load()) }

// evenShare makes the node's share an even one of the fleet, as the plane
// asks for it (minReplicas) or the heartbeats last counted it, until a
// reconcile sizes it: a node that cannot reach Redis from the start must
// not enforce the whole plane.
func (r *reconciler) evenShare() {
	r.share.Store(math.Float64bits(1 / float64(max(r.e.central.fleet.nodes.Load(), 1))))
}

// loop runs reconciles at the policy's interval (New runs the first)
// while the plane is in local-reconciled mode (modeLoops), until stop
// closes: then it pushes what is pending, if the plane is still in this
// mode, and leaves the fleet.
func (r *reconciler) loop(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			p := r.e.policy.Load()
			if p.Mode() == policy.ModeLocalReconciled {
				r.reconcile() // flush: the fleet sees what this node admitted
			}
			r.leave(p)
			return
		case <-time.After(r.e.policy.Load().Spec().ReconcileInterval):
		}
		if r.e.policy.Load().Mode() == policy.ModeLocalReconciled {
			r.reconcile()
		}
	}
}

// reconcile runs one push-and-pull.
func (r *reconciler) reconcile() {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.e
	p := e.policy.Load()
	spec := p.Spec()
	now := e.clock()
	pl := &e.plane
	pl.mu.Lock()
	admitted, offered := pl.admitted, pl.offered
	pl.mu.Unlock()
	var admitRate int64
	prev := r.lastRun
	demand := int64(-1) // not measured yet
	if r.lastRun > 0 && now > r.lastRun {
		admitRate = (admitted - r.admitted) * 1_000_000 / (now - r.lastRun)
		instant := float64(offered-r.offered) * 1e6 / float64(now-r.lastRun)
		r.demand += (instant - r.demand) / 2
		demand = int64(r.demand)
		if r.fairOK {
			demand = int64(r.fair)
		}
	}
	r.admitted, r.offered, r.lastRun = admitted, offered, now
	snap := e.snap.Load()
	if !r.unconfirmed {
		// A new push; an unconfirmed one goes again as it was, and what
		// was admitted since waits for the next.
		r.seq++
		r.pending, r.pushed = admitted-r.pushed, admitted
		seconds := spec.ReconcileInterval.Seconds()
		if prev > 0 && now > prev {
			seconds = float64(now-prev) / 1e6
		}
		r.pendingBuckets = r.collectBuckets(snap, seconds)
		r.from, r.collected = r.collected, now
	}

	interval := spec.ReconcileInterval
	ttl := 3 * interval // a node is dead after three missed reconciles
	prefix := keyspace.PlanePrefix(p.ID())
	g := spec.Global
	span := interval.Microseconds()
	if r.from > 0 {
		span = max(span, now-r.from)
	}
	args := []any{e.nodeID, r.seq, r.pending, admitRate, demand, ttl.Milliseconds(), g.Rate, g.Burst, g.PeriodMicros(), span}
	push := bucketLevels(r.pendingBuckets)
	keys := append([]string{prefix.Global(), prefix.Nodes(), prefix.Reconcile(), prefix.TenantDemands(e.nodeID)}, push.Keys()...)
	scriptNow := int64(0) // Redis TIME: one clock for the fleet
	if e.settings.steppedReconcile {
		scriptNow = now // the caller's virtual time (sim.go)
	}
	busiest := r.busiest(snap, perSecond(g))
	var own claimCurves // this node's, pushed and then claimed at the fleet's levels
	if snap.fairness != fairNone {
		own = r.claims.curves()
	}
	args = append(args, push.Records(), scriptNow, own.bytes())
	for _, b := range busiest {
		args = append(args, b.ts.name, int64(b.demand), b.weight)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.settings.redisTimeout)
	start := time.Now()
	reply, err := lua.Reconcile.Run(ctx, e.redis, keys, args...).Slice()
	cancel()
	e.observeRedis(time.Since(start))
	r.stats.runs.Add(1)
	if err == nil && len(reply) != 6 {
		err = fmt.Errorf("reconcile.lua answered %d values, want 6", len(reply))
	}
	if err != nil {
		r.stats.failures.Add(1)
		r.unconfirmed = true
		if r.failures++; r.failures == e.settings.breakerThreshold {
			r.degraded.Store(true)
			e.degradedChanged(policy.ModeLocalReconciled, true, err)
			e.reshare() // small limits are the node's while Redis is away
		}
		return // keep the local state; the push goes again next time
	}
	if r.failures = 0; r.degraded.Swap(false) {
		e.degradedChanged(policy.ModeLocalReconciled, false, nil)
		e.reshare() // small limits are Redis's again
	}
	r.unconfirmed = false
	r.pending = 0
	pushed := r.pendingBuckets
	r.pendingBuckets = nil
	level, _ := reply[0].(int64)
	fleetTotal, _ := reply[1].(int64)
	nodes, _ := reply[2].(int64)
	nodes = max(nodes, 1)
	totals, _ := reply[3].([]any)
	var fleetCurves claimCurves
	var waterLevels *[policy.MaxTiers]float64
	had := r.fairOK
	if fleetCurves, r.fairOK = parseClaimCurves(reply[4], r.claims.tiers); r.fairOK {
		waterLevels = new([policy.MaxTiers]float64)
		// What the tick's own allocation would share: the rate less the
		// headroom fair shares leave (reallocate).
		*waterLevels = fleetCurves.levels(snap, &r.claims.grid, perSecond(g)*(1-e.settings.headroom), &r.maxmin)
		claim := own.claim(&r.claims.grid, waterLevels)
		if !had {
			r.fair = claim
		}
		// Smoothed as the demand is: the levels move with every node's
		// push, and a claim that jitters installs new shares (O(tenants)
		// each) for nothing (10 nodes round robin: 278 in 790 reconciles
		// unsmoothed, 170 smoothed; TestScaleSim).
		r.fair += (claim - r.fair) / 2
	}
	byTenant := make(map[string]float64, len(busiest))
	r.ratios = r.ratios[:0]
	for i, b := range busiest {
		if i < len(totals) {
			if d, ok := totals[i].(int64); ok && d > 0 {
				byTenant[b.ts.name] = float64(d)
				r.ratios = append(r.ratios, max(float64(d)/b.demand, 1))
			}
		}
	}
	var spread float64
	if len(r.ratios) > 0 {
		slices.Sort(r.ratios)
		spread = r.ratios[len(r.ratios)/2]
	}
	r.fleet.Store(&fleetDemand{byTenant: byTenant, spread: spread, levels: waterLevels, policy: p, at: now})
	r.stats.fleetLevel.Store(level)
	levels, _ := reply[5].([]any)
	if e.central.fleet.count(nodes, now, (2 * interval).Microseconds()) {
		e.reshare() // the even part of every limiter is 1/nodes
		snap = e.snap.Load()
	}
	nodes = e.central.fleet.nodes.Load()
	r.applyBuckets(snap, pushed, levels, nodes, now)
	even := 1 / float64(nodes)
	share := even
	if fleetTotal > 0 && demand >= 0 {
		share = (1-shareFloor)*float64(demand)/float64(fleetTotal) + shareFloor*even
	}
	old := r.fraction()
	growFrom := old
	if demand < 0 {
		growFrom = share // the first reconcile: nothing to grow from
	}
	share = min(share, max(2*growFrom, even), 1)
	if share < old*(1-shrinkThreshold) || share > old*(1+growThreshold) {
		r.share.Store(math.Float64bits(share))
		r.stats.reshares.Add(1)
		e.reshare()
	}
	e.payDebt(int64(float64(level)*r.fraction()), now)
}

// failOver decides a request of cost while the node cannot reconcile
// (degraded), by the plane's failureMode: allow admits it, deny denies it
// at the global level; it reports false, deciding nothing, while the node
// is not degraded or the failureMode is degrade, which decides on the
// node's parts of the limits as they were at the last reconcile.
func (r *reconciler) failOver(snap *snapshot, cost int64, d *Decision) bool {
	if !r.degraded.Load() {
		return false
	}
	switch snap.failureMode {
	case policy.FailureAllow:
		*d = Decision{Allow: true, Cost: cost, Bound: LevelGlobal, policy: snap.plane}
	case policy.FailureDeny:
		*d = unavailableDenial(snap, cost)
	default:
		return false
	}
	r.stats.fallbacks.Add(1)
	return true
}

// busyTenant is one of a node's busiest tenants, read once per reconcile:
// what it pushes and what its claim is computed from are the same figures.
type busyTenant struct {
	ts     *tenantState
	demand float64 // tokens/s here
	weight int64
}

// busiest are this node's tenants with the most demand, at most
// maxFleetTenants, when the plane shares by fairness; it bins every tenant
// with demand into r.claims on the way (a plane of rate tokens/s).
func (r *reconciler) busiest(snap *snapshot, rate float64) []busyTenant {
	r.claims.reset(rate, len(snap.floors))
	if snap.fairness == fairNone {
		return nil
	}
	r.scratch = r.e.tenants.appendAll(r.scratch[:0])
	var busy []busyTenant
	for _, ts := range r.scratch {
		if demand := math.Float64frombits(ts.demandBits.Load()); demand > 0 {
			// As the tick counts it: weight 1 in the lowest tier until the
			// tenant's state is moved to this policy.
			weight, rank := int64(1), len(snap.floors)-1
			ts.mu.Lock()
			if ts.rec != nil {
				weight = max(ts.rec.tenant.Weight, 1)
				if ts.snap == snap {
					rank = ts.rec.tierRank
				}
			}
			ts.mu.Unlock()
			r.claims.add(rank, demand, float64(weight)*ts.part())
			if demand >= 1 {
				busy = append(busy, busyTenant{ts: ts, demand: demand, weight: weight})
			}
		}
	}
	clear(r.scratch)
	// The tenants too sparse here to be measured, claimed in full as the
	// tick claims them (each node its own arrivals of them).
	f := &r.e.fair
	f.mu.Lock()
	for k, demand := range f.unmeasured.demands(len(snap.floors)) {
		r.claims.add(k, demand, demand/unattributedRatio)
	}
	f.mu.Unlock()
	slices.SortFunc(busy, func(a, b busyTenant) int { return cmp.Compare(b.demand, a.demand) })
	return busy[:min(len(busy), maxFleetTenants)]
}

// fleetView is how the fairness tick sees the fleet: the factor from this
// node's part of the plane to the whole (1 unless the plane is in mode
// local-reconciled), and the fleet's demand per tenant and water levels
// per tier (claim.go), when a reconcile brought them back within three
// intervals (the levels: for the policy in force, and tenants spread over
// fewer than half the fleet's width).
func (e *Engine) fleetView() (scale, spread float64, byTenant map[string]float64, levels *[policy.MaxTiers]float64) {
	p := e.policy.Load()
	if e.reconciler == nil || p.Mode() != policy.ModeLocalReconciled {
		return 1, 1, nil, nil
	}
	scale = 1 / e.reconciler.fraction()
	spread = scale // until the fleet tells: as if spread like the node's demand
	if f := e.reconciler.fleet.Load(); f != nil && e.clock()-f.at <= 3*p.Spec().ReconcileInterval.Microseconds() {
		byTenant = f.byTenant
		if f.spread > 0 {
			spread = min(f.spread, scale)
		}
		// The fleet's levels where the node's own tenants are not the
		// fleet's in miniature: tenants pinned, each on few nodes (spread
		// well below scale). Spread over every node (round robin), the
		// node's own allocation in that frame is the fleet's, and
		// fresher: paced by the fleet's levels, 100 nodes round robin
		// left enterprise 8.4% short and free 5.1% over, by their own
		// 2.7% and 0.1% short (100,000 tenants; docs/scale.md).
		if f.policy == p && spread < scale/2 {
			levels = f.levels
		}
	}
	return scale, spread, byTenant, levels
}

// leave takes the node out of the fleet at once (rather than after its
// liveness expires) and forgets its reconcile fields.
func (r *reconciler) leave(p *policy.Policy) {
	ctx, cancel := context.WithTimeout(context.Background(), r.e.settings.redisTimeout)
	defer cancel()
	id, prefix := r.e.nodeID, keyspace.PlanePrefix(p.ID())
	_, _ = r.e.redis.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.ZRem(ctx, prefix.Nodes(), id)
		pipe.HDel(ctx, prefix.Reconcile(), "s:"+id, "d:"+id, "r:"+id, "t:"+id, "c:"+id)
		pipe.Del(ctx, prefix.TenantDemands(id))
		return nil
	})
}

// payDebt lowers the local global bucket to level token·µs (of the global
// limit, whose period a share keeps; this node's part of the fleet's level)
// when it holds more, down to minus its capacity. It never raises it: tokens
// come only from the node's share of the refill, so an estimate of the
// fleet's level that runs high (it is up to an interval old) cannot set off
// a burst, and one that runs low costs at most an interval's refill.
func (e *Engine) payDebt(level, now int64) {
	pl := &e.plane
	pl.mu.Lock()
	defer pl.mu.Unlock()
	g := &pl.global
	g.settle(now)
	g.level = max(min(g.level, level), -g.capacity())
}
