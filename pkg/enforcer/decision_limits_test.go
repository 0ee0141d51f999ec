package enforcer

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestDecisionCarriesItsPolicy: the limits a surface announces with a
// decision are those of the policy that decided it, in every mode, also
// when another policy is swapped in between the decision and the headers
// (Engine.LimitsFor read the policy in force at the time of the headers,
// so a swap could announce one version's limits with another's decision).
// They are the plane's whole limits, not a node's share of them.
func TestDecisionCarriesItsPolicy(t *testing.T) {
	plane := func(mode string, tenantRate int) *policy.Policy {
		return policytest.Compile(t, withMode(planeHeader, mode)+sprintf(`  global: {rate: 1000, burst: 1000}
  tiers: [{name: std, weight: 1, tenant: {rate: %d, burst: %d}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1, limit: {rate: 50, burst: 50}}
`, tenantRate, tenantRate))
	}
	srv := redistest.Start(t)
	for _, mode := range []string{"local", "central", "local-reconciled"} {
		t.Run(mode, func(t *testing.T) {
			if err := srv.Client().FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			var opts []Option
			if mode != "local" {
				// A fleet of two: each node's own state holds a share.
				opts = []Option{WithRedis(srv.Client()), WithNodeID("a")}
				newEngine(t, plane(mode, 100), WithRedis(srv.Client()), WithNodeID("b"))
			}
			e := newEngine(t, plane(mode, 100), opts...)
			if own := e.snap.Load().global.Rate; mode == "local-reconciled" && own >= 1000 {
				t.Fatalf("the node enforces a global rate of %d; the test needs a share of 1000", own)
			}
			r := Request{Tenant: "acme", Endpoint: "read", APIKey: "k1"}
			d := mustDecide(t, e, time.Now(), r)
			if !d.Allow {
				t.Fatalf("first request denied: %+v", d)
			}
			if err := e.SetPolicy(plane(mode, 200)); err != nil {
				t.Fatal(err)
			}
			limits := d.Limits(&r)
			if g := limits[globalLevel]; g == nil || g.Rate != 1000 {
				t.Errorf("global limit %+v; want the plane's 1000/s", g)
			}
			if l := limits[LevelTenant.index()]; l == nil || l.Rate != 100 {
				t.Errorf("tenant limit %+v; want 100/s, the policy that decided (not 200/s, swapped in after)", l)
			}
			if l := limits[LevelEndpoint.index()]; l == nil || l.Rate != 50 {
				t.Errorf("endpoint limit %+v; want the plane's 50/s", l)
			}
			if d.Policy() == e.Policy() {
				t.Error("the decision names the policy swapped in after it")
			}
			if d2 := mustDecide(t, e, time.Now(), r); d2.Limits(&r)[LevelTenant.index()].Rate != 200 {
				t.Errorf("a decision after the swap announces %+v; want 200/s", d2.Limits(&r)[LevelTenant.index()])
			}
		})
	}
	var zero Decision
	if limits := zero.Limits(&Request{Tenant: "acme"}); limits != [len(Levels)]*policy.Limit{} {
		t.Errorf("a zero decision has limits %v; want none", limits)
	}
}
