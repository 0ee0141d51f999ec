package fairref

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestWaterFill(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		capacity              float64
		weights, floors, caps []float64
		want                  []float64
	}{
		{"equal weights", 30, []float64{1, 1, 1}, []float64{0, 0, 0}, []float64{5, 100, 100}, []float64{5, 12.5, 12.5}},
		{"weighted", 40, []float64{1, 3}, []float64{0, 0}, []float64{100, 100}, []float64{10, 30}},
		{"floor", 40, []float64{1, 3}, []float64{20, 0}, []float64{100, 100}, []float64{20, 20}},
		{"fits", 40, []float64{1, 3}, []float64{20, 0}, []float64{1, 2}, []float64{1, 2}},
		{"zero capacity", 0, []float64{1, 1}, []float64{0, 0}, []float64{1, 2}, []float64{0, 0}},
	} {
		got := WaterFill(tc.capacity, tc.weights, tc.floors, tc.caps)
		for i := range tc.want {
			if math.Abs(got[i]-tc.want[i]) > 1e-6 {
				t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
}

// TestDefinitionsAgreeWhereTheyMust checks the two definitions against
// each other and against plain water-filling on random cases: both give
// min(capacity, the claims) in all; with one tier they are the same; with
// no floors ByTenant is one water-fill over all the tenants; every tier
// gets at least its floor as far as its claims reach.
func TestDefinitionsAgreeWhereTheyMust(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := range 500 {
		tiers := make([]Tier, 1+rng.IntN(4))
		var floorSum float64
		for k := range tiers {
			tiers[k] = Tier{Weight: float64(1 + rng.IntN(8))}
			if rng.IntN(2) == 0 {
				tiers[k].FloorPerSec = 100 * rng.Float64() / float64(len(tiers))
				floorSum += tiers[k].FloorPerSec
			}
		}
		tenants := make([]Tenant, 1+rng.IntN(30))
		var claims float64
		for i := range tenants {
			tenants[i] = Tenant{Tier: rng.IntN(len(tiers)), Weight: float64(1 + rng.IntN(8)), CapPerSec: 40 * rng.ExpFloat64()}
			claims += tenants[i].CapPerSec
		}
		const capacity = 100
		for name, f := range map[string]func(float64, []Tier, []Tenant) ([]float64, []float64){"ByTier": ByTier, "ByTenant": ByTenant} {
			shares, tierShares := f(capacity, tiers, tenants)
			var sum float64
			tierClaim := make([]float64, len(tiers))
			for i, tn := range tenants {
				sum += shares[i]
				tierClaim[tn.Tier] += tn.CapPerSec
				if shares[i] > tn.CapPerSec*(1+1e-9) {
					t.Fatalf("case %d %s: tenant %d gets %v over its claim %v", n, name, i, shares[i], tn.CapPerSec)
				}
			}
			if want := math.Min(capacity, claims); math.Abs(sum-want) > 1e-6*want {
				t.Fatalf("case %d %s: %v in all, want %v", n, name, sum, want)
			}
			for k, tr := range tiers {
				if floor := math.Min(tr.FloorPerSec, tierClaim[k]); tierShares[k] < floor*(1-1e-9) {
					t.Fatalf("case %d %s: tier %d gets %v under its floor %v", n, name, k, tierShares[k], floor)
				}
			}
		}
		if len(tiers) == 1 {
			a, _ := ByTier(capacity, tiers, tenants)
			b, _ := ByTenant(capacity, tiers, tenants)
			for i := range a {
				if math.Abs(a[i]-b[i]) > 1e-6*math.Max(a[i], 1) {
					t.Fatalf("case %d: one tier, tenant %d: ByTier %v, ByTenant %v", n, i, a[i], b[i])
				}
			}
		}
		if floorSum == 0 {
			w, f, c := make([]float64, len(tenants)), make([]float64, len(tenants)), make([]float64, len(tenants))
			for i, tn := range tenants {
				w[i], c[i] = tn.Weight, tn.CapPerSec
			}
			plain := WaterFill(capacity, w, f, c)
			b, _ := ByTenant(capacity, tiers, tenants)
			for i := range b {
				if math.Abs(plain[i]-b[i]) > 1e-6*math.Max(b[i], 1) {
					t.Fatalf("case %d: no floors, tenant %d: ByTenant %v, one water-fill %v", n, i, b[i], plain[i])
				}
			}
		}
	}
}
