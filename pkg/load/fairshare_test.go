package load

import (
	"math"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// fairPlane: a global rate of 100 tokens/s (6,000 a minute), gold (weight
// 3, no floor, no tenant limit) and free (weight 1, floor 40%, tenant limit
// 30/s); "heavy" is a gold tenant of weight 9, "capped" a gold tenant
// limited to 10/s.
const fairPlane = `apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: fair}
spec:
  global: {rate: 6000, burst: 6000, period: 1m}
  fairness: maxmin
  defaultTier: free
  tiers:
    - {name: gold, weight: 3, floorPercent: 0}
    - {name: free, weight: 1, floorPercent: 40, tenant: {rate: 30, burst: 30}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: heavy}
spec: {tenant: heavy, tier: gold, weight: 9}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: capped}
spec: {tenant: capped, tier: gold, limit: {rate: 10, burst: 10}}
`

func loadFairPlane(t *testing.T) *policy.Policy { return loadFairPlaneBy(t, "tenant") }

// loadFairPlaneBy is fairPlane sharing by shareBy.
func loadFairPlaneBy(t *testing.T, shareBy string) *policy.Policy {
	t.Helper()
	yaml := strings.Replace(fairPlane, "  fairness: maxmin\n", "  fairness: maxmin\n  shareBy: "+shareBy+"\n", 1)
	p := policytest.Compile(t, yaml)
	return p
}

// TestFairSharesByHand checks FairShares against allocations worked out on
// paper, by each shareBy.
func TestFairSharesByHand(t *testing.T) {
	type handCase struct {
		name    string
		tenants []DemandTenant
		want    []float64
		tiers   []float64 // gold, free
	}
	byTier := []handCase{{
		// Free claims 30 + 30 (its tenant limit). Tiers: gold 3L, free
		// max(L, 40); 3L + 40 = 100 → L = 20 < 40, so free keeps its floor
		// of 40 and gold gets 60.
		name:    "floor binds",
		tenants: []DemandTenant{{"g1", "gold", 200}, {"f1", "free", 200}, {"f2", "free", 200}},
		want:    []float64{60, 20, 20},
		tiers:   []float64{60, 40},
	}, {
		// Free wants 10 < its floor 40: the floor is capped at the demand,
		// gold gets 90. In gold, capped is held to its 10/s limit; g1
		// (weight 3, the tier's) and heavy (weight 9, and gold whatever the
		// generator said) share 80 as 3:9.
		name: "floor capped at demand, weights, tenant limit",
		tenants: []DemandTenant{
			{"g1", "gold", 200}, {"heavy", "free", 200}, {"capped", "gold", 200}, {"f1", "free", 10},
		},
		want:  []float64{20, 60, 10, 10},
		tiers: []float64{90, 10},
	}, {
		// f1 offers 500 but free tenants are limited to 30/s: its claim is
		// 30, and 30 + 30 fits in 100.
		name:    "tier default limit caps the claim",
		tenants: []DemandTenant{{"g1", "gold", 30}, {"f1", "free", 500}},
		want:    []float64{30, 30},
		tiers:   []float64{30, 30},
	}, {
		// Gold wants only 30: free gets the other 70 of its claim of 90,
		// 70/3 each.
		name:    "lower tier takes what the higher leaves",
		tenants: []DemandTenant{{"g1", "gold", 30}, {"f1", "free", 500}, {"f2", "free", 500}, {"f3", "free", 500}},
		want:    []float64{30, 70.0 / 3, 70.0 / 3, 70.0 / 3},
		tiers:   []float64{30, 70},
	}, {
		name:    "uncontended: everyone gets its demand",
		tenants: []DemandTenant{{"g1", "gold", 30}, {"f1", "free", 20}, {"f2", "free", 0}},
		want:    []float64{30, 20, 0},
		tiers:   []float64{30, 20},
	}, {
		// Free claims 4 × 30: gold 3L, free max(L, 40); 3L + L = 100 → L
		// = 25 < 40: free keeps its floor, 10 a tenant; gold gets 60.
		name:    "many small tenants: the tier's weight counts once",
		tenants: []DemandTenant{{"g1", "gold", 200}, {"f1", "free", 30}, {"f2", "free", 30}, {"f3", "free", 30}, {"f4", "free", 30}},
		want:    []float64{60, 10, 10, 10, 10},
		tiers:   []float64{60, 40},
	}}
	byTenant := []handCase{{
		// One level λ for every tenant: g1 3λ, each free tenant λ; 7λ =
		// 100 → λ = 100/7; free's 400/7 is above its floor of 40.
		name:    "many small tenants: each tenant's weight counts",
		tenants: []DemandTenant{{"g1", "gold", 200}, {"f1", "free", 30}, {"f2", "free", 30}, {"f3", "free", 30}, {"f4", "free", 30}},
		want:    []float64{300.0 / 7, 100.0 / 7, 100.0 / 7, 100.0 / 7, 100.0 / 7},
		tiers:   []float64{300.0 / 7, 400.0 / 7},
	}, {
		// g1..g3 3λ each, f1 λ: 10λ = 100 → λ = 10, free 10 < its floor
		// min(40, 30 its claim): free is raised to 30, gold shares 70.
		name:    "floor raises a tier its tenants' weights leave short",
		tenants: []DemandTenant{{"g1", "gold", 200}, {"g2", "gold", 200}, {"g3", "gold", 200}, {"f1", "free", 200}},
		want:    []float64{70.0 / 3, 70.0 / 3, 70.0 / 3, 30},
		tiers:   []float64{70, 30},
	}, {
		// capped is held to 10; heavy (weight 9) and g1 (3) share the rest
		// of gold's by weight: 12λ + 10 + f1's 10 (its floor: λ < 10) = 100.
		name: "weights, tenant limit, floor at demand",
		tenants: []DemandTenant{
			{"g1", "gold", 200}, {"heavy", "free", 200}, {"capped", "gold", 200}, {"f1", "free", 10},
		},
		want:  []float64{20, 60, 10, 10},
		tiers: []float64{90, 10},
	}, {
		name:    "uncontended: everyone gets its demand",
		tenants: []DemandTenant{{"g1", "gold", 30}, {"f1", "free", 20}, {"f2", "free", 0}},
		want:    []float64{30, 20, 0},
		tiers:   []float64{30, 20},
	}}
	for shareBy, cases := range map[string][]handCase{"tier": byTier, "tenant": byTenant} {
		p := loadFairPlaneBy(t, shareBy)
		for _, tc := range cases {
			t.Run(shareBy+": "+tc.name, func(t *testing.T) {
				shares, tiers, err := FairShares(p, tc.tenants)
				if err != nil {
					t.Fatal(err)
				}
				for i, want := range tc.want {
					if got := shares[i].SharePerSec; math.Abs(got-want) > 1e-6 {
						t.Errorf("%s: share %.6f, want %.6f", tc.tenants[i].Name, got, want)
					}
				}
				if tiers[0].Name != "gold" || tiers[1].Name != "free" {
					t.Fatalf("tier order %s, %s", tiers[0].Name, tiers[1].Name)
				}
				for k, want := range tc.tiers {
					if got := tiers[k].SharePerSec; math.Abs(got-want) > 1e-6 {
						t.Errorf("tier %s: share %.6f, want %.6f", tiers[k].Name, got, want)
					}
				}
			})
		}
	}
}

// TestFairSharesPlaneTierWins: a tenant the plane names is in the plane's
// tier whatever the generator said, with the plane's weight.
func TestFairSharesPlaneTierWins(t *testing.T) {
	shares, _, err := FairShares(loadFairPlane(t), []DemandTenant{{"heavy", "free", 1}})
	if err != nil {
		t.Fatal(err)
	}
	if s := shares[0]; s.Tier != "gold" || s.Weight != 9 || !math.IsInf(s.LimitPerSec, 1) {
		t.Errorf("heavy: %+v, want tier gold, weight 9, no limit", s)
	}
}

// TestCompareFairShares reads a tenants.csv and checks the deviations, the
// filter and the long tail's sums. Shares are in tokens: g1's requests cost
// 2 tokens each, so its requests per second are not what counts.
func TestCompareFairShares(t *testing.T) {
	const csvText = `tenant,tier,rank,profile_rate,offered_per_s,admitted_per_s,denied_global,denied_tenant,denied_endpoint,denied_key,borrowed,offered_tokens_per_s,admitted_tokens_per_s
g1,gold,1,100,100,35,0,0,0,0,0,200,70
f1,free,2,200,200,27,0,0,0,0,0,200,27
f2,free,3,0.5,0.5,0.5,0,0,0,0,0,0.5,0.5
`
	rows, err := parseTenantsCSV(strings.NewReader(csvText))
	if err != nil {
		t.Fatal(err)
	}
	// Shares: free claims 30 (f1's limit) + 0.5 < its floor 40, so it
	// gets 30.5 and gold 69.5.
	rep, err := CompareFairShares(loadFairPlane(t), rows, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
	if g := rep.Tenants[0]; !near(g.SharePerSec, 69.5) || !near(g.Deviation, 70/69.5-1) {
		t.Errorf("g1: share %v deviation %v, want 69.5 and %v", g.SharePerSec, g.Deviation, 70/69.5-1)
	}
	if f := rep.Tenants[1]; !near(f.SharePerSec, 30) || !near(f.Deviation, -0.1) {
		t.Errorf("f1: share %v deviation %v, want 30 and -10%%", f.SharePerSec, f.Deviation)
	}
	// f2's share is 0.5 < 1: filtered out.
	if rep.Considered != 2 || rep.Worst.Name != "f1" || rep.Within5 != 1 {
		t.Errorf("considered %d, worst %s, within 5%% %d; want 2, f1, 1", rep.Considered, rep.Worst.Name, rep.Within5)
	}
	if rep.TailTenants != 2 || !near(rep.TailSharePerSec, 30.5) || !near(rep.TailAdmitted, 27.5) || !near(rep.TailOffered, 200.5) {
		t.Errorf("tail: %d tenants, share %v, admitted %v, offered %v", rep.TailTenants, rep.TailSharePerSec, rep.TailAdmitted, rep.TailOffered)
	}
}
