package enforcer

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// After a swap that adds a tier above the existing one, while contended, a
// tenant of the old tier reads a stale water level until the next tick.
func TestRegression2_SwapAddingTierWhileContended(t *testing.T) {
	one := policytest.Compile(t, sprintf(queuePlane, "maxmin"))
	two := policytest.Compile(t, planeHeader+`
  global: {rate: 100, burst: 100}
  fairness: maxmin
  defaultTier: standard
  tiers:
    - {name: gold, weight: 4}
    - {name: standard, weight: 1}
`)
	e := newEngine(t, one)
	for i := range 800 {
		mustDecide(t, e, at(time.Duration(i)*2500*time.Microsecond), Request{Tenant: []string{"a", "b"}[i%2], Endpoint: "read"})
	}
	if !e.PlaneStatusAt(at(2 * time.Second)).Contended {
		t.Fatal("not contended")
	}
	mustDecide(t, e, at(2*time.Second), Request{Tenant: "a", Endpoint: "read"}) // runs the tick due at 2s
	now := at(2*time.Second + 10*time.Millisecond)
	if err := e.SetPolicyAt(now, two); err != nil {
		t.Fatal(err)
	}
	d := mustDecide(t, e, now.Add(40*time.Millisecond), Request{Tenant: "fresh", Endpoint: "read"})
	t.Logf("fresh standard tenant right after swap: %+v; water levels %v", d, e.PlaneStatusAt(now).WaterLevels)
	if !d.Allow && d.RetryAfter >= time.Minute {
		t.Errorf("a new tenant within any fair share told to retry after %v", d.RetryAfter)
	}
}
