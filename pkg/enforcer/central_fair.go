package enforcer

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// centralFair is fairness in mode central: weighted max-min shares of the
// global rate, and tier floors as rate guarantees, fleet-wide.
//
// Every fairness interval each node (fairLoop, off the decision path)
//
//   - measures its tenants' demand from what its decisions through Redis
//     were offered (central.record counts each request that passed the
//     levels below global, as the engine's own decisions do; the moving
//     average is measureDemand's, over up to N times its longest window,
//     since a node sees its part of a spread tenant's arrivals; and the
//     arrivals of tenants without an average at the node yet are claimed
//     in full, per tier: see unattributed);
//   - reports to Redis its global denials and its busiest tenants' demand,
//     at most maxFleetTenants by name with their weight, tier and the most
//     their own limits let through, and the rest of its tenants summed per
//     tier and per ratio of demand to weight, in steps of 2^(1/16)
//     (tailSteps), counted as spread over the nodes as the fleet's
//     requests are (what local-reconciled assumes of the tenants a node
//     does not push);
//   - reads back every live node's report and the global bucket, in one
//     atomic call (heartbeat.lua), adds the reports up in the order of the
//     nodes' ids, each tenant by name and each tail step as one claimant
//     (the tenants of a step have the same ratio of demand to weight to
//     within 4.4%, and claimants with equal ratios are one claimant to
//     max-min: min(Σd, λΣw) = Σ min(d, λw)), sorted by tier and name; and
//   - runs the engine's own allocation on them with the plane's whole
//     global rate (fairness.reallocate and allocate: tiers by weighted
//     max-min with their floors, then tenants within each tier), and
//     publishes the tiers' water levels.
//
// The allocation is a pure function of the reports, the global bucket's
// fill and the policy, so nodes that read the same reports compute the same
// shares; nodes read them up to an interval apart. While the plane is
// contended, each request of a tier with a finite level carries its
// tenant's share (the level times its weight, divided among the shards of a
// split tenant) to decide.lua, which paces the tenant fleet-wide with a
// share bucket in Redis (a key per tenant, half a second of its share and
// at least 8 of the plane's cheapest requests), and a tenant whose fleet
// demand is above its share leaves the bottom contendedReservePercent of
// the global bucket to those within theirs. When the plane is not
// contended, a decision pays one atomic load for all this.
type centralFair struct {
	// view is the allocation in force, read by every decision (prepare);
	// nil while the plane is not contended.
	view atomic.Pointer[centralShares]
	// denials counts this node's decisions denied at the global level since
	// its last report.
	denials atomic.Int64

	// Owned by fairLoop's goroutine.
	alloc      fairness // the allocation and its scratch (the engine's own is the local modes')
	last       int64    // µs of the last measure; 0: none since fairness came on
	failures   int      // exchanges failed in a row
	tenants    []*tenantState
	busy       []fleetClaim
	unmeasured tierTail // tenants whose own average has not started here
	report     []byte
	parsed     []fleetClaim // one report's claimants
	fleet      []fleetClaim // the fleet's claimants by name, then its tails
	byName     map[string]int
	tails      map[tailKey]int
}

// centralShares is one allocation, immutable once published.
type centralShares struct {
	snap *snapshot // the full policy's snapshot it was computed for
	// levels are per tier rank: the share per unit of tenant weight,
	// tokens/s; +Inf for a tier whose whole demand fits (no pacing).
	levels [policy.MaxTiers]float64
	// above are the tenants reported by name whose fleet-wide demand is
	// above their share.
	above map[string]struct{}
}

// fleetClaim is one claimant of the fleet's allocation: a tenant (name
// set), or a tail step of one node's tenants (name empty) as it reports it.
type fleetClaim struct {
	name   string
	demand float64 // tokens/s
	weight float64
	cap    float64 // tokens/s its own limits let through; +Inf: none
	rank   int
	step   int64 // tail steps: floor(tailSteps × log2(ratio of demand to weight))
}

type tailKey struct {
	rank int
	step int64
}

const (
	// tailSteps are the steps per doubling of demand per unit of weight in
	// which a node sums the tenants it does not report by name.
	tailSteps = 16
	// reportVersion starts every report; a report of another version is
	// left out (a rolling upgrade: shares from the others for a while).
	reportVersion = 1
	// maxExchangeFailures: after this many failed exchanges in a row the
	// shares in force lapse; decisions go unpaced until an exchange works.
	maxExchangeFailures = 3
	// shareFixedPeriod is the period of a share bucket's limit, µs: a share
	// in tokens per second is sent to decide.lua as an integer rate per
	// 1,000 s, to the thousandth of a token per second.
	shareFixedPeriod = int64(1_000_000_000)
)

// fairLoop runs the fleet exchange every fairness interval while the plane
// is in central mode with a fairness other than none; otherwise no shares
// are in force.
func (b *central) fairLoop(stop <-chan struct{}) {
	timer := time.NewTimer(b.e.settings.tickInterval)
	defer timer.Stop()
	for {
		select {
		case <-stop:
			return
		case <-timer.C:
		}
		if snap := b.snap.Load(); snap != nil && snap.fairness != fairNone {
			b.exchange(snap)
		} else {
			b.fair.view.Store(nil)
			b.fair.last = 0
		}
		timer.Reset(b.e.settings.tickInterval)
	}
}

// exchange measures this node's demand, reports it and reads the fleet's,
// and publishes the fleet's allocation.
func (b *central) exchange(snap *snapshot) {
	e, cf := b.e, &b.fair
	now := e.clock()
	report, measured := b.measure(snap, now)
	if !measured {
		return
	}
	s := e.settings
	prefix := snap.redisPrefix
	ctx, cancel := context.WithTimeout(context.Background(), s.redisTimeout)
	start := time.Now()
	reply, err := lua.Heartbeat.Run(ctx, b.client, []string{prefix.Nodes(), prefix.FairReport(e.nodeID), prefix.Global()},
		e.nodeID, (3 * s.heartbeatInterval).Milliseconds(), report, (3 * s.heartbeatInterval).Milliseconds()).Slice()
	cancel()
	e.observeRedis(time.Since(start))
	if err == nil && len(reply) < 3 {
		err = errors.New("heartbeat.lua answered too few values")
	}
	if err != nil {
		if cf.failures++; cf.failures >= maxExchangeFailures {
			cf.view.Store(nil)
		}
		return
	}
	cf.failures = 0
	redisNow, _ := reply[1].(int64)
	bucket, _ := reply[2].(string)
	fill := bucketFill(bucket, snap.global, redisNow)
	var denials int64
	cf.startFleet()
	for i := 3; i+1 < len(reply); i += 2 {
		if r, ok := reply[i+1].(string); ok {
			denials += cf.add(r, len(snap.floors))
		}
	}
	b.allocate(snap, denials, fill, now)
}

// allocate runs the engine's allocation on the fleet's claimants (cf.fleet)
// and publishes it.
func (b *central) allocate(snap *snapshot, denials int64, fill float64, now int64) {
	cf := &b.fair
	// Deterministic order: tenants by tier and name, then tails by tier and
	// step. Tenants come first so that a name cannot sort among tails.
	slices.SortFunc(cf.fleet, func(x, y fleetClaim) int {
		return cmp.Or(cmp.Compare(tailOrder(x), tailOrder(y)), cmp.Compare(x.rank, y.rank), cmp.Compare(x.name, y.name),
			cmp.Compare(x.step, y.step))
	})
	f := &cf.alloc
	n := len(cf.fleet)
	f.demands, f.weights, f.ranks, f.caps = grow(f.demands, n), grow(f.weights, n), grow(f.ranks, n), grow(f.caps, n)
	var total float64
	for i, c := range cf.fleet {
		f.demands[i], f.weights[i], f.ranks[i], f.caps[i] = c.demand, c.weight, c.rank, c.cap
		total += c.demand
	}
	f.reallocate(snap, 1, total, denials, fill, b.e.settings.headroom, now, nil)
	if !f.contended.Load() {
		cf.view.Store(nil)
		return
	}
	v := &centralShares{snap: snap, above: map[string]struct{}{}}
	for k := range snap.floors {
		v.levels[k] = math.Float64frombits(f.levelBits[k].Load())
	}
	for _, c := range cf.fleet {
		if c.name != "" && min(c.demand, c.cap) > v.levels[c.rank]*c.weight {
			v.above[c.name] = struct{}{}
		}
	}
	cf.view.Store(v)
}

// measure folds the demand this node's decisions were offered since the
// last measure into its tenants' averages and returns its report; measured
// is false for the first measure, which only starts the clock.
func (b *central) measure(snap *snapshot, now int64) (report []byte, measured bool) {
	e, cf := b.e, &b.fair
	// The averages are the fairness tick's (measureDemand), and ticks run
	// one at a time: a switch from mode local must not race one.
	e.fair.mu.Lock()
	defer e.fair.mu.Unlock()
	first := cf.last == 0 || now <= cf.last
	seconds := float64(now-cf.last) / 1e6
	if cf.last == 0 {
		cf.unmeasured = tierTail{}
	}
	cf.last = now
	// A node sees its part of a spread tenant's arrivals: its average may
	// run as many times longer as there are nodes, to rest on as many
	// arrivals as one engine's. Split into pieces with a node's noise, a
	// tail tenant's claims would otherwise add up short (min(d, λw) is
	// concave), and its tier's level run high.
	nodes := max(b.fleet.nodes.Load(), 1)
	step := e.demandStep(seconds, time.Duration(nodes)*maxDemandWindow)
	cf.tenants = e.tenants.appendAll(cf.tenants[:0])
	defer clear(cf.tenants)
	busy := cf.busy[:0]
	for _, ts := range cf.tenants {
		ts.mu.Lock()
		offered, arrivals := ts.offered, ts.arrivals
		ts.offered, ts.arrivals = 0, 0
		tier := ts.requestedTier()
		ts.mu.Unlock()
		if first || ts.name == overflowName {
			continue
		}
		demand := e.measureDemand(ts, offered, arrivals, &step)
		ts.demandBits.Store(math.Float64bits(demand))
		if demand <= 0 && offered == 0 {
			continue
		}
		rec, _ := snap.recordOf(ts.name, tier)
		t := &rec.tenant
		rank, ok := snap.tierRank[t.Tier]
		if !ok {
			continue
		}
		if demand <= 0 {
			cf.unmeasured.offered[rank] += offered // arrivals no average of the tenant's holds yet
			continue
		}
		limit := math.Inf(1) // what the tenant's own limits let through
		if t.Limit != nil {
			limit = perSecond(*t.Limit)
			if rec.mayBorrow && snap.pool != nil {
				limit += perSecond(*snap.pool)
			}
		}
		busy = append(busy, fleetClaim{name: ts.name, demand: demand, weight: float64(max(t.Weight, 1)), cap: limit, rank: rank})
	}
	cf.busy = busy
	if first {
		return nil, false
	}
	busy = cf.unattributed(busy, len(snap.floors), seconds, e.settings.demandWindow)
	slices.SortFunc(busy, func(x, y fleetClaim) int {
		return cmp.Or(cmp.Compare(tailOrder(x), tailOrder(y)), cmp.Compare(y.demand, x.demand), cmp.Compare(x.name, y.name))
	})
	named := busy[:min(len(busy), maxFleetTenants)]
	for len(named) > 0 && named[len(named)-1].name == "" {
		named = named[:len(named)-1] // unattributed claims are tails
	}
	// The rest, per tier and step, as spread over the nodes: each node
	// reports its part of a tenant's demand and of its weight, at the ratio
	// the whole tenant would have.
	tails := busy[len(named):]
	for i := range tails {
		c := &tails[i]
		if c.name == "" {
			continue // unattributed: already the node's part
		}
		n := float64(nodes)
		c.step = tailStep(n * c.demand / c.weight)
		c.demand, c.weight, c.name = min(c.demand, c.cap/n), c.weight/n, ""
	}
	slices.SortFunc(tails, func(x, y fleetClaim) int {
		return cmp.Or(cmp.Compare(x.rank, y.rank), cmp.Compare(x.step, y.step))
	})
	merged := tails[:0]
	for _, c := range tails {
		if m := len(merged) - 1; m >= 0 && merged[m].rank == c.rank && merged[m].step == c.step {
			merged[m].demand += c.demand
			merged[m].weight += c.weight
			continue
		}
		merged = append(merged, c)
	}
	cf.report = encodeReport(cf.report[:0], cf.denials.Swap(0), named, merged)
	return cf.report, true
}

// unattributed adds to busy, per tier, the demand of the tenants whose own
// averages have not started at this node (tierTail): claimed in full. A
// node sees its part of a spread tenant's arrivals, so a sparse tenant's
// average starts (at its second arrival at the node) and settles N times
// later than one engine's would: the tail is larger here than in one
// engine.
func (cf *centralFair) unattributed(busy []fleetClaim, tiers int, seconds float64, window time.Duration) []fleetClaim {
	for k, demand := range cf.unmeasured.fold(tiers, seconds, window) {
		busy = append(busy, fleetClaim{demand: demand, weight: demand / unattributedRatio, cap: math.Inf(1), rank: k,
			step: unattributedStep})
	}
	return busy
}

const (
	// unattributedRatio is the demand per weight of a tier's unattributed
	// demand: below any water level, so it is claimed in full.
	unattributedRatio = 1e-6
	// unattributedStep is its tail step: before every other.
	unattributedStep = math.MinInt32
)

// tailOrder sorts tenants (0) before tail steps (1).
func tailOrder(c fleetClaim) int {
	if c.name == "" {
		return 1
	}
	return 0
}

// tailStep is the step of a ratio of demand to weight.
func tailStep(ratio float64) int64 {
	return int64(math.Floor(tailSteps * math.Log2(max(ratio, 1e-9))))
}

// A report, little-endian: version, global denials, the number of tenants
// by name, each as name length (uint16), name, demand, weight, limit
// (float64) and tier rank (int64), then the number of tail steps, each as
// tier rank, step (int64), demand and weight (float64).
func encodeReport(buf []byte, denials int64, named, tails []fleetClaim) []byte {
	le := binary.LittleEndian
	buf = le.AppendUint64(buf, reportVersion)
	buf = le.AppendUint64(buf, uint64(denials))
	buf = le.AppendUint64(buf, uint64(len(named)))
	for _, c := range named {
		buf = le.AppendUint16(buf, uint16(len(c.name))) // names are at most 256 bytes (ValidateRequest)
		buf = append(buf, c.name...)
		for _, f := range [...]float64{c.demand, c.weight, c.cap} {
			buf = le.AppendUint64(buf, math.Float64bits(f))
		}
		buf = le.AppendUint64(buf, uint64(c.rank))
	}
	buf = le.AppendUint64(buf, uint64(len(tails)))
	for _, c := range tails {
		buf = le.AppendUint64(buf, uint64(c.rank))
		buf = le.AppendUint64(buf, uint64(c.step))
		buf = le.AppendUint64(buf, math.Float64bits(c.demand))
		buf = le.AppendUint64(buf, math.Float64bits(c.weight))
	}
	return buf
}

// startFleet empties the fleet's claimants, for reports to be added.
func (cf *centralFair) startFleet() {
	clear(cf.fleet)
	cf.fleet = cf.fleet[:0]
	if cf.byName == nil {
		cf.byName, cf.tails = map[string]int{}, map[tailKey]int{}
	}
	clear(cf.byName)
	clear(cf.tails)
}

// add adds one node's report to the fleet's claimants and returns its
// global denials. A report that does not parse, or names a tier rank the
// policy does not have, is left out whole.
func (cf *centralFair) add(report string, tiers int) (denials int64) {
	r := reportReader{s: report, ok: true}
	if r.u64() != reportVersion {
		return 0
	}
	denials = int64(r.u64())
	parsed := cf.parsed[:0]
	valid := func(c fleetClaim) bool {
		return r.ok && c.rank >= 0 && c.rank < tiers && c.demand >= 0 && c.weight > 0 && !math.IsInf(c.demand+c.weight, 0)
	}
	for n := r.u64(); n > 0 && r.ok; n-- {
		c := fleetClaim{name: r.str(), demand: r.f64(), weight: r.f64(), cap: r.f64(), rank: int(int64(r.u64()))}
		r.ok = valid(c) && c.name != "" && !(c.cap < 0)
		parsed = append(parsed, c)
	}
	for n := r.u64(); n > 0 && r.ok; n-- {
		c := fleetClaim{rank: int(int64(r.u64())), step: int64(r.u64()), demand: r.f64(), weight: r.f64(), cap: math.Inf(1)}
		r.ok = valid(c)
		parsed = append(parsed, c)
	}
	cf.parsed = parsed
	defer clear(parsed)
	if !r.ok || r.s != "" {
		return 0
	}
	for _, c := range parsed {
		if c.name != "" {
			if j, seen := cf.byName[c.name]; seen {
				cf.fleet[j].demand += c.demand
				continue
			}
			cf.byName[c.name] = len(cf.fleet)
		} else {
			k := tailKey{c.rank, c.step}
			if j, seen := cf.tails[k]; seen {
				cf.fleet[j].demand += c.demand
				cf.fleet[j].weight += c.weight
				continue
			}
			cf.tails[k] = len(cf.fleet)
		}
		cf.fleet = append(cf.fleet, c)
	}
	return denials
}

// reportReader reads a report; ok turns false at the first short read,
// after which every read is zero.
type reportReader struct {
	s  string
	ok bool
}

func (r *reportReader) take(n int) string {
	if !r.ok || len(r.s) < n {
		r.ok, r.s = false, ""
		return ""
	}
	v := r.s[:n]
	r.s = r.s[n:]
	return v
}

func (r *reportReader) u64() uint64 {
	if b := r.take(8); len(b) == 8 {
		return le64(b)
	}
	return 0
}

func (r *reportReader) f64() float64 { return math.Float64frombits(r.u64()) }

func (r *reportReader) str() string {
	b := r.take(2)
	if len(b) < 2 {
		return ""
	}
	return r.take(int(b[0]) | int(b[1])<<8)
}

// le64 is the little-endian uint64 in the first 8 bytes of s.
func le64(s string) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(s[i])
	}
	return v
}

// bucketFill is how full a global bucket in decide.lua's format is at now
// (µs), 0 to 1; 1 when it is missing (a missing bucket is full) or was
// written with another period (a policy change: it is rescaled at its
// next decision).
func bucketFill(v string, lim *policy.Limit, now int64) float64 {
	capacity := float64(lim.Burst) * float64(lim.PeriodMicros())
	if len(v) != 32 || capacity <= 0 {
		return 1
	}
	level, last, period, rate := int64(le64(v[0:])), int64(le64(v[8:])), int64(le64(v[16:])), int64(le64(v[24:]))
	if period != lim.PeriodMicros() {
		return 1
	}
	tokens := float64(level) + float64(max(now-last, 0))*float64(rate)
	return max(min(tokens/capacity, 1), 0)
}

// pace sets c's share level from the allocation in force (v, for the
// request's snapshot): its tenant's share, split among the parts of a
// split tenant, as a share bucket named key (the tenant's: Prefix.Share).
func (b *central) pace(c *centralCall, v *centralShares, tenant, key string, parts int64) {
	level := v.levels[c.tierRank]
	if math.IsInf(level, 1) {
		return // the tier's whole demand fits: nobody in it is paced
	}
	rate := level * float64(max(c.tenant.Weight, 1)) / float64(max(parts, 1))
	burst := math.Ceil(b.e.shareBurstTokens(rate, c.snap) / float64(max(parts, 1)))
	period := shareFixedPeriod
	perPeriod := math.Round(rate * float64(period) / 1e6)
	if burst*float64(period) > 1<<53 { // huge shares: whole tokens per second are precise enough
		period = 1_000_000
		perPeriod = math.Round(rate)
	}
	c.share = shareLevel{key: key, rate: max(int64(perPeriod), 1), burst: max(int64(burst), 1), period: period,
		maxRetry: b.e.settings.tickInterval}
	_, c.aboveShare = v.above[tenant]
}

// shareLevel is a paced request's share bucket: its key and limit.
type shareLevel struct {
	key                 string // "" when the request is not paced
	rate, burst, period int64
	// maxRetry bounds the retry after of a request its share denies:
	// shares are computed again every fairness interval.
	maxRetry time.Duration
}
