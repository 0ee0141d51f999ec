package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
)

// managerMetrics are the manager's own series, one label value per
// namespace that holds quota objects.
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
}

// forget drops the series of a namespace that no longer holds quota objects.
func (m *managerMetrics) forget(ns string) {
	for _, vec := range []*prometheus.MetricVec{m.version.MetricVec, m.rejected.MetricVec, m.held.MetricVec, m.publishes.MetricVec, m.publishFailures.MetricVec} {
		vec.DeleteLabelValues(ns)
	}
}
