package enforcer

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

func TestRegression2_RaceGlobalReason(t *testing.T) {
	mk := func(burst int) *policy.Policy {
		return policytest.Compile(t, planeHeader+fmt.Sprintf(`
  global: {rate: 1, burst: %d}
  fairness: none
  tiers: [{name: std}]
`, burst))
	}
	ps := []*policy.Policy{mk(1), mk(2)}
	e := newEngine(t, ps[0])
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20000 {
				if g == 0 && i%10 == 0 {
					e.SetPolicyAt(at(time.Duration(i)), ps[i/10%2])
				}
				e.DecideAt(at(time.Duration(i)), Request{Tenant: fmt.Sprint("t", g)})
			}
		}()
	}
	wg.Wait()
}
