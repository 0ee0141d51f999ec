package enforcer

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/scheduler"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// The upstream gate: seed 004's enforcement of a degraded upstream
// (pkg/upstream). The leader publishes a plan; every reconcile interval
// each enforcer reads it if it changed, reports its demand per class on
// each upstream of the plan and reads the fleet's (upstream.lua), computes
// every class's allocation (upstream.Allocate: the same figures on every
// node) and enforces its part of it (upstream.Part) in one token bucket per
// class and upstream.
//
// A valid request on an endpoint that draws on an upstream that is not
// Healthy is gated before the levels: a tenant whose class the phase
// suspends is refused (Decision.Suspended: 503 with Retry-After,
// X-Outage-Mode and X-Tier); any other takes its cost from its class's
// bucket, else it is denied at LevelUpstream (429) naming the reduced
// limit. Either way no level is debited. What the class bucket gave is
// given back when the levels refuse the request. A class's demand, which
// sizes its allocation, is what its tenants' own limits let through plus
// what the gate refused.
//
// While no upstream of the plane is degraded the gate costs a decision one
// atomic load. Without Redis there is no plan and no gate.

// LevelUpstream is where a request is denied by its upstream's degraded
// capacity: not one of Levels, which are the policy's limits.
const LevelUpstream Level = "upstream"

// gate is an engine's upstream gate.
type gate struct {
	// plan is what decisions read: nil while no upstream is degraded.
	plan atomic.Pointer[gatePlan]
	// shown is the plan in force, healthy or not, for UpstreamStatus.
	shown atomic.Pointer[gatePlan]
	// reports are the passive reports to forward, usage the tenants'
	// admitted totals (upstream_report.go).
	reports pendingReports
	usage   usageState

	// The loop's state (one goroutine).
	held       *upstream.Plan
	heldAt     int64         // µs, local clock, when held was last confirmed
	heldAge    time.Duration // held's age then (Redis TIME − its PublishedMs)
	measuredAt int64         // µs, local clock, of the last demand measure
	nodes      int           // the live nodes the last exchange counted
	byName     map[string]*gateUpstream
	scratch    scheduler.Scratch
}

// gatePlan is a plan as decisions use it.
type gatePlan struct {
	plan   *upstream.Plan
	policy *policy.Policy
	ups    []*gateUpstream // in the plan's order
	// byIndex is the degraded upstream each endpoint of policy draws on
	// (nil: none), by the policy's endpoint index: requests name endpoints
	// in any case (policy.ResolveEndpoint), as the levels take them.
	byIndex    []*gateUpstream
	retryAfter time.Duration // a suspended tenant's Retry-After: the cycle
}

// gateUpstream is one degraded upstream's state on this node. The plan's
// fields are replaced by the loop under mu; buckets persist across plans.
type gateUpstream struct {
	name string

	mu      sync.Mutex
	up      *upstream.UpstreamPlan
	buckets [upstream.NumClasses]classBucket
	reasons [upstream.NumClasses]string // a denial's reason, per class
	// offered counts the class's demand since the last exchange (settle,
	// and what the class was refused, suspended or throttled); demand is
	// its moving average, tokens/s. fleet is the fleet's as last read.
	offered [upstream.NumClasses]int64
	demand  [upstream.NumClasses]float64
	fleet   classDemand
	// shown is what Status reports: allocation and node part per class.
	alloc, part [upstream.NumClasses]float64
	confidence  float64
	fractions   [upstream.NumClasses]float64
	shed        [2][upstream.NumClasses]int64 // suspended, throttled
}

// classBucket is a token bucket that may go into debt: it admits a request
// when it holds min(cost, burst), as a share bucket does, so a request
// costlier than the burst is paced, never refused for good.
type classBucket struct {
	rate, burst, tokens float64
	last                int64 // µs
}

func (b *classBucket) take(cost float64, now int64) (ok bool, waitUs int64) {
	if now > b.last {
		b.tokens = min(b.burst, b.tokens+b.rate*float64(now-b.last)/1e6)
		b.last = now
	}
	if b.tokens >= min(cost, b.burst) && b.rate > 0 {
		b.tokens -= cost
		return true, 0
	}
	if b.rate <= 0 {
		return false, -1
	}
	return false, int64(math.Ceil((min(cost, b.burst) - b.tokens) / b.rate * 1e6))
}

// gateBurst is how many seconds of its rate a class bucket holds.
const gateBurst = 0.5

// route finds the degraded upstream r's endpoint draws on, the class of r's
// tenant on it and r's cost; nil when the request is not gated. A request
// the levels would refuse as invalid (its units, an unknown endpoint or
// tenant, an api key not bound to the tenant) is not gated: the engine
// answers it as it would without an outage, and nothing about the outage
// is told to a caller that is not the tenant's.
func (e *Engine) route(r *Request) (gp *gatePlan, gu *gateUpstream, class upstream.Class, cost int64) {
	if gp = e.gate.plan.Load(); gp == nil {
		return nil, nil, 0, 0
	}
	i, ok := gp.policy.ResolveEndpoint(r.Endpoint)
	if !ok || gp.byIndex[i] == nil {
		return nil, nil, 0, 0
	}
	_, cost, err := e.snap.Load().resolve(r, false)
	if err != nil {
		return nil, nil, 0, 0
	}
	gu = gp.byIndex[i]
	return gp, gu, gp.classOf(gu, r), cost
}

// classOf is the class of r's tenant on gu: the plan's for a tenant it
// names, else its tier's (the policy's tier for a tenant the plane names,
// else r's tier if the plane has it, else the default tier), else low.
func (gp *gatePlan) classOf(gu *gateUpstream, r *Request) upstream.Class {
	up := gu.plan()
	if tc, ok := up.Tenants[r.Tenant]; ok {
		return tc.Class
	}
	tier := r.Tier
	if t, ok := gp.policy.Tenant(r.Tenant); ok {
		tier = t.Tier
	} else if _, ok := gp.policy.Tier(tier); !ok {
		tier = gp.policy.Spec().DefaultTier
	}
	if c, ok := up.Tiers[tier]; ok {
		return c
	}
	return upstream.Low
}

func (gu *gateUpstream) plan() *upstream.UpstreamPlan {
	gu.mu.Lock()
	defer gu.mu.Unlock()
	return gu.up
}

// take admits a request of cost, before the levels, by its class on gu:
// its cost from the class's bucket. It reports whether it did, or fills d
// with the refusal: a suspended class, or a bucket that cannot cover the
// cost. A refused request counts as its class's demand, so that a class
// the recovery lets back in is allocated what it asks for.
func (gp *gatePlan) take(gu *gateUpstream, class upstream.Class, cost, now int64, d *Decision) bool {
	gu.mu.Lock()
	defer gu.mu.Unlock()
	gu.offered[class] += cost // given back by settle when the levels refuse it
	if class == upstream.Suspended || gu.fractions[class] <= 0 {
		gu.shed[0][class]++
		*d = Decision{Level: LevelUpstream, Bound: LevelUpstream, RetryAfter: gp.retryAfter, Reason: gu.reasons[class],
			Cost: cost, Upstream: gu.name, Class: upstream.Suspended.String(), Suspended: true, policy: gp.policy}
		return false
	}
	ok, waitUs := gu.buckets[class].take(float64(cost), now)
	if ok {
		return true
	}
	gu.shed[1][class]++
	retry := gp.retryAfter // a class with no rate yet: the next cycle
	if waitUs >= 0 {
		retry = retryDuration(waitUs)
	}
	*d = Decision{Level: LevelUpstream, Bound: LevelUpstream, RetryAfter: retry, Reason: gu.reasons[class],
		Cost: cost, Upstream: gu.name, Class: class.String(), policy: gp.policy}
	return false
}

// settle finishes a decision take admitted: what it took goes back when
// the levels did not admit the request (or it could not be decided), and
// no longer counts as demand. A class's demand is what its tenants' own
// limits let through, and what the gate refused: a whale far over its
// tenant limit claims its limit, not its offer.
func (gu *gateUpstream) settle(class upstream.Class, cost int64, d *Decision, err error) {
	gu.mu.Lock()
	defer gu.mu.Unlock()
	if err != nil || !d.Allow {
		b := &gu.buckets[class]
		b.tokens = min(b.burst, b.tokens+float64(cost))
		gu.offered[class] -= cost
	}
	if err == nil {
		d.Upstream, d.Class = gu.name, class.String()
	}
}

// gatedGroup is the gate's part of a group (DecideAll): each request's
// route and what take took for it.
type gatedGroup struct {
	gus     [MaxGroup]*gateUpstream
	classes [MaxGroup]upstream.Class
	costs   [MaxGroup]int64
}

// takeGroup takes every gated request's cost, in order. When one is
// refused the group is, at the upstream: every decision is that refusal,
// and what was taken goes back. A group with a request the levels would
// refuse as invalid is not gated (route): the engine refuses it whole.
func (e *Engine) takeGroup(rs []Request, ds []Decision, now int64, gg *gatedGroup) bool {
	for i := range rs {
		gp, gu, class, cost := e.route(&rs[i])
		if gp == nil {
			if _, _, err := e.snap.Load().resolve(&rs[i], false); e.gate.plan.Load() != nil && err != nil {
				e.settleGroup(rs[:i], ds[:i], gg, false, nil)
				*gg = gatedGroup{}
				return true
			}
			continue
		}
		if !gp.take(gu, class, cost, now, &ds[i]) {
			refusal := ds[i]
			e.settleGroup(rs[:i], ds[:i], gg, false, nil)
			for j := range ds {
				ds[j] = refusal
			}
			return false
		}
		gg.gus[i], gg.classes[i], gg.costs[i] = gu, class, cost
	}
	return true
}

// settleGroup finishes a group takeGroup admitted.
func (e *Engine) settleGroup(rs []Request, ds []Decision, gg *gatedGroup, allowed bool, err error) {
	for i := range rs {
		if gu := gg.gus[i]; gu != nil {
			d := &ds[i]
			if !allowed && d.Allow {
				d = &Decision{} // the group was refused: give back, count nothing
			}
			gu.settle(gg.classes[i], gg.costs[i], d, err)
			if err == nil {
				ds[i].Upstream, ds[i].Class = gu.name, gg.classes[i].String()
			}
		}
	}
}

// gateLoop exchanges with the fleet every reconcile interval until stop
// closes.
func (e *Engine) gateLoop(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(e.policy.Load().Spec().ReconcileInterval):
		}
		e.gateExchange()
	}
}

// gateReportTTL is how long a node's demand report counts, in intervals.
const gateReportTTL = 3

// gateExchange runs one exchange (upstream.lua) and applies its answer
// with the leader's plan, which it reads apart: the enforcer's ACL user may
// only read the plan (pkg/keyspace), and Redis checks every key a script
// declares for writing. When Redis does not answer, the plan held stays in
// force, its confidence decayed by its age, until it expires.
func (e *Engine) gateExchange() {
	g := &e.gate
	p := e.policy.Load()
	interval := p.Spec().ReconcileInterval
	now := e.clock()
	var ups []*gateUpstream
	keys := []string{upstream.NodesKey(p.ID())}
	args := []any{e.nodeID, strconv.FormatInt(gateReportTTL*max(interval, 100*time.Millisecond).Milliseconds(), 10)}
	if g.held != nil {
		seconds := float64(now-g.measuredAt) / 1e6
		for i := range g.held.Upstreams {
			gu := g.byName[g.held.Upstreams[i].Name]
			ups = append(ups, gu)
			keys = append(keys, upstream.DemandKey(p.ID(), gu.name))
			args = append(args, gu.measure(seconds))
		}
	}
	g.measuredAt = now
	ctx, cancel := context.WithTimeout(context.Background(), min(max(interval, 100*time.Millisecond), time.Second))
	defer cancel()
	if err := e.flushReports(ctx, p, now); err != nil {
		e.logger.Warn("upstream reports not forwarded", "plane", p.ID(), "err", err)
	}
	reply, err := lua.Upstream.Run(ctx, e.redis, keys, args...).Slice()
	if err == nil && len(reply) != 2+6*len(ups) {
		err = fmt.Errorf("upstream.lua answered %d values, want %d", len(reply), 2+6*len(ups))
	}
	var head []any // the plan's seq and at
	if err == nil {
		head, err = e.redis.HMGet(ctx, upstream.PlanKey(p.ID()), "seq", "at").Result()
	}
	if err != nil {
		e.gateHold(p, now)
		return
	}
	redisMs, _ := reply[0].(int64)
	nodes, _ := reply[1].(int64)
	g.nodes = int(max(nodes, 1))
	if head[0] == nil {
		g.applyAt(e, nil, p, now, 0, nil) // no plan: every upstream is healthy
		return
	}
	plan := g.held
	seq, _ := head[0].(string)
	at, _ := head[1].(string)
	if plan == nil || seq+":"+at != planToken(plan) { // a new plan: read its body
		vals, err := e.redis.HMGet(ctx, upstream.PlanKey(p.ID()), "seq", "at", "body").Result()
		if err != nil {
			e.gateHold(p, now)
			return
		}
		if vals[0] == nil { // gone since
			g.applyAt(e, nil, p, now, 0, nil)
			return
		}
		fresh, perr := upstream.ParsePlan(vals[0], vals[1], vals[2])
		if perr != nil {
			e.logger.Warn("upstream plan unreadable; keeping the last one", "plane", p.ID(), "err", perr)
			e.gateHold(p, now)
			return
		}
		plan = fresh
	}
	fleet := make(map[string]classDemand, len(ups))
	for i, gu := range ups {
		var fd classDemand
		v := reply[2+6*i:]
		n, _ := v[0].(int64)
		fd.nodes = int(n)
		for c := range fd.demand {
			s, _ := v[1+c].(string)
			fd.demand[c], _ = strconv.ParseFloat(s, 64)
		}
		fleet[gu.name] = fd
	}
	g.heldAt, g.heldAge = now, time.Duration(max(redisMs-plan.PublishedMs, 0))*time.Millisecond
	g.applyAt(e, plan, p, now, g.heldAge, fleet)
}

// planToken names a plan in the exchange: its seq and when it was
// published, since a seq starts again at 1 when the plan's hash is gone
// (expired, deleted, a Redis restart).
func planToken(p *upstream.Plan) string {
	return strconv.FormatInt(p.Seq, 10) + ":" + strconv.FormatInt(p.PublishedMs, 10)
}

type classDemand struct {
	nodes  int
	demand [upstream.NumClasses]float64
}

// gateHold keeps the held plan in force without Redis, aged by the local
// clock, until it expires.
func (e *Engine) gateHold(p *policy.Policy, now int64) {
	g := &e.gate
	if g.held == nil {
		return
	}
	age := time.Duration(now-g.heldAt)*time.Microsecond + g.heldAge
	if age >= upstream.PlanTTL {
		g.applyAt(e, nil, p, now, 0, nil)
		return
	}
	g.applyAt(e, g.held, p, now, age, nil)
}

// measure folds the tokens offered over the last seconds into the node's
// demand average and returns the report upstream.lua stores.
func (gu *gateUpstream) measure(seconds float64) string {
	gu.mu.Lock()
	defer gu.mu.Unlock()
	var b strings.Builder
	alpha := 1.0
	if seconds > 0 {
		alpha = 1 - math.Exp(-seconds/gateDemandWindow.Seconds())
	}
	for c := range gu.demand {
		if seconds > 0 {
			gu.demand[c] += alpha * (max(float64(gu.offered[c]), 0)/seconds - gu.demand[c])
		}
		gu.offered[c] = 0
		if c > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.FormatFloat(gu.demand[c], 'g', 8, 64))
	}
	return b.String()
}

// gateDemandWindow is the time constant of a node's class demand average.
const gateDemandWindow = time.Second

// applyAt puts plan in force, age old; fleet is the fleet's demand per
// upstream, fresh from Redis (nil: Redis did not answer). A nil plan, or
// one with every upstream healthy, turns the gate off.
func (g *gate) applyAt(e *Engine, plan *upstream.Plan, p *policy.Policy, now int64, age time.Duration, fleet map[string]classDemand) {
	if g.held != nil && (plan == nil || plan.Seq != g.held.Seq) {
		e.logger.Info("upstream plan changed", "plane", p.ID(), "from", g.held.Seq, "to", planSeq(plan))
	}
	g.held = plan
	if plan == nil {
		g.plan.Store(nil)
		g.shown.Store(nil)
		g.byName = nil
		return
	}
	byName := make(map[string]*gateUpstream, len(plan.Upstreams)) // upstreams gone from the plan are forgotten
	gp := &gatePlan{plan: plan, policy: p, byIndex: make([]*gateUpstream, len(p.Endpoints())), retryAfter: max(plan.Interval, time.Second)}
	gated := false
	for i := range plan.Upstreams {
		up := &plan.Upstreams[i]
		gu := g.byName[up.Name]
		if gu == nil {
			gu = &gateUpstream{name: up.Name}
		}
		byName[up.Name] = gu
		fd, fresh := fleet[up.Name]
		gu.set(up, fd, fresh, fleet != nil, g.nodes, age, plan.Interval, now, &g.scratch)
		gp.ups = append(gp.ups, gu)
		if up.Phase == upstream.Healthy {
			continue
		}
		for _, ep := range up.Endpoints {
			if i, ok := p.EndpointIndex(ep); ok { // a plan may be a cycle behind the policy
				gp.byIndex[i], gated = gu, true
			}
		}
	}
	g.byName = byName
	g.shown.Store(gp)
	if !gated {
		g.plan.Store(nil)
		return
	}
	g.plan.Store(gp)
}

func planSeq(p *upstream.Plan) int64 {
	if p == nil {
		return 0
	}
	return p.Seq
}

// set puts up in force on this node: the allocation of the capacity left
// (confidence decayed by age beyond one interval) over the classes, and
// this node's part of each. With the fleet's demand fresh from Redis
// (fresh), the parts follow it; an upstream new to this node (no demand
// reported yet, though Redis answered: reached) takes an even part of
// nodes, the live nodes the exchange counts; while Redis is away
// (!reached) every part stays as it was, so that no node takes more of the
// fleet's allocation than it had.
func (gu *gateUpstream) set(up *upstream.UpstreamPlan, fd classDemand, fresh, reached bool, nodes int, age, interval time.Duration, now int64, scratch *scheduler.Scratch) {
	gu.mu.Lock()
	defer gu.mu.Unlock()
	gu.up = up
	gu.confidence = max(0, up.Confidence-upstream.Staleness(age-interval))
	gu.fractions = up.Phase.Fractions()
	keepParts := false
	switch {
	case fresh:
		gu.fleet = fd
	case reached || gu.fleet.nodes == 0:
		gu.fleet = classDemand{nodes: nodes} // no demand known yet: even parts
	default:
		keepParts = true // Redis away: the last fleet demand, the last parts
	}
	upstream.Allocate(up.Now(gu.confidence), up.Reserve, gu.fleet.demand, gu.fractions, &gu.alloc, scratch)
	for c := range gu.buckets {
		if !keepParts {
			gu.part[c] = upstream.Part(gu.demand[c], gu.fleet.demand[c], gu.fleet.nodes)
		}
		b := &gu.buckets[c]
		if b.last != 0 {
			b.tokens = min(b.tokens+b.rate*float64(max(now-b.last, 0))/1e6, b.burst) // settle at the old rate
		}
		b.rate = gu.alloc[c] * gu.part[c]
		b.burst = max(b.rate*gateBurst, 1)
		if b.last == 0 {
			b.tokens = b.burst // a new bucket starts full
		}
		b.tokens, b.last = min(b.tokens, b.burst), now
		class := upstream.Class(c)
		if class == upstream.Suspended || gu.fractions[c] <= 0 {
			gu.reasons[c] = fmt.Sprintf("upstream %s is degraded (confidence %.2f, %s): tenants of class %s get none of its capacity until it recovers",
				up.Name, gu.confidence, up.Phase, class)
		} else {
			gu.reasons[c] = fmt.Sprintf("upstream %s is degraded (confidence %.2f, %s): class %s is limited to %.1f tokens/s fleet-wide of its %.0f/s capacity",
				up.Name, gu.confidence, up.Phase, class, gu.alloc[c], up.Capacity)
		}
	}
}

// UpstreamStatus is one upstream of the plan in force as this enforcer
// applies it.
type UpstreamStatus struct {
	Name       string
	Phase      string
	PhaseIndex int // upstream.Phase: 0 Healthy … 4 Phase3
	PlanSeq    int64
	Capacity   float64 // nominal, tokens/s
	Confidence float64 // the plan's, decayed by its age
	// Classes, suspended to critical.
	Classes [upstream.NumClasses]UpstreamClassStatus
}

// UpstreamClassStatus is one class on one upstream.
type UpstreamClassStatus struct {
	Class string
	// Allocation is the class's fleet-wide rate (tokens/s); Rate this
	// node's part of it; Demand this node's demand (tokens/s).
	Allocation, Rate, Demand float64
	// Suspended and Throttled count the requests refused on this node.
	Suspended, Throttled int64
}

// UpstreamStatus reports the upstreams of the plan in force; none without a
// plan (every upstream healthy, or no Redis).
func (e *Engine) UpstreamStatus() []UpstreamStatus {
	gp := e.gate.shown.Load()
	if gp == nil {
		return nil
	}
	out := make([]UpstreamStatus, 0, len(gp.ups))
	for _, gu := range gp.ups {
		gu.mu.Lock()
		s := UpstreamStatus{Name: gu.name, Phase: gu.up.Phase.String(), PhaseIndex: int(gu.up.Phase), PlanSeq: gp.plan.Seq, Capacity: gu.up.Capacity, Confidence: gu.confidence}
		for c := range s.Classes {
			s.Classes[c] = UpstreamClassStatus{Class: upstream.Class(c).String(), Allocation: gu.alloc[c], Rate: gu.buckets[c].rate,
				Demand: gu.demand[c], Suspended: gu.shed[0][c], Throttled: gu.shed[1][c]}
		}
		gu.mu.Unlock()
		out = append(out, s)
	}
	return out
}

// TenantUpstream is a tenant's class on one upstream of the plan in force,
// and why.
type TenantUpstream struct {
	Upstream, Phase, Class string
	// Confidence is the plan's, decayed by its age; Allocation the class's
	// fleet-wide rate while the upstream is degraded (tokens/s).
	Confidence, Allocation float64
	// Score is the tenant's priority score as the leader last computed it;
	// Named says the plan names the tenant (else its class is its tier's).
	Score float64
	Named bool
	// Why says, in words, why the tenant has its class and what the
	// upstream's phase lets that class have.
	Why string
}

// TenantUpstreams reports the class of the tenant named (of tier, for one
// the plane does not name) on every upstream of the plan in force.
func (e *Engine) TenantUpstreams(tenant, tier string) []TenantUpstream {
	gp := e.gate.shown.Load()
	if gp == nil {
		return nil
	}
	r := Request{Tenant: tenant, Tier: tier}
	var out []TenantUpstream
	for _, gu := range gp.ups {
		class := gp.classOf(gu, &r)
		gu.mu.Lock()
		up := gu.up
		tc, named := up.Tenants[tenant]
		tu := TenantUpstream{Upstream: gu.name, Phase: up.Phase.String(), Class: class.String(), Confidence: gu.confidence,
			Score: tc.Score, Named: named}
		var b strings.Builder
		if named {
			fmt.Fprintf(&b, "the leader's last cycle classed it %s: priority score %.2f (%s) at confidence %.2f", tc.Class, tc.Score, scoreTerms(gp.policy, tenant, tc.Score), up.Confidence)
		} else {
			fmt.Fprintf(&b, "its class is its tier's, %s", class)
		}
		switch f := gu.fractions[class]; {
		case up.Phase == upstream.Healthy:
			b.WriteString("; the upstream is healthy: nothing is gated")
		case class == upstream.Suspended || f <= 0:
			fmt.Fprintf(&b, "; in %s class %s gets none of the upstream (503 until it recovers)", up.Phase, class)
		case f < 1:
			tu.Allocation = gu.alloc[class]
			fmt.Fprintf(&b, "; in %s class %s gets %.0f%% of its demand, %.1f tokens/s fleet-wide", up.Phase, class, 100*f, gu.alloc[class])
		default:
			tu.Allocation = gu.alloc[class]
			fmt.Fprintf(&b, "; in %s class %s shares the upstream by weight %.1f: %.1f tokens/s fleet-wide", up.Phase, class, upstream.ClassWeights[class], gu.alloc[class])
		}
		gu.mu.Unlock()
		tu.Why = b.String()
		out = append(out, tu)
	}
	return out
}

// scoreTerms spells out a named tenant's priority score (seed 004's
// compute_priority_score) from the policy's signals; the usage term is what
// the leader's score holds beyond them (the policy does not carry usage).
func scoreTerms(p *policy.Policy, tenant string, score float64) string {
	t, ok := p.Tenant(tenant)
	if !ok {
		return "the tenant is not in the policy in force"
	}
	var sig upstream.Signals
	if pr := t.Priority; pr != nil {
		sig = upstream.Signals{ContractValue: float64(pr.ContractValue), Realtime: pr.Realtime, Importance: float64(pr.Importance) / 100}
	}
	base := p.PriorityBase(t.Tier)
	contract := min(sig.ContractValue/upstream.ContractValueCap, 1) * upstream.ContractWeight
	realtime := 0.0
	if sig.Realtime {
		realtime = upstream.RealtimeBonus
	}
	importance := sig.Importance * upstream.ImportanceWeight
	usage := max(0, score-upstream.Score(base, sig))
	return fmt.Sprintf("tier %s %.2f + contract %.2f + real-time %.2f + importance %.2f + usage %.2f", t.Tier, base, contract, realtime, importance, usage)
}
