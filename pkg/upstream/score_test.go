package upstream_test

import (
	"math"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// Seed 004's tiers' base scores.
const (
	enterprise = 0.7
	business   = 0.5
	starter    = 0.3
	free       = 0.1
)

// TestScoreSeed: seed 004's compute_priority_score.
func TestScoreSeed(t *testing.T) {
	for _, tc := range []struct {
		name string
		base float64
		s    upstream.Signals
		want float64
	}{
		{"free, nothing else", free, upstream.Signals{}, 0.1},
		{"enterprise with 500k ARR", enterprise, upstream.Signals{ContractValue: 500_000}, 0.85},
		{"ARR counts up to 500k", enterprise, upstream.Signals{ContractValue: 2_000_000}, 0.85},
		{"half of it", business, upstream.Signals{ContractValue: 250_000}, 0.575},
		{"real-time adds 0.10", starter, upstream.Signals{Realtime: true}, 0.4},
		{"full usage adds 0.05", business, upstream.Signals{Usage: 1}, 0.55},
		{"full importance adds 0.10", business, upstream.Signals{Importance: 1}, 0.6},
		{"all of it", business, upstream.Signals{ContractValue: 100_000, Realtime: true, Usage: 0.6, Importance: 0.5}, 0.5 + 0.03 + 0.1 + 0.03 + 0.05},
		{"capped at 1", enterprise, upstream.Signals{ContractValue: 1e6, Realtime: true, Usage: 1, Importance: 1}, 1},
		{"negative contract value counts 0", business, upstream.Signals{ContractValue: -1e6}, 0.5},
		{"importance and usage clamped", business, upstream.Signals{Importance: 7, Usage: -3}, 0.6},
		{"NaN counts 0", business, upstream.Signals{ContractValue: math.NaN(), Usage: math.NaN(), Importance: math.NaN()}, 0.5},
		{"infinite contract value counts as the cap", free, upstream.Signals{ContractValue: math.Inf(1)}, 0.25},
		{"a negative base scores 0", -1, upstream.Signals{}, 0},
	} {
		if got := upstream.Score(tc.base, tc.s); !approx(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestEnterpriseWith500kIsCritical: the seed's case of a tenant it protects
// at all costs: enterprise with 500k ARR scores 0.85, critical in every
// degraded band, its static class (high) while healthy.
func TestEnterpriseWith500kIsCritical(t *testing.T) {
	score := upstream.Score(enterprise, upstream.Signals{ContractValue: 500_000})
	for _, c := range []float64{0, 0.1, 0.1499, 0.15, 0.39, 0.4, 0.64, 0.65, 0.8999} {
		if got := upstream.Band(score, c, enterprise); got != upstream.Critical {
			t.Errorf("confidence %v: %s, want critical", c, got)
		}
	}
	for _, c := range []float64{0.9, 1} {
		if got := upstream.Band(score, c, enterprise); got != upstream.High {
			t.Errorf("confidence %v: %s, want high (static)", c, got)
		}
	}
}

func TestTierBase(t *testing.T) {
	for _, tc := range []struct {
		tiers int
		want  []float64
	}{
		{1, []float64{0.7}},
		{2, []float64{0.7, 0.1}},
		{3, []float64{0.7, 0.4, 0.1}},
		{4, []float64{0.7, 0.5, 0.3, 0.1}}, // the seed's, exactly
		{5, []float64{0.7, 0.55, 0.4, 0.25, 0.1}},
		{7, []float64{0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1}},
	} {
		for rank, want := range tc.want {
			got := upstream.TierBase(rank, tc.tiers)
			if tc.tiers == 4 && got != want || !approx(got, want) {
				t.Errorf("TierBase(%d, %d) = %v, want %v", rank, tc.tiers, got, want)
			}
		}
	}
	if got := upstream.TierBase(-1, 4); got != 0.7 {
		t.Errorf("rank -1: %v, want 0.7", got)
	}
	if got := upstream.TierBase(9, 4); got != 0.1 {
		t.Errorf("rank past the last: %v, want 0.1", got)
	}
	if got := upstream.TierBase(0, 0); got != 0.7 {
		t.Errorf("no tiers: %v, want 0.7", got)
	}
}
