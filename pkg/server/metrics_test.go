package server

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// TestMetricsLabelFromTheDecidingPolicy: a decision is counted under the
// tier of the policy that made it, not of one swapped in before Observe.
func TestMetricsLabelFromTheDecidingPolicy(t *testing.T) {
	plane := func(tier string) *policy.Policy {
		return policytest.Compile(t, `
apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: labels}
spec:
  global: {rate: 1000, burst: 1000}
  tiers: [{name: gold, weight: 2}, {name: silver, weight: 1}]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {tenant: acme, tier: `+tier+`}
`)
	}
	e, err := enforcer.New(plane("gold"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	m := NewMetrics(e, nil)
	r := enforcer.Request{Tenant: "acme", APIKey: "k"}
	d, err := e.Decide(t.Context(), r)
	if err != nil || !d.Allow {
		t.Fatalf("decide: %+v, %v", d, err)
	}
	if err := e.SetPolicy(plane("silver")); err != nil {
		t.Fatal(err)
	}
	m.Observe(r.Tenant, &d, time.Microsecond)
	if got := testutil.ToFloat64(m.admitted.WithLabelValues("acme", "gold")); got != 1 {
		t.Errorf("admitted{acme,gold} = %v; want 1, the tier that decided", got)
	}
	if got := testutil.ToFloat64(m.admitted.WithLabelValues("acme", "silver")); got != 0 {
		t.Errorf("admitted{acme,silver} = %v; want 0", got)
	}
	d, _ = e.Decide(t.Context(), r)
	m.Observe(r.Tenant, &d, time.Microsecond)
	if got := testutil.ToFloat64(m.admitted.WithLabelValues("acme", "silver")); got != 1 {
		t.Errorf("after the swap admitted{acme,silver} = %v; want 1", got)
	}
}
