package server

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// otherTenant is the tenant label of every tenant the policy does not name:
// labels come from the policy, never from requests, so their number is
// bounded.
const otherTenant = "other"

// Metrics are the enforcer's Prometheus metrics. The decision API counts
// into them; the rest is read from the engine at each scrape.
type Metrics struct {
	Registry *prometheus.Registry

	admitted *prometheus.CounterVec
	denied   *prometheus.CounterVec
	latency  prometheus.Histogram

	// PolicyLoads counts policy loads by result (ok, error); the enforcer's
	// loader increments it.
	PolicyLoads *prometheus.CounterVec

	deniedAt   map[enforcer.Level]prometheus.Counter // denied's, by level
	decisions  atomic.Int64
	admittedBy atomic.Pointer[admittedCounters] // for the last policy Observe met
}

// Decisions is how many decisions Observe has counted: every surface's.
func (m *Metrics) Decisions() int64 { return m.decisions.Load() }

// RedisLatency is the histogram of the engine's calls to Redis: observe
// into it (in seconds) from enforcer.WithRedisObserver and give it to
// NewMetrics.
func RedisLatency() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "quota_redis_call_duration_seconds",
		Help:    "Time of the engine's calls to Redis: a decision script call (a batch), a pipeline of them, or a reconcile.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 2, 14), // 10µs … 80ms
	})
}

// NewMetrics registers the metrics of engine e in a new registry, with
// redis (may be nil) the histogram of its Redis calls.
func NewMetrics(e *enforcer.Engine, redis prometheus.Histogram) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quota_admitted_total",
			Help: "Requests admitted, by tenant (named in the policy, else other) and tier.",
		}, []string{"tenant", "tier"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quota_denied_total",
			Help: "Requests denied, by the level that fired.",
		}, []string{"level"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "quota_decision_duration_seconds",
			Help:    "Time to decide a request, from the engine's call to its answer.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12), // 1µs … 4s
		}),
		PolicyLoads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quota_policy_loads_total",
			Help: "Policy loads by result: ok, or error (the last good policy stays in force).",
		}, []string{"result"}),
	}
	m.deniedAt = map[enforcer.Level]prometheus.Counter{}
	for _, l := range append(enforcer.Levels[:], enforcer.LevelUpstream) {
		m.deniedAt[l] = m.denied.WithLabelValues(string(l))
	}
	m.PolicyLoads.WithLabelValues("ok")
	m.PolicyLoads.WithLabelValues("error")
	m.Registry.MustRegister(m.admitted, m.denied, m.latency, m.PolicyLoads, &engineCollector{e: e})
	if redis != nil {
		m.Registry.MustRegister(redis)
	}
	return m
}

// Observe counts one decision of tenant that took d. Every decision
// surface calls it: the HTTP API, forward auth and the gRPC services. m
// may be nil. Its labels come from the policy the decision was made under.
func (m *Metrics) Observe(tenant string, dec *enforcer.Decision, d time.Duration) {
	if m == nil {
		return
	}
	m.decisions.Add(1)
	m.latency.Observe(d.Seconds())
	if !dec.Allow {
		m.deniedAt[dec.Level].Inc()
		return
	}
	p := dec.Policy()
	if p == nil {
		return
	}
	c := m.admittedBy.Load()
	if c == nil || c.policy != p {
		c = m.curry(p)
	}
	if n, ok := c.named[tenant]; ok {
		n.Inc()
		return
	}
	c.other.Inc()
}

// admittedCounters are quota_admitted_total's counters for one policy:
// one per tenant it names, and the one of every other tenant (the default
// tier's), so that counting a decision takes one map lookup and no label
// hashing.
type admittedCounters struct {
	policy *policy.Policy
	named  map[string]prometheus.Counter
	other  prometheus.Counter
}

// curry makes (and keeps) the counters of p.
func (m *Metrics) curry(p *policy.Policy) *admittedCounters {
	c := &admittedCounters{policy: p, named: make(map[string]prometheus.Counter, len(p.Spec().Tenants))}
	for _, t := range p.Spec().Tenants {
		c.named[t.Name] = m.admitted.WithLabelValues(t.Name, t.Tier)
	}
	var tier string
	if t, ok := p.DefaultTenant("", ""); ok {
		tier = t.Tier
	}
	c.other = m.admitted.WithLabelValues(otherTenant, tier)
	m.admittedBy.Store(c)
	return c
}

// engineCollector reads the engine's state at each scrape.
type engineCollector struct{ e *enforcer.Engine }

var (
	policyVersionDesc = prometheus.NewDesc("quota_policy_version", "Version of the policy in force.", []string{"plane", "hash"}, nil)
	backendDesc       = prometheus.NewDesc("quota_backend_degraded", "1 while Redis is unavailable and the plane's failureMode decides, by mode.", []string{"mode"}, nil)
	nodesDesc         = prometheus.NewDesc("quota_fleet_nodes", "Live enforcer nodes of the plane as the heartbeats count them.", nil, nil)
	scriptCallsDesc   = prometheus.NewDesc("quota_redis_script_calls_total", "Calls of the decision script.", nil, nil)
	scriptFailsDesc   = prometheus.NewDesc("quota_redis_script_failures_total", "Calls of the decision script that failed.", nil, nil)
	fallbacksDesc     = prometheus.NewDesc("quota_failure_mode_decisions_total", "Decisions made by the plane's failureMode.", nil, nil)
	debtDesc          = prometheus.NewDesc("quota_borrow_debt", "Tokens a tenant the policy names owes the burst pool.", []string{"tenant"}, nil)

	confidenceDesc = prometheus.NewDesc("quota_upstream_capacity_confidence", "An upstream's capacity confidence as this enforcer applies it (the leader's, decayed by the plan's age), 0 to 1.", []string{"upstream"}, nil)
	phaseDesc      = prometheus.NewDesc("quota_upstream_phase", "An upstream's phase: 0 Healthy, 1 Degraded, 2 to 4 recovery phases 1 to 3.", []string{"upstream"}, nil)
	allocationDesc = prometheus.NewDesc("quota_upstream_allocation", "A class's fleet-wide share of a degraded upstream, tokens per second.", []string{"upstream", "class"}, nil)
	shedDesc       = prometheus.NewDesc("quota_upstream_shed_total", "Requests this enforcer refused for a degraded upstream, by class and reason: suspended (503) or throttled (429).", []string{"upstream", "class", "reason"}, nil)
)

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{policyVersionDesc, backendDesc, nodesDesc, scriptCallsDesc, scriptFailsDesc, fallbacksDesc, debtDesc,
		confidenceDesc, phaseDesc, allocationDesc, shedDesc} {
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
	now := time.Now()
	for _, t := range p.Spec().Tenants {
		if !p.MayBorrow(&t) {
			continue
		}
		if s, ok := c.e.TenantStatusAt(now, t.Name); ok {
			ch <- prometheus.MustNewConstMetric(debtDesc, prometheus.GaugeValue, float64(s.Debt), t.Name)
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
