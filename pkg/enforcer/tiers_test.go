package enforcer

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// tierTenants makes, per tier, count tenants that together offer the given
// share of rate.
func tierTenants(rate float64, counts []int, offeredShare []float64, weights []int64) []fairTenant {
	var out []fairTenant
	for k, n := range counts {
		for i := range n {
			out = append(out, fairTenant{name: fmt.Sprintf("tier%d-%03d", k, i), tier: k, weight: weights[k], offered: rate * offeredShare[k] / float64(n)})
		}
	}
	return out
}

// perTier sums per-tenant rates by tier.
func perTier(tiers []fairTier, tenants []fairTenant, rates []float64) []float64 {
	sums := make([]float64, len(tiers))
	for i, tn := range tenants {
		sums[tn.tier] += rates[i]
	}
	return sums
}

// TestTierProtectionUnderOverload offers 150% of the global limit, half of
// the limit from each tier (2 enterprise, 20 standard and 200 free
// tenants), and checks that every tier gets its fair share by each
// shareBy within 5%:
//
//   - tier: enterprise all it asks (above its floor), standard most, free
//     shed first; a floor binds when weights alone would give a tier less;
//   - tenant (seed 002): every tenant by its weight, so the free tier's
//     200 tenants together outweigh enterprise's 2, and the floors are
//     what hold enterprise and standard up.
//
// Negative control: each run is also compared with the other shareBy's
// reference, which must be more than 5% off for some tier; a scenario in
// which both definitions agree could not tell them apart.
func TestTierProtectionUnderOverload(t *testing.T) {
	const globalRate = 10_000
	cases := []struct {
		name    string
		shareBy string
		tiers   []fairTier
		// want is each tier's admitted rate as a fraction of the global rate.
		want []float64
	}{
		{
			name:    "tier: weights shed free first",
			shareBy: "tier",
			tiers:   []fairTier{{"enterprise", 8, 40}, {"standard", 4, 25}, {"free", 1, 5}},
			want:    []float64{0.50, 0.40, 0.10},
		},
		{
			name:    "tier: free floor binds",
			shareBy: "tier",
			tiers:   []fairTier{{"enterprise", 8, 10}, {"standard", 4, 10}, {"free", 1, 30}},
			// the free floor takes 30%; enterprise and standard share the
			// other 70% by weight 8:4
			want: []float64{0.70 * 8 / 12, 0.70 * 4 / 12, 0.30},
		},
		{
			name:    "tenant: floors hold the few",
			shareBy: "tenant",
			tiers:   []fairTier{{"enterprise", 8, 40}, {"standard", 4, 25}, {"free", 1, 5}},
			// by weight alone a free tenant's 25/s fits and enterprise's
			// 2 × 8 of the 296 units of weight get 8%: enterprise and
			// then standard are raised to their floors, free takes the rest
			want: []float64{0.40, 0.25, 0.35},
		},
		{
			name:    "tenant: free floor binds",
			shareBy: "tenant",
			tiers:   []fairTier{{"enterprise", 8, 10}, {"standard", 4, 10}, {"free", 1, 30}},
			// free's 200 tenants get all they ask (5,000/s, above their
			// 30% floor); enterprise is raised to its 10% floor; standard
			// takes the rest
			want: []float64{0.10, 0.40, 0.50},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tenants := tierTenants(globalRate, []int{2, 20, 200}, []float64{0.5, 0.5, 0.5}, []int64{tc.tiers[0].weight, tc.tiers[1].weight, tc.tiers[2].weight})
			e := newEngine(t, policytest.Compile(t, scenarioPolicy(t, "maxmin", tc.shareBy, globalRate, tc.tiers, tenants)))
			res := runScenario(t, e, tenants, 3, 3*time.Second, 10*time.Second)
			admitted := perTier(tc.tiers, tenants, res.admitted)
			offered := perTier(tc.tiers, tenants, res.offered)
			other := map[string]string{"tier": "tenant", "tenant": "tier"}[tc.shareBy]
			reference := perTier(tc.tiers, tenants, fairShares(tc.shareBy, globalRate, tc.tiers, tenants, res.offered))
			control := perTier(tc.tiers, tenants, fairShares(other, globalRate, tc.tiers, tenants, res.offered))
			distinct := false
			for k, tr := range tc.tiers {
				t.Logf("%s: offered %.0f/s, admitted %.0f/s (%.0f%% success), reference %.0f/s (shareBy %s: %.0f/s), floor %d%%",
					tr.name, offered[k], admitted[k], 100*admitted[k]/offered[k], reference[k], other, control[k], tr.floorPercent)
				if want := tc.want[k] * globalRate; math.Abs(admitted[k]-want) > 0.05*want {
					t.Errorf("%s admitted %.0f/s; want %.0f/s ±5%%", tr.name, admitted[k], want)
				}
				if math.Abs(reference[k]-tc.want[k]*globalRate) > 0.05*tc.want[k]*globalRate {
					t.Errorf("%s: the reference allocator gives %.0f/s, the table %.0f/s: fix the table", tr.name, reference[k], tc.want[k]*globalRate)
				}
				if floor := float64(tr.floorPercent) / 100 * globalRate; admitted[k] < 0.95*math.Min(floor, offered[k]) {
					t.Errorf("%s admitted %.0f/s, below its floor %.0f/s", tr.name, admitted[k], floor)
				}
				distinct = distinct || math.Abs(admitted[k]-control[k]) > 0.05*control[k]
			}
			if !distinct {
				t.Errorf("every tier within 5%% of shareBy %s's reference too: the scenario does not tell the two apart", other)
			}
			if success := func(k int) float64 { return admitted[k] / offered[k] }; tc.shareBy == "tier" && !(success(2) < success(1) && success(1) < success(0)) && tc.tiers[2].floorPercent < 30 {
				t.Errorf("success rates %.2f, %.2f, %.2f: lower tiers must be shed first", success(0), success(1), success(2))
			}
		})
	}
}

// TestTierReservesWithoutFairness checks that with fairness none, where the
// global bucket is first come first served, a tier's floor is kept as a
// reserve that lower tiers cannot take: enterprise still gets its 40%.
func TestTierReservesWithoutFairness(t *testing.T) {
	const globalRate = 10_000
	tiers := []fairTier{{"enterprise", 8, 40}, {"standard", 4, 25}, {"free", 1, 5}}
	tenants := tierTenants(globalRate, []int{2, 20, 200}, []float64{0.5, 0.5, 0.5}, []int64{8, 4, 1})
	e := newEngine(t, policytest.Compile(t, scenarioPolicy(t, "none", "tier", globalRate, tiers, tenants)))
	res := runScenario(t, e, tenants, 5, 3*time.Second, 10*time.Second)
	admitted := perTier(tiers, tenants, res.admitted)
	t.Logf("admitted per tier: enterprise %.0f/s, standard %.0f/s, free %.0f/s", admitted[0], admitted[1], admitted[2])
	if admitted[0] < 0.95*0.40*globalRate {
		t.Errorf("enterprise admitted %.0f/s, below its 40%% floor", admitted[0])
	}
	if total := admitted[0] + admitted[1] + admitted[2]; total > 1.005*globalRate || total < 0.95*globalRate {
		t.Errorf("admitted %.0f/s in total; want the global limit %d/s", total, globalRate)
	}
}
