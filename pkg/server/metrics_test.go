package server

import (
	"math"
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
	m.Observe(&r, &d, time.Microsecond)
	if got := testutil.ToFloat64(m.admitted.WithLabelValues("acme", "gold")); got != 1 {
		t.Errorf("admitted{acme,gold} = %v; want 1, the tier that decided", got)
	}
	if got := testutil.ToFloat64(m.admitted.WithLabelValues("acme", "silver")); got != 0 {
		t.Errorf("admitted{acme,silver} = %v; want 0", got)
	}
	d, _ = e.Decide(t.Context(), r)
	m.Observe(&r, &d, time.Microsecond)
	if got := testutil.ToFloat64(m.admitted.WithLabelValues("acme", "silver")); got != 1 {
		t.Errorf("after the swap admitted{acme,silver} = %v; want 1", got)
	}
}

const labelsPlane = `
apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: labels}
spec:
  global: {rate: 1000, burst: 1000}
  defaultTier: silver
  tiers:
  - {name: gold, weight: 2, tenant: {rate: 100, burst: 1}}
  - {name: silver, weight: 1, tenant: {rate: 100, burst: 1}}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {tenant: acme, tier: gold}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
`

// TestMetricsLabels: admissions and denials are counted under the tenant
// the policy names, else other in the tier the tenant asked for (the
// default tier when it names none of the plane's), and denials under the
// endpoint the policy names, else other; nothing from a request becomes a
// label.
func TestMetricsLabels(t *testing.T) {
	e, err := enforcer.New(policytest.Compile(t, labelsPlane))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	m := NewMetrics(e, nil)
	for _, r := range []enforcer.Request{
		{Tenant: "acme", Endpoint: "read", APIKey: "k"},                  // admitted, burst 1
		{Tenant: "acme", Endpoint: "read", APIKey: "k"},                  // denied: tenant
		{Tenant: "stranger", Endpoint: "nowhere", APIKey: "k"},           // admitted in silver, the default tier
		{Tenant: "stranger", Endpoint: "nowhere", APIKey: "k"},           // denied
		{Tenant: "goldish", Endpoint: "read", APIKey: "k", Tier: "gold"}, // admitted in gold
		{Tenant: "goldish", Endpoint: "read", APIKey: "k", Tier: "gold"}, // denied
		{Tenant: "tinman", Endpoint: "read", APIKey: "k", Tier: "tin"},   // no such tier: silver
	} {
		d, err := e.Decide(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		m.Observe(&r, &d, time.Microsecond)
	}
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"admitted{acme,gold}", testutil.ToFloat64(m.admitted.WithLabelValues("acme", "gold")), 1},
		{"throttled{acme,gold}", testutil.ToFloat64(m.throttled.WithLabelValues("acme", "gold")), 1},
		{"admitted{other,silver}", testutil.ToFloat64(m.admitted.WithLabelValues("other", "silver")), 2},
		{"throttled{other,silver}", testutil.ToFloat64(m.throttled.WithLabelValues("other", "silver")), 1},
		{"admitted{other,gold}", testutil.ToFloat64(m.admitted.WithLabelValues("other", "gold")), 1},
		{"throttled{other,gold}", testutil.ToFloat64(m.throttled.WithLabelValues("other", "gold")), 1},
		{"admitted_tokens{gold}", testutil.ToFloat64(m.admittedTokens.WithLabelValues("gold")), 2},
		{"denied{tenant,gold,read}", testutil.ToFloat64(m.denied.WithLabelValues("tenant", "gold", "read")), 2},
		{"denied{tenant,silver,other}", testutil.ToFloat64(m.denied.WithLabelValues("tenant", "silver", "other")), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v; want %v", c.name, c.got, c.want)
		}
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				if v := l.GetValue(); v == "stranger" || v == "goldish" || v == "tinman" || v == "nowhere" || v == "tin" {
					t.Errorf("%s has a label from a request: %s=%s", f.GetName(), l.GetName(), v)
				}
			}
		}
	}
}

// TestMetricsObserveAllocatesNothing: counting a decision, admitted or
// denied, allocates nothing once its counters exist.
func TestMetricsObserveAllocatesNothing(t *testing.T) {
	e, err := enforcer.New(policytest.Compile(t, labelsPlane))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	m := NewMetrics(e, nil)
	for _, r := range []enforcer.Request{{Tenant: "acme", Endpoint: "read", APIKey: "k"}, {Tenant: "someone", Endpoint: "other", APIKey: "k", Tier: "gold"}} {
		admitted, err := e.Decide(t.Context(), r)
		if err != nil || !admitted.Allow {
			t.Fatalf("decide %+v: %+v, %v", r, admitted, err)
		}
		denied, err := e.Decide(t.Context(), r)
		if err != nil || denied.Allow {
			t.Fatalf("decide %+v again: %+v, %v; want a denial", r, denied, err)
		}
		m.Observe(&r, &denied, time.Microsecond) // makes the denial's counter
		for _, d := range []*enforcer.Decision{&admitted, &denied} {
			if n := testing.AllocsPerRun(100, func() { m.Observe(&r, d, time.Microsecond) }); n != 0 {
				t.Errorf("Observe(%+v, allow %t) allocates %v times", r, d.Allow, n)
			}
		}
	}
}

// TestTierFairShares: the tiers' shares are their weights' when the floors
// are below them, and a floor above its tier's weighted share holds.
func TestTierFairShares(t *testing.T) {
	for _, c := range []struct {
		tiers []policy.Tier
		want  []float64
	}{
		{[]policy.Tier{{Weight: 8, FloorPercent: 40}, {Weight: 4, FloorPercent: 25}, {Weight: 1, FloorPercent: 5}}, []float64{8.0 / 13, 4.0 / 13, 1.0 / 13}},
		{[]policy.Tier{{Weight: 1, FloorPercent: 80}, {Weight: 1}}, []float64{0.8, 0.2}},
		{[]policy.Tier{{Weight: 3}}, []float64{1}},
	} {
		got := tierFairShares(c.tiers)
		for k := range c.want {
			if math.Abs(got[k]-c.want[k]) > 1e-9 {
				t.Errorf("tiers %+v: shares %v; want %v", c.tiers, got, c.want)
				break
			}
		}
	}
}
