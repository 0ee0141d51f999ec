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

// TestDecideAllAtAllocatesNothing: a group allocates nothing either, of one
// request or four (two of one tenant), uncontended and contended, admitted
// or denied; nor does a decision on a plane that binds keys, admitted or
// refused.
func TestDecideAllAtAllocatesNothing(t *testing.T) {
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
		for _, n := range []int{1, 4} {
			t.Run(sprintf("%s/n=%d", tc.name, n), func(t *testing.T) {
				e := newEngine(t, benchPolicy(t, 50, tc.globalRate, "maxmin"))
				groups := benchGroups(50, n)
				ds := make([]Decision, n)
				now := epoch
				var admitted, denied int
				for i := range tc.warm / n {
					now = now.Add(10 * time.Microsecond)
					if ok, err := e.DecideAllAt(now, groups[i%len(groups)], ds); err != nil {
						t.Fatal(err)
					} else if ok {
						admitted++
					} else {
						denied++
					}
				}
				if tc.name == "contended" && (admitted == 0 || denied == 0) {
					t.Fatalf("%d groups admitted, %d denied: want both", admitted, denied)
				}
				i := 0
				allocs := testing.AllocsPerRun(10_000, func() {
					i++
					now = now.Add(10 * time.Microsecond)
					e.DecideAllAt(now, groups[i%len(groups)], ds)
				})
				if allocs != 0 {
					t.Errorf("DecideAllAt allocates %.2f times per group; want 0", allocs)
				}
			})
		}
	}
	t.Run("bound", func(t *testing.T) {
		e := newEngine(t, boundBenchPolicy(t, 50))
		rs := benchRequests(50)
		stolen := Request{Tenant: "t1", Endpoint: "read", APIKey: "k2"}
		now := epoch
		for i := range 500 {
			mustDecide(t, e, now, rs[i%len(rs)])
		}
		i := 0
		allocs := testing.AllocsPerRun(10_000, func() {
			i++
			now = now.Add(10 * time.Microsecond)
			if d, err := e.DecideAt(now, rs[i%len(rs)]); err != nil || !d.Allow {
				t.Fatal(d, err)
			}
		})
		if allocs != 0 {
			t.Errorf("a decision on a bound plane allocates %.2f times; want 0", allocs)
		}
		if _, err := e.DecideAt(now, stolen); err == nil {
			t.Fatal("a stolen key passes")
		}
	})
}
