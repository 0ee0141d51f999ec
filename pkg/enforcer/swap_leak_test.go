package enforcer

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// Concurrent decisions while policies swap and status is read: every
// admitted token is accounted for at global and no tenant passes its burst.
func TestRegression2_ConcurrentNoLeakAcrossSwaps(t *testing.T) {
	mk := func(i int) *policy.Policy {
		return policytest.Compile(t, planeHeader+fmt.Sprintf(`
  global: {rate: 0, burst: 20000}
  fairness: none
  enforcer: {minReplicas: %d}
  tiers: [{name: std, tenant: {rate: 0, burst: 3000}, key: {rate: 0, burst: 700}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: w}
spec: {endpoint: w, cost: 3, limit: {rate: 0, burst: 1500}}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: named}
spec: {tenant: t%d}
`, 1+i%3, i%4))
	}
	plans := []*policy.Policy{mk(0), mk(1), mk(2), mk(3)}
	e, _ := New(plans[0], WithIdleTTL(time.Microsecond), withFairnessInterval(time.Millisecond), WithMaxKeysPerTenant(2))
	defer e.Close()
	var admitted atomic.Int64
	perTenant := make([]atomic.Int64, 8)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20000; i++ {
				tn := (i + g) % 8
				r := Request{Tenant: fmt.Sprint("t", tn), APIKey: fmt.Sprint("k", i%5), Units: int64(1 + i%3)}
				if i%2 == 0 {
					r.Endpoint = "w"
				}
				d, err := e.Decide(context.Background(), r)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allow {
					admitted.Add(d.Cost)
					perTenant[tn].Add(d.Cost)
				}
			}
		}()
	}
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			e.SetPolicy(plans[i%4])
			e.TenantStatusAt(time.UnixMicro(e.clock()), "t1")
			runtime.Gosched()
		}
	}()
	wg.Wait()
	close(stop)
	ps := e.PlaneStatusAt(time.UnixMicro(e.clock()))
	if got := admitted.Load() + ps.Global.Remaining; got != 20000 {
		t.Errorf("admitted cost %d + global remaining %d != 20000", admitted.Load(), ps.Global.Remaining)
	}
	for i := range perTenant {
		if perTenant[i].Load() > 3000 {
			t.Errorf("tenant t%d admitted %d > its burst 3000", i, perTenant[i].Load())
		}
	}
	t.Logf("admitted %d", admitted.Load())
}
