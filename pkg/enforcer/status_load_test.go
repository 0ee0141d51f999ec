package enforcer

import (
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// TestPlaneLoadStatus: PlaneLoad's tiers sum what TenantStatusAt says of
// each tenant, its top is the busiest by demand, bounded, and under
// overload the tiers' fair shares fill the global rate.
func TestPlaneLoadStatus(t *testing.T) {
	p := policytest.Compile(t, planeHeader+`
  global: {rate: 100, burst: 100}
  tiers:
    - {name: gold, weight: 4, floorPercent: 20, tenant: {rate: 1000, burst: 1000}}
    - {name: free, weight: 1}
  defaultTier: free
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: g}
spec: {tenant: g, tier: gold}
`)
	e := newEngine(t, p)
	offers := map[string]int{"g": 100, "f1": 100, "f2": 10} // requests per second
	var last time.Time
	for ms := 0; ms < 5000; ms++ {
		now := at(time.Duration(ms) * time.Millisecond)
		for name, rate := range offers {
			if ms%(1000/rate) == 0 {
				mustDecide(t, e, now, Request{Tenant: name})
				last = now
			}
		}
	}
	s := e.PlaneLoad(2)
	if !s.Contended {
		t.Fatal("210 requests/s on a plane of 100/s: not contended")
	}
	if len(s.Tiers) != 2 || s.Tiers[0].Name != "gold" || s.Tiers[0].Floor != 20 || s.Tiers[0].FloorPercent != 20 || s.Tiers[0].Tenant.Rate != 1000 {
		t.Fatalf("tiers %+v", s.Tiers)
	}
	if len(s.Top) != 2 || s.Top[0].Demand < s.Top[1].Demand || s.Top[1].Tenant == "f2" {
		t.Fatalf("top 2 %+v: want g and f1, busiest first", s.Top)
	}
	want := map[string]*TierLoad{"gold": {Denied: map[Level]int64{}}, "free": {Denied: map[Level]int64{}}}
	denied := map[Level]int64{}
	for name := range offers {
		ts, ok := e.TenantStatusAt(last, name)
		if !ok {
			t.Fatalf("no state for %s", name)
		}
		w := want[ts.Tier]
		w.Tenants++
		w.Demand += ts.Demand
		w.FairShare += min(ts.Demand, ts.FairShare)
		w.Admitted += ts.Admitted
		w.AdmittedCost += ts.AdmittedCost
		for l, n := range ts.Denied {
			w.Denied[l] += n
			denied[l] += n
		}
		for _, tl := range s.Top {
			if tl.Tenant == name && (tl.Demand != ts.Demand || tl.FairShare != ts.FairShare || tl.Admitted != ts.Admitted || tl.Tier != ts.Tier) {
				t.Errorf("top entry %+v; TenantStatusAt says %+v", tl, ts)
			}
		}
	}
	var shares float64
	for _, got := range s.Tiers {
		w := want[got.Name]
		if got.Tenants != w.Tenants || got.Demand != w.Demand || math.Abs(got.FairShare-w.FairShare) > 1e-9 || got.Admitted != w.Admitted || got.AdmittedCost != w.AdmittedCost {
			t.Errorf("tier %s: %+v; its tenants sum to %+v", got.Name, got, *w)
		}
		for l, n := range w.Denied {
			if got.Denied[l] != n {
				t.Errorf("tier %s: %d denied at %s, its tenants %d", got.Name, got.Denied[l], l, n)
			}
		}
		shares += got.FairShare
	}
	for l, n := range denied {
		if s.Denied[l] != n {
			t.Errorf("%d denied at %s; the tenants %d", s.Denied[l], l, n)
		}
	}
	if s.Denied[LevelGlobal] == 0 {
		t.Error("no global denials under 2x overload")
	}
	if shares < 80 || shares > 101 {
		t.Errorf("the tiers' fair shares sum to %.1f/s; want about the global 100/s", shares)
	}
	if len(e.PlaneLoad(1000).Top) != 3 || len(e.PlaneLoad(0).Top) != 0 {
		t.Error("top is not bounded by the tenants and the ask")
	}
}

// BenchmarkPlaneLoad: one read of 50,000 tenants the policy does not name,
// as each view of /quota/ui makes.
func BenchmarkPlaneLoad(b *testing.B) {
	p := policytest.Compile(b, planeHeader+`
  global: {rate: 1000000, burst: 1000000}
  tiers: [{name: gold, weight: 4}, {name: free, weight: 1}]
  defaultTier: free
`)
	e := newEngine(b, p)
	for i := range 50_000 {
		mustDecide(b, e, at(time.Duration(i)*time.Microsecond), Request{Tenant: "t-" + strconv.Itoa(i)})
	}
	b.ResetTimer()
	for b.Loop() {
		if s := e.PlaneLoad(20); s.Tiers[1].Tenants != 50_000 {
			b.Fatalf("free tier: %d tenants", s.Tiers[1].Tenants)
		}
	}
}
