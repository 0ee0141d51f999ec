package enforcer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
)

// Global bucket: SetPolicyAt(t0) must make refill run at the new rate from t0.
func TestRegression2_GlobalSetPolicyAtTakesEffectAtItsTime(t *testing.T) {
	plane := func(rate int) *policy.Policy {
		return policytest.Compile(t, planeHeader+fmt.Sprintf(`
  global: {rate: %d, burst: 100}
  fairness: none
  tiers: [{name: std}]
`, rate))
	}
	e := newEngine(t, plane(0))
	if d := mustDecide(t, e, at(0), Request{Tenant: "t", Units: 100}); !d.Allow {
		t.Fatal(d)
	}
	if err := e.SetPolicyAt(at(time.Second), plane(100)); err != nil {
		t.Fatal(err)
	}
	if d := mustDecide(t, e, at(2*time.Second), Request{Tenant: "u", Units: 100}); !d.Allow {
		t.Errorf("global: 1s after a swap to 100/s the bucket should hold 100; got %+v", d)
	}
}

// Pool: same.
func TestRegression2_PoolSetPolicyAtTakesEffectAtItsTime(t *testing.T) {
	plane := func(refill int) *policy.Policy {
		return policytest.Compile(t, planeHeader+fmt.Sprintf(`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std, tenant: {rate: 0, burst: 10}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: BurstPool
metadata: {name: pool}
spec: {size: 10, refillRate: %d, perTenantCeiling: 10}
`, refill))
	}
	e := newEngine(t, plane(0))
	mustDecide(t, e, at(0), Request{Tenant: "a", Units: 10})
	if d := mustDecide(t, e, at(0), Request{Tenant: "a", Units: 10}); d.Borrowed != 10 {
		t.Fatal(d)
	}
	if err := e.SetPolicyAt(at(time.Second), plane(10)); err != nil {
		t.Fatal(err)
	}
	if s := e.PlaneStatusAt(at(2 * time.Second)); s.PoolRemaining != 10 {
		t.Logf("status: pool remaining %d at 2s (status reads the old policy)", s.PoolRemaining)
	}
	// tenant b: 10 own, borrows 10 -> pool must hold 10 by 2s at the new 10/s.
	mustDecide(t, e, at(2*time.Second), Request{Tenant: "b", Units: 10})
	if d := mustDecide(t, e, at(2*time.Second), Request{Tenant: "b", Units: 10}); !d.Allow {
		t.Errorf("pool: 1s after a swap to refill 10/s the pool should hold 10; got %+v", d)
	}
}

// A key that overflowed, then gets named by a new policy, must get its own limit.
func TestRegression2_NamedKeyAfterSwapNotOverflow(t *testing.T) {
	plane := func(named string) *policy.Policy {
		return policytest.Compile(t, planeHeader+`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std, key: {rate: 0, burst: 5}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {tenant: acme`+named+`}
`)
	}
	e := newEngine(t, plane(""), WithMaxKeysPerTenant(1))
	mustDecide(t, e, at(0), Request{Tenant: "acme", APIKey: "a"})
	for range 5 {
		mustDecide(t, e, at(0), Request{Tenant: "acme", APIKey: "k"}) // overflow: uses its 5
	}
	if err := e.SetPolicyAt(at(time.Second), plane(", keys: [{key: k, limit: {rate: 0, burst: 100}}]")); err != nil {
		t.Fatal(err)
	}
	d := mustDecide(t, e, at(2*time.Second), Request{Tenant: "acme", APIKey: "k", Units: 50})
	if !d.Allow {
		t.Errorf("key k named with burst 100 after the swap, 50 denied: %+v", d)
	}
	s, _ := e.TenantStatusAt(at(2*time.Second), "acme")
	t.Logf("limits: %+v", s.Limits)
}

// Global rate 0 (accepted by Compile) with maxmin fairness.
func TestRegression2_GlobalRateZeroMaxMin(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, planeHeader+`
  global: {rate: 0, burst: 1000000}
  fairness: maxmin
  tiers: [{name: std, floorPercent: 10}]
`))
	denied := 0
	var first Decision
	for i := range 2000 {
		d := mustDecide(t, e, at(time.Duration(i)*time.Millisecond), Request{Tenant: fmt.Sprint("t", i%3)})
		if !d.Allow {
			if denied == 0 {
				first = d
			}
			denied++
		}
	}
	ps := e.PlaneStatusAt(at(2 * time.Second))
	t.Logf("plane %+v", ps)
	if denied > 0 {
		t.Errorf("%d of 2000 denied with 998000 global tokens left; first: %+v", denied, first)
	}
}

// Queued then admitted: counted as admitted AND as a global denial.
func TestRegression2_QueuedAdmittedCountedOnce(t *testing.T) {
	clock := &fakeClock{}
	clock.Set(at(2 * time.Second))
	e := newEngine(t, policytest.Compile(t, sprintf(queuePlane, "wfq")), WithClock(clock.Now), withQueueWait(5*time.Second))
	contend(t, e)
	before, _ := e.TenantStatusAt(at(2*time.Second), "a")
	done := make(chan Decision, 1)
	go func() {
		d, _ := e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "read"})
		done <- d
	}()
	poll.Until(t, 5*time.Second, "queued", func() bool { return e.queuedLen(fairWFQ) == 1 })
	clock.Add(time.Second)
	e.queue.poke()
	d := <-done
	after, _ := e.TenantStatusAt(at(3*time.Second), "a")
	t.Logf("decision %+v", d)
	adm := after.Admitted - before.Admitted
	den := after.Denied[LevelGlobal] - before.Denied[LevelGlobal]
	if adm+den != 1 {
		t.Errorf("one request: admitted +%d, denied(global) +%d", adm, den)
	}
}

// Two swaps before the tenant's next decision: the first one's time is lost.
func TestRegression2_TwoSwapsBeforeNextDecision(t *testing.T) {
	plane := func(rate int, extra string) *policy.Policy {
		return policytest.Compile(t, planeHeader+fmt.Sprintf(`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std, tenant: {rate: %d, burst: 10}}]
%s`, rate, extra))
	}
	other := `---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: other}
spec: {tenant: other}
`
	e := newEngine(t, plane(0, ""))
	mustDecide(t, e, at(0), Request{Tenant: "t", Units: 10})
	if err := e.SetPolicyAt(at(time.Second), plane(10, "")); err != nil {
		t.Fatal(err)
	}
	if err := e.SetPolicyAt(at(2*time.Second), plane(10, other)); err != nil { // unrelated change
		t.Fatal(err)
	}
	if d := mustDecide(t, e, at(2*time.Second), Request{Tenant: "t", Units: 10}); !d.Allow {
		t.Errorf("1s after a swap to 10/s (then an unrelated swap) the bucket should hold 10; got %+v", d)
	}
}
