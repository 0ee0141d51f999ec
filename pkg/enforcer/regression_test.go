package enforcer

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// Regression tests for bugs a review found; each failed before its fix.

// A key limit that a new policy removes used to leave an inactive limiter
// that denied the key for ever.
func TestRegression_RemovedKeyLimitStopsApplying(t *testing.T) {
	plane := func(key string) *policy.Policy {
		return policytest.Compile(t, planeHeader+`
  global: {rate: 1000, burst: 1000}
  fairness: none
  tiers: [{name: std`+key+`}]
`)
	}
	e := newEngine(t, plane(", key: {rate: 10, burst: 10}"))
	mustDecide(t, e, at(0), Request{Tenant: "t", APIKey: "k"})
	if err := e.SetPolicyAt(at(time.Second), plane("")); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if d := mustDecide(t, e, at(time.Duration(i+1)*time.Hour), Request{Tenant: "t", APIKey: "k"}); !d.Allow {
			t.Errorf("hour %d: key k denied after its limit was removed: %+v", i+1, d)
		}
	}
}

// A period change used to scale the level before capping it: the level
// overflowed (negative tokens) or the 128-bit division panicked with the
// tenant's lock held.
func TestRegression_PeriodChangeCarriesTokensWithoutOverflow(t *testing.T) {
	plane := func(lim string) *policy.Policy {
		return policytest.Compile(t, planeHeader+`
  global: {rate: 1000000000, burst: 1000000000}
  fairness: none
  tiers: [{name: std, tenant: `+lim+`}]
`)
	}
	for _, tc := range []struct{ from, to string }{
		{"{rate: 5000000, burst: 5000000}", "{rate: 10, burst: 10, period: 720h}"},
		{"{rate: 1000000000, burst: 1000000000, period: 1ms}", "{rate: 1, burst: 1, period: 8760h}"},
	} {
		e := newEngine(t, plane(tc.from))
		mustDecide(t, e, at(0), Request{Tenant: "t"})
		if err := e.SetPolicyAt(at(time.Millisecond), plane(tc.to)); err != nil {
			t.Fatal(err)
		}
		d := mustDecide(t, e, at(time.Second), Request{Tenant: "t"})
		if !d.Allow || d.Remaining < 0 {
			t.Errorf("%s -> %s: a full bucket carried into a smaller limit gives %+v; want allowed", tc.from, tc.to, d)
		}
	}
}

// A tenant short of its tokens whose loan the dry pool cannot cover fails
// the tenant level, which comes before endpoint; it used to be named endpoint.
func TestRegression_DryPoolFailsTheTenantLevelFirst(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, planeHeader+`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std, tenant: {rate: 0, burst: 10}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: e}
spec: {endpoint: e, cost: 1, limit: {rate: 0, burst: 12}}
---
apiVersion: quotaplane.io/v1alpha1
kind: BurstPool
metadata: {name: pool}
spec: {size: 5, refillRate: 0, perTenantCeiling: 5}
`))
	for i := range 15 { // x: 10 own tokens, then the whole pool
		if d := mustDecide(t, e, at(0), Request{Tenant: "x"}); !d.Allow {
			t.Fatalf("x request %d: %+v", i, d)
		}
	}
	for i := range 10 { // y: its own 10 tokens on endpoint e, which keeps 2
		if d := mustDecide(t, e, at(0), Request{Tenant: "y", Endpoint: "e"}); !d.Allow {
			t.Fatalf("y request %d: %+v", i, d)
		}
	}
	if d := mustDecide(t, e, at(0), Request{Tenant: "y", Endpoint: "e", Units: 3}); d.Level != LevelTenant {
		t.Errorf("tenant short with the pool dry, endpoint short too: denied at %q (%s); want tenant", d.Level, d.Reason)
	}
}

// SetPolicyAt puts the new limits in force at its time: refill after it runs
// at the new rate, not from the tenant's next decision.
func TestRegression_SetPolicyAtTakesEffectAtItsTime(t *testing.T) {
	plane := func(rate int) *policy.Policy {
		return policytest.Compile(t, planeHeader+fmt.Sprintf(`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std, tenant: {rate: %d, burst: 10}}]
`, rate))
	}
	e := newEngine(t, plane(0))
	mustDecide(t, e, at(0), Request{Tenant: "t", Units: 10})
	if err := e.SetPolicyAt(at(time.Second), plane(10)); err != nil {
		t.Fatal(err)
	}
	if d := mustDecide(t, e, at(2*time.Second), Request{Tenant: "t", Units: 10}); !d.Allow {
		t.Errorf("1s after a swap to 10/s the bucket should hold 10; got %+v", d)
	}
}

// Keys the policy names always get their own state; the overflow limiter
// shared by keys beyond the bound has the tier's key limit. A named key used
// to land in the overflow limiter, whose limit was the first overflowing key's.
func TestRegression_NamedKeysNeverOverflow(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, planeHeader+`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std, key: {rate: 100, burst: 100}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {tenant: acme, keys: [{key: batch, limit: {rate: 400, burst: 400}}, {key: partner, limit: {rate: 1, burst: 1}}]}
`), WithMaxKeysPerTenant(2))
	for _, k := range []string{"junk1", "junk2", "partner", "junk3"} {
		mustDecide(t, e, at(0), Request{Tenant: "acme", APIKey: k})
	}
	if d := mustDecide(t, e, at(0), Request{Tenant: "acme", APIKey: "batch", Units: 200}); !d.Allow {
		t.Errorf("key batch (400 in the policy) denied 200 tokens: %+v", d)
	}
	if d := mustDecide(t, e, at(0), Request{Tenant: "acme", APIKey: "junk4", Units: 2}); !d.Allow {
		t.Errorf("an overflowing key (tier limit 100, one used) denied 2 tokens: %+v", d)
	}
}

// A status read used to settle the real buckets and windows at its time, so
// a later decision dated before it was decided differently.
func TestRegression_StatusReadChangesNothing(t *testing.T) {
	p := policytest.Compile(t, planeHeader+`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: del}
spec: {endpoint: del, cost: 1, limit: {rate: 2, period: 300s, algorithm: slidingWindow}}
`)
	run := func(peek bool) Decision {
		e := newEngine(t, p)
		del := Request{Tenant: "a", Endpoint: "del"}
		mustDecide(t, e, at(0), del)
		mustDecide(t, e, at(0), del)
		if peek {
			s, _ := e.TenantStatusAt(at(10*time.Minute), "a")
			e.PlaneStatusAt(at(10 * time.Minute))
			if s.Limits[0].Remaining != 2 {
				t.Errorf("status at 10m: %+v; want the window empty then", s.Limits)
			}
		}
		return mustDecide(t, e, at(time.Second), del)
	}
	if a, b := run(false), run(true); a != b {
		t.Errorf("third delete at 1s: %+v without a status read, %+v after one at 10m", a, b)
	}
}

// A waiter whose context ends while the dispatcher holds it used to wait
// without bound.
func TestRegression_QueuedWaiterReturnsWhenItsContextEnds(t *testing.T) {
	clock := &fakeClock{}
	clock.Set(at(2 * time.Second))
	hold := make(chan struct{})
	held := make(chan struct{})
	var holding atomic.Bool
	e := newEngine(t, policytest.Compile(t, sprintf(queuePlane, "wfq")), WithClock(clock.Now), withQueueWait(time.Hour))
	contend(t, e)
	e.clock = func() int64 { // from here on, hold the dispatcher's first read
		if holding.CompareAndSwap(true, false) {
			close(held)
			<-hold
		}
		return clock.Now().UnixMicro()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.Decide(ctx, Request{Tenant: "a", Endpoint: "read"})
		done <- err
	}()
	poll.Until(t, 5*time.Second, "the request to queue", func() bool { return e.queuedLen(fairWFQ) == 1 })
	holding.Store(true)
	e.queue.poke()
	<-held // the dispatcher has taken the waiter and is deciding it
	cancel()
	close(hold)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Decide has not returned 5s after its context ended")
	}
}

// Every dispatcher retry of a pending waiter used to count as another
// global denial and as demand again.
func TestRegression_QueueRetriesAreNotCounted(t *testing.T) {
	clock := &fakeClock{}
	clock.Set(at(2 * time.Second))
	e := newEngine(t, policytest.Compile(t, sprintf(queuePlane, "wfq")), WithClock(clock.Now), withQueueWait(200*time.Millisecond))
	contend(t, e)
	before, _ := e.TenantStatusAt(at(2*time.Second), "a")
	e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "read"})
	after, _ := e.TenantStatusAt(at(2*time.Second), "a")
	if n := after.Denied[LevelGlobal] - before.Denied[LevelGlobal]; n != 1 {
		t.Errorf("one request that waited and timed out counted as %d global denials; want 1", n)
	}
}

// A policy change used to reset a bucket's clock to the decision's time even
// when that was earlier, minting the tokens of the interval again.
func TestRegression_PolicyChangeNeverMovesTheClockBack(t *testing.T) {
	plane := func(burst int) *policy.Policy {
		return policytest.Compile(t, planeHeader+fmt.Sprintf(`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std, tenant: {rate: 1, burst: %d}}]
`, burst))
	}
	run := func(swap bool) bool {
		e := newEngine(t, plane(10))
		mustDecide(t, e, at(100*time.Second), Request{Tenant: "t", Units: 10})
		if swap {
			_ = e.SetPolicyAt(at(100*time.Second), plane(11))
		}
		mustDecide(t, e, at(50*time.Second), Request{Tenant: "t", Units: 10}) // back-dated
		return mustDecide(t, e, at(100*time.Second), Request{Tenant: "t", Units: 10}).Allow
	}
	if a, b := run(false), run(true); a != b {
		t.Errorf("10 tokens at 100s right after spending 10 at 100s: allowed=%v without a swap, %v with one", a, b)
	}
}

// A tenant that owes its ceiling used to be told to wait for its own tokens
// alone, though repaying a little debt lets it borrow sooner: RetryAfter is
// the earliest time the request passes, and a microsecond earlier it fails.
func TestRegression_BorrowingTenantGetsTheEarliestRetryAfter(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, planeHeader+`
  global: {rate: 1000000, burst: 1000000}
  fairness: none
  tiers: [{name: std, tenant: {rate: 1, burst: 10}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: BurstPool
metadata: {name: pool}
spec: {size: 1000, refillRate: 100, perTenantCeiling: 5}
`))
	mustDecide(t, e, at(0), Request{Tenant: "t", Units: 10})
	if d := mustDecide(t, e, at(0), Request{Tenant: "t", Units: 5}); d.Borrowed != 5 {
		t.Fatalf("borrow: %+v", d)
	}
	d := mustDecide(t, e, at(0), Request{Tenant: "t", Units: 3})
	if d.RetryAfter != 30*time.Millisecond { // 3 tokens of debt repaid at 100/s
		t.Errorf("RetryAfter %v; want 30ms, when 3 tokens of debt are repaid", d.RetryAfter)
	}
	if early := mustDecide(t, e, at(d.RetryAfter-time.Microsecond), Request{Tenant: "t", Units: 3}); early.Allow {
		t.Errorf("allowed a microsecond before RetryAfter: %+v", early)
	}
	if ok := mustDecide(t, e, at(d.RetryAfter), Request{Tenant: "t", Units: 3}); !ok.Allow || ok.Borrowed != 3 {
		t.Errorf("at RetryAfter: %+v; want allowed with a loan of 3", ok)
	}
}

// TestRequestThatCanNeverPassSaysSo: a request that costs more than one of
// its limits can ever hold (X-Quota-Units: 1000000 on an export) was
// denied with the reason that the whole plane was at capacity, though it
// was idle, and a Retry-After that sends the client back in vain. The
// denial names the level it can never pass and says so, in mode local and
// central alike; a request that is merely over what is left still reads
// "used up".
func TestRequestThatCanNeverPassSaysSo(t *testing.T) {
	srv := redistest.Start(t)
	plane := planeHeader + `
  global: {rate: 1000, burst: 2000}
  tiers: [{name: std, weight: 1, tenant: {rate: 100, burst: 300}, key: {rate: 50, burst: 200}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec: {endpoint: export, cost: 50, limit: {rate: 100, period: 5m, algorithm: slidingWindow}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
`
	for _, mode := range []string{"local", "central"} {
		t.Run(mode, func(t *testing.T) {
			var opts []Option
			if mode == "central" {
				opts = append(opts, WithRedis(srv.Client()), WithNodeID("n1"))
			}
			e := newEngine(t, policytest.Compile(t, withMode(plane, mode)), opts...)
			for _, tc := range []struct {
				r     Request
				level Level
				want  string
			}{
				{Request{Tenant: "a", Endpoint: "export", Units: 1_000_000}, LevelGlobal, "the global limit holds at most 2000: it can never pass"},
				{Request{Tenant: "b", Endpoint: "read", Units: 301}, LevelTenant, "the tenant limit holds at most 300: it can never pass"},
				{Request{Tenant: "c", Endpoint: "export", Units: 3}, LevelEndpoint, "the endpoint limit holds at most 100: it can never pass"},
				{Request{Tenant: "d", Endpoint: "read", APIKey: "k", Units: 201}, LevelKey, "the key limit holds at most 200: it can never pass"},
			} {
				d, err := e.DecideAt(epoch, tc.r)
				if err != nil || d.Allow || d.Level != tc.level || !strings.Contains(d.Reason, tc.want) {
					t.Errorf("%+v: %+v, %v; want a denial at %s saying %q", tc.r, d, err, tc.level, tc.want)
				}
			}
			// Over what is left, not over what the limit holds: used up.
			mustDecide(t, e, epoch, Request{Tenant: "e", Endpoint: "read", Units: 300})
			if d := mustDecide(t, e, epoch, Request{Tenant: "e", Endpoint: "read", Units: 1}); d.Allow || strings.Contains(d.Reason, "never") {
				t.Errorf("a request over what is left: %+v; want a denial that does not say never", d)
			}
		})
	}
}

// TestBorrowingDoesNotDependOnPastEligibility: two tenants that never
// borrowed must get the same answer under the same policy. The borrow
// allowance was kept only for tenants that a policy once let borrow, so
// after a ceiling was lowered and raised again one of two such tenants was
// told it owed the pool its ceiling and the other borrowed. (Review of the
// tenant state change.)
func TestBorrowingDoesNotDependOnPastEligibility(t *testing.T) {
	plane := func(ceiling int, tiers string) *policy.Policy {
		return policytest.Compile(t, planeHeader+`
  global: {rate: 1000000, burst: 1000000}
  tiers:
    - {name: ta, weight: 3, tenant: {rate: 10, burst: 10, period: 1h}}
    - {name: tb, weight: 2, tenant: {rate: 10, burst: 10, period: 1h}}
    - {name: tc, weight: 1, tenant: {rate: 10, burst: 10, period: 1h}}
---
apiVersion: quotaplane.io/v1alpha1
kind: BurstPool
metadata: {name: pool}
spec: {size: 1000, refillRate: 1, perTenantCeiling: `+sprintf("%d", ceiling)+`, tiers: `+tiers+`}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: tx}
spec: {tenant: tx, tier: ta}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: ty}
spec: {tenant: ty, tier: tb}
`)
	}
	e := newEngine(t, plane(21, "[ta]"))
	for _, tenant := range []string{"tx", "ty"} {
		mustDecide(t, e, at(0), Request{Tenant: tenant, Units: 10})
	}
	if err := e.SetPolicyAt(at(time.Second), plane(6, "[tc]")); err != nil {
		t.Fatal(err)
	}
	if err := e.SetPolicyAt(at(2*time.Second), plane(21, "[ta, tb]")); err != nil {
		t.Fatal(err)
	}
	dx := mustDecide(t, e, at(3*time.Second), Request{Tenant: "tx", Units: 10})
	dy := mustDecide(t, e, at(3*time.Second), Request{Tenant: "ty", Units: 10})
	if dx.Allow != dy.Allow || dx.Reason != dy.Reason {
		t.Fatalf("tx %+v, ty %+v: two tenants that never borrowed, told apart", dx, dy)
	}
}
