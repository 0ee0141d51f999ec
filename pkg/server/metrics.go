package server

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

// MetricPrefix starts the name of every metric the enforcer exports but
// the Go runtime's (go_*) and the process's (process_*). The manager's
// start with quotaplane_manager_ (package controllers): one prefix,
// quotaplane_, for the whole project, and the binary's name after it, so
// that the enforcers' view of a thing (quotaplane_enforcer_upstream_phase)
// and the manager's (quotaplane_manager_upstream_phase) never share a name.
const MetricPrefix = "quotaplane_enforcer_"

// other is the tenant label of every tenant the policy does not name, and
// the endpoint label of every endpoint it does not name: labels come from
// the policy, never from requests, so their number is bounded.
const other = "other"

// deniedLevels are the levels a denial names, in the order of
// deniedLevelIndex.
var deniedLevels = [...]enforcer.Level{enforcer.LevelGlobal, enforcer.LevelTenant, enforcer.LevelEndpoint, enforcer.LevelKey, enforcer.LevelUpstream}

func deniedLevelIndex(l enforcer.Level) int {
	switch l {
	case enforcer.LevelGlobal:
		return 0
	case enforcer.LevelTenant:
		return 1
	case enforcer.LevelEndpoint:
		return 2
	case enforcer.LevelKey:
		return 3
	default: // LevelUpstream
		return 4
	}
}

// Metrics are the enforcer's Prometheus metrics. The decision surfaces
// count into them (Observe); the rest is read from the engine and its
// policy at each scrape.
//
// Labels come from the policy in force, so their number is bounded by it:
// tenant is a tenant the policy names or "other", tier a tier of the plane,
// endpoint an endpoint it names or "other", level one of five.
type Metrics struct {
	Registry *prometheus.Registry

	admitted       *prometheus.CounterVec // tenant, tier
	throttled      *prometheus.CounterVec // tenant, tier
	admittedTokens *prometheus.CounterVec // tier
	denied         *prometheus.CounterVec // level, tier, endpoint
	latency        prometheus.Histogram

	// PolicyLoads counts policy loads by result (ok, error, unverified); the enforcer's
	// loader increments it.
	PolicyLoads *prometheus.CounterVec

	decisions atomic.Int64
	counters  atomic.Pointer[policyCounters] // for the last policy Observe met
}

// Decisions is how many decisions Observe has counted: every surface's.
func (m *Metrics) Decisions() int64 { return m.decisions.Load() }

// RedisLatency is the histogram of the engine's calls to Redis: observe
// into it (in seconds) from enforcer.WithRedisObserver and give it to
// NewMetrics.
func RedisLatency() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    MetricPrefix + "redis_call_duration_seconds",
		Help:    "Time of the engine's calls to Redis: a decision script call (a batch), a pipeline of them, or a reconcile.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 14), // 10µs … 80ms
	})
}

// NewMetrics registers the metrics of engine e in a new registry, with
// redis (may be nil) the histogram of its Redis calls, and the Go runtime's
// and the process's collectors.
func NewMetrics(e *enforcer.Engine, redis prometheus.Histogram) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPrefix + "admitted_total",
			Help: "Requests admitted, by tenant (named in the policy, else other) and tier.",
		}, []string{"tenant", "tier"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPrefix + "throttled_total",
			Help: "Requests denied at any level, by tenant (named in the policy, else other) and tier.",
		}, []string{"tenant", "tier"}),
		admittedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPrefix + "admitted_tokens_total",
			Help: "Tokens (request costs) admitted, by tier: a tier's share of them is what it got of the plane.",
		}, []string{"tier"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPrefix + "denied_total",
			Help: "Requests denied, by the level that fired, the tier and the endpoint (named in the policy, else other).",
		}, []string{"level", "tier", "endpoint"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    MetricPrefix + "decision_duration_seconds",
			Help:    "Time to decide a request, from the engine's call to its answer; its _count is every decision.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12), // 1µs … 4s
		}),
		PolicyLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricPrefix + "policy_loads_total",
			Help: "Policy loads by result: ok, error, or unverified (a policy store version whose signature does not verify, or a signed one older than the version in force: a replay); after error and unverified the last good policy stays in force.",
		}, []string{"result"}),
	}
	m.PolicyLoads.WithLabelValues("ok")
	m.PolicyLoads.WithLabelValues("error")
	m.PolicyLoads.WithLabelValues("unverified")
	m.Registry.MustRegister(m.admitted, m.throttled, m.admittedTokens, m.denied, m.latency, m.PolicyLoads, &engineCollector{e: e},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if redis != nil {
		m.Registry.MustRegister(redis)
	}
	m.curry(e.Policy())
	return m
}

// Observe counts one decision of request r that took d. Every decision
// surface calls it: the HTTP API, forward auth and the gRPC services. m
// may be nil. Its labels come from the policy the decision was made under;
// it allocates nothing but the first time a (level, tier, endpoint) is
// denied under a policy.
func (m *Metrics) Observe(r *enforcer.Request, dec *enforcer.Decision, d time.Duration) {
	if m == nil {
		return
	}
	m.decisions.Add(1)
	m.latency.Observe(d.Seconds())
	p := dec.Policy()
	if p == nil {
		return
	}
	c := m.counters.Load()
	if c == nil || c.policy != p {
		c = m.curry(p)
	}
	t := c.tenant(r)
	if dec.Allow {
		t.admitted.Inc()
		c.tiers[t.tier].tokens.Add(float64(dec.Cost))
		return
	}
	t.throttled.Inc()
	ep, ok := p.EndpointIndex(r.Endpoint)
	if !ok {
		ep = len(p.Spec().Endpoints) // other
	}
	c.deniedCounter(deniedLevelIndex(dec.Level), t.tier, ep).Inc()
}

// policyCounters are the counters of one policy, made when Observe first
// meets it, so that counting a decision takes a map lookup or two and no
// label hashing.
type policyCounters struct {
	policy *policy.Policy
	named  map[string]*tenantCounters // the tenants the policy names
	tiers  []tierCounters             // by the policy's tier index
	// defaultTier is the index of the tier of tenants the policy does not
	// name and that ask for no tier of the plane.
	defaultTier int
	tierIndex   map[string]int
	// denied are denied_total's counters by [level][tier][endpoint]
	// (endpoint len(Endpoints) is other), made at the first denial.
	denied    []atomic.Pointer[prometheus.Counter]
	deniedVec *prometheus.CounterVec
}

// tenantCounters are a tenant's (or a tier's other tenants') counters.
type tenantCounters struct {
	admitted, throttled prometheus.Counter
	tier                int
}

type tierCounters struct {
	other  tenantCounters // the tier's tenants the policy does not name
	tokens prometheus.Counter
}

// tenant is the counters of r's tenant: its own when the policy names it,
// else its tier's other.
func (c *policyCounters) tenant(r *enforcer.Request) *tenantCounters {
	if t, ok := c.named[r.Tenant]; ok {
		return t
	}
	k, ok := c.tierIndex[r.Tier]
	if !ok {
		k = c.defaultTier
	}
	return &c.tiers[k].other
}

func (c *policyCounters) deniedCounter(level, tier, endpoint int) prometheus.Counter {
	endpoints := len(c.policy.Spec().Endpoints) + 1
	slot := &c.denied[(level*len(c.tiers)+tier)*endpoints+endpoint]
	if p := slot.Load(); p != nil {
		return *p
	}
	name := other
	if endpoint < endpoints-1 {
		name = c.policy.Spec().Endpoints[endpoint].Name
	}
	counter := c.deniedVec.WithLabelValues(string(deniedLevels[level]), c.policy.Spec().Tiers[tier].Name, name)
	slot.Store(&counter) // a racing Observe stores the same counter
	return counter
}

// curry makes (and keeps) the counters of p. A policy swap makes them once
// per Metrics; a stale decision (made under the policy before) counts under
// its own policy's labels at the cost of making them again.
func (m *Metrics) curry(p *policy.Policy) *policyCounters {
	s := p.Spec()
	c := &policyCounters{
		policy:    p,
		named:     make(map[string]*tenantCounters, len(s.Tenants)),
		tiers:     make([]tierCounters, len(s.Tiers)),
		tierIndex: make(map[string]int, len(s.Tiers)),
		denied:    make([]atomic.Pointer[prometheus.Counter], len(deniedLevels)*len(s.Tiers)*(len(s.Endpoints)+1)),
		deniedVec: m.denied,
	}
	for k, tier := range s.Tiers {
		c.tierIndex[tier.Name] = k
		c.tiers[k] = tierCounters{
			other:  tenantCounters{admitted: m.admitted.WithLabelValues(other, tier.Name), throttled: m.throttled.WithLabelValues(other, tier.Name), tier: k},
			tokens: m.admittedTokens.WithLabelValues(tier.Name),
		}
	}
	c.defaultTier = c.tierIndex[s.DefaultTier]
	for _, t := range s.Tenants {
		c.named[t.Name] = &tenantCounters{admitted: m.admitted.WithLabelValues(t.Name, t.Tier), throttled: m.throttled.WithLabelValues(t.Name, t.Tier), tier: c.tierIndex[t.Tier]}
	}
	m.counters.Store(c)
	return c
}

// engineCollector reads the engine's state, and its policy, at each scrape.
type engineCollector struct{ e *enforcer.Engine }

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(MetricPrefix+name, help, labels, nil)
}

var (
	policyVersionDesc = desc("policy_version", "Version of the policy in force, by plane (namespace/name) and the first 12 hex digits of its hash.", "plane", "hash")
	backendDesc       = desc("backend_degraded", "1 while Redis is unavailable and the plane's failureMode decides, by mode.", "mode")
	nodesDesc         = desc("fleet_nodes", "Live enforcer nodes of the plane as the heartbeats count them.")
	scriptCallsDesc   = desc("redis_script_calls_total", "Calls of the decision script.")
	scriptFailsDesc   = desc("redis_script_failures_total", "Calls of the decision script that failed.")
	fallbacksDesc     = desc("failure_mode_decisions_total", "Decisions made by the plane's failureMode.")
	debtDesc          = desc("borrow_debt", "Tokens a tenant the policy names owes the burst pool.", "tenant")
	overageDesc       = desc("reconcile_overage_ratio", "In mode local-reconciled, what the fleet admitted beyond the global limit as of this node's last reconcile, as a fraction of the global burst (0 when within it, and in the other modes, whose global level cannot be overdrawn).")
	globalRateDesc    = desc("global_rate_tokens_per_second", "The plane's global limit, tokens per second.")
	fairShareDesc     = desc("tier_fair_share_ratio", "A tier's share of the global limit when every tier wants more than it: max-min by the tiers' weights, each at least its floor. The tiers' exact shares under shareBy tier; a reference under shareBy tenant, where the tier's busy tenants' weights decide.", "tier")

	confidenceDesc = desc("upstream_capacity_confidence", "An upstream's capacity confidence as this enforcer applies it (the leader's, decayed by the plan's age), 0 to 1.", "upstream")
	phaseDesc      = desc("upstream_phase", "An upstream's phase: 0 Healthy, 1 Degraded, 2 to 4 recovery phases 1 to 3.", "upstream")
	allocationDesc = desc("upstream_allocation", "A class's fleet-wide share of a degraded upstream, tokens per second.", "upstream", "class")
	shedDesc       = desc("upstream_shed_total", "Requests this enforcer refused for a degraded upstream, by class and reason: suspended (503) or throttled (429).", "upstream", "class", "reason")
)

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{policyVersionDesc, backendDesc, nodesDesc, scriptCallsDesc, scriptFailsDesc, fallbacksDesc, debtDesc,
		overageDesc, globalRateDesc, fairShareDesc, confidenceDesc, phaseDesc, allocationDesc, shedDesc} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.e.Policy()
	ch <- prometheus.MustNewConstMetric(policyVersionDesc, prometheus.GaugeValue, float64(p.Version()), p.ID(), p.Hash()[:12])
	b := c.e.BackendStatus()
	degraded := 0.0
	if b.Degraded {
		degraded = 1
	}
	ch <- prometheus.MustNewConstMetric(backendDesc, prometheus.GaugeValue, degraded, b.Mode.String())
	ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, float64(b.Nodes))
	ch <- prometheus.MustNewConstMetric(scriptCallsDesc, prometheus.CounterValue, float64(b.ScriptCalls))
	ch <- prometheus.MustNewConstMetric(scriptFailsDesc, prometheus.CounterValue, float64(b.Failures))
	ch <- prometheus.MustNewConstMetric(fallbacksDesc, prometheus.CounterValue, float64(b.Fallbacks))
	s := p.Spec()
	overage := 0.0
	if b.FleetLevel < 0 && s.Global.Burst > 0 {
		overage = -b.FleetLevel / float64(s.Global.Burst)
	}
	ch <- prometheus.MustNewConstMetric(overageDesc, prometheus.GaugeValue, overage)
	globalRate := 0.0
	if s.Global.Period > 0 {
		globalRate = float64(s.Global.Rate) / s.Global.Period.Seconds()
	}
	ch <- prometheus.MustNewConstMetric(globalRateDesc, prometheus.GaugeValue, globalRate)
	shares := tierFairShares(s.Tiers)
	for k, t := range s.Tiers {
		ch <- prometheus.MustNewConstMetric(fairShareDesc, prometheus.GaugeValue, shares[k], t.Name)
	}
	now := time.Now()
	for _, t := range s.Tenants {
		if !p.MayBorrow(&t) {
			continue
		}
		if st, ok := c.e.TenantStatusAt(now, t.Name); ok {
			ch <- prometheus.MustNewConstMetric(debtDesc, prometheus.GaugeValue, float64(st.Debt), t.Name)
		}
	}
	for _, u := range c.e.UpstreamStatus() {
		ch <- prometheus.MustNewConstMetric(confidenceDesc, prometheus.GaugeValue, u.Confidence, u.Name)
		ch <- prometheus.MustNewConstMetric(phaseDesc, prometheus.GaugeValue, float64(u.PhaseIndex), u.Name)
		for _, cl := range u.Classes {
			ch <- prometheus.MustNewConstMetric(allocationDesc, prometheus.GaugeValue, cl.Allocation, u.Name, cl.Class)
			ch <- prometheus.MustNewConstMetric(shedDesc, prometheus.CounterValue, float64(cl.Suspended), u.Name, cl.Class, "suspended")
			ch <- prometheus.MustNewConstMetric(shedDesc, prometheus.CounterValue, float64(cl.Throttled), u.Name, cl.Class, "throttled")
		}
	}
}

// tierFairShares are the tiers' shares of the plane, 0 to 1, when every
// tier wants all of it: the weighted max-min allocation the engine makes
// among tiers (scheduler.MaxMin, floors as fractions of the plane).
func tierFairShares(tiers []policy.Tier) []float64 {
	items := make([]scheduler.Item, len(tiers))
	for k, t := range tiers {
		items[k] = scheduler.Item{Weight: float64(t.Weight), Floor: float64(t.FloorPercent) / 100, Cap: math.Inf(1)}
	}
	out := make([]float64, len(tiers))
	scheduler.MaxMin(1, items, out, nil)
	return out
}
