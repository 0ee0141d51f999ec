package enforcer

import (
	"testing"
	"time"
)

// TestDecideAtAllocatesNothing pins the claim that a decision allocates
// nothing once the tenant and key exist: uncontended and contended, allowed
// and denied.
func TestDecideAtAllocatesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts are not meaningful under -short")
	}
	for _, tc := range []struct {
		name       string
		globalRate int64
		warm       int
	}{
		{"uncontended", 1_000_000_000, 5000},
		{"contended", 1_000, 400_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, benchPolicy(t, 50, tc.globalRate, "maxmin"))
			rs := benchRequests(50)
			now := epoch
			for i := range tc.warm {
				now = now.Add(10 * time.Microsecond)
				mustDecide(t, e, now, rs[i%len(rs)])
			}
			i := 0
			allocs := testing.AllocsPerRun(10_000, func() {
				i++
				now = now.Add(10 * time.Microsecond)
				e.DecideAt(now, rs[i%len(rs)])
			})
			if allocs != 0 {
				t.Errorf("DecideAt allocates %.2f times per decision; want 0", allocs)
			}
		})
	}
}
