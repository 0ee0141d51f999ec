package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
)

// managerMetrics are the manager's own series, one label value per
// namespace that holds quota objects. Every name starts with
// quotaplane_manager_, as every enforcer's starts with quotaplane_enforcer_
// (server.MetricPrefix): one prefix for the project, the binary after it.
type managerMetrics struct {
	version         *prometheus.GaugeVec
	rejected        *prometheus.GaugeVec
	held            *prometheus.GaugeVec
	publishes       *prometheus.CounterVec
	publishFailures *prometheus.CounterVec
}

func newManagerMetrics(reg prometheus.Registerer) (*managerMetrics, error) {
	m := &managerMetrics{
		version: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotaplane_manager_policy_version",
			Help: "The policy version published for the plane of a namespace.",
		}, []string{"namespace"}),
		rejected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotaplane_manager_rejected_objects",
			Help: "Quota objects of a namespace left out of its policy for problems, or QuotaPlanes beside the namespace's plane (see their Ready condition).",
		}, []string{"namespace"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotaplane_manager_held_objects",
			Help: "Quota objects of a namespace whose current generation is invalid and whose last valid one stays in force (Ready reason Held).",
		}, []string{"namespace"}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_manager_publishes_total",
			Help: "Policy versions published (content changes only).",
		}, []string{"namespace"}),
		publishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_manager_publish_failures_total",
			Help: "Compiled policies Redis did not take (retried with backoff).",
		}, []string{"namespace"}),
	}
	for _, c := range []prometheus.Collector{m.version, m.rejected, m.held, m.publishes, m.publishFailures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *managerMetrics) record(v *verdict) {
	rejected, held := v.counts()
	m.rejected.WithLabelValues(v.namespace).Set(float64(rejected))
	m.held.WithLabelValues(v.namespace).Set(float64(held))
	m.version.WithLabelValues(v.namespace).Set(float64(v.version))
	// The counters exist from the first compile, at 0, so that rate() and
	// increase() see the first publish and the first failure.
	m.publishes.WithLabelValues(v.namespace)
	m.publishFailures.WithLabelValues(v.namespace)
}

// forget drops the series of a namespace that no longer holds quota objects.
func (m *managerMetrics) forget(ns string) {
	for _, vec := range []*prometheus.MetricVec{m.version.MetricVec, m.rejected.MetricVec, m.held.MetricVec, m.publishes.MetricVec, m.publishFailures.MetricVec} {
		vec.DeleteLabelValues(ns)
	}
}

// upstreamMetrics are the upstream leaders' series (upstream.go), the
// leader's view of each plane's Upstreams: what it sensed and decided.
//
// They are named quotaplane_manager_upstream_*, not
// quotaplane_enforcer_upstream_*: the enforcers export
// quotaplane_enforcer_upstream_capacity_confidence{upstream} and
// quotaplane_enforcer_upstream_phase{upstream}, the plan as each of them applies it (the
// leader's confidence decayed by the plan's age). The same name with
// another label set would be refused by a registry that holds both (a
// Prometheus registry requires one label set per name) and mixed by every
// query on the name (max by (upstream) would take the leader's and the
// enforcers' as one); a name of their own keeps the two views apart, and
// matches the manager's other series. Labels are bounded: namespaces with a
// plane, at most 16 upstreams each, 5 classes.
type upstreamMetrics struct {
	confidence    *prometheus.GaugeVec
	phase         *prometheus.GaugeVec
	changes       *prometheus.CounterVec
	tenants       *prometheus.GaugeVec
	cycles        *prometheus.HistogramVec
	cycleFailures *prometheus.CounterVec
	notices       *prometheus.CounterVec
}

func newUpstreamMetrics(reg prometheus.Registerer) (*upstreamMetrics, error) {
	m := &upstreamMetrics{
		confidence: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotaplane_manager_upstream_capacity_confidence",
			Help: "An Upstream's capacity confidence as the leader sensed it in its last cycle, 0 to 1 (seed 004's uhp.capacity_confidence).",
		}, []string{"namespace", "upstream"}),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotaplane_manager_upstream_phase",
			Help: "An Upstream's phase after the leader's last cycle: 0 Healthy, 1 Degraded, 2 to 4 recovery phases 1 to 3.",
		}, []string{"namespace", "upstream"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_manager_upstream_class_changes_total",
			Help: "Changes of a named tenant's priority class on an Upstream, by the class it left and the one it took (seed 004's tpe.tier_assignment_change).",
		}, []string{"namespace", "upstream", "from", "to"}),
		tenants: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "quotaplane_manager_upstream_tenants",
			Help: "Named tenants (TenantQuotas) in each priority class on an Upstream after the leader's last cycle.",
		}, []string{"namespace", "upstream", "class"}),
		cycles: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quotaplane_manager_upstream_cycle_duration_seconds",
			Help:    "How long a plane's reclassification cycle took, from its load to its published plan (seed 004's pipeline.reclassify_duration): it should stay far below the 10s fast cycle.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8), // 1ms to 16s
		}, []string{"namespace"}),
		cycleFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_manager_upstream_cycle_failures_total",
			Help: "Cycles that published no plan: the plane's policy or Upstreams could not be read, or Redis did not take the plan (the last plan applies until it expires).",
		}, []string{"namespace"}),
		notices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_manager_upstream_webhook_notices_total",
			Help: "Class-change notices for the plane's outage webhook, by result: sent (taken with a 2xx), dropped (the queue was full), failed (every attempt failed).",
		}, []string{"namespace", "result"}),
	}
	for _, c := range []prometheus.Collector{m.confidence, m.phase, m.changes, m.tenants, m.cycles, m.cycleFailures, m.notices} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// forget drops every series of a namespace whose leader stopped.
func (m *upstreamMetrics) forget(ns string) {
	for _, vec := range []*prometheus.MetricVec{m.confidence.MetricVec, m.phase.MetricVec, m.changes.MetricVec, m.tenants.MetricVec,
		m.cycles.MetricVec, m.cycleFailures.MetricVec, m.notices.MetricVec} {
		vec.DeletePartialMatch(prometheus.Labels{"namespace": ns})
	}
}

// forgetUpstream drops the series of one upstream no longer sensed.
func (m *upstreamMetrics) forgetUpstream(ns, name string) {
	for _, vec := range []*prometheus.MetricVec{m.confidence.MetricVec, m.phase.MetricVec, m.changes.MetricVec, m.tenants.MetricVec} {
		vec.DeletePartialMatch(prometheus.Labels{"namespace": ns, "upstream": name})
	}
}
