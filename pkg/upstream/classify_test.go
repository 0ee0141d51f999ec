package upstream_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/upstream"
)

const (
	C = upstream.Critical
	H = upstream.High
	M = upstream.Medium
	L = upstream.Low
	S = upstream.Suspended
)

// TestBandTable: seed 004's reclassify at its boundaries: each band's
// edges, each score threshold and just under it.
func TestBandTable(t *testing.T) {
	scores := []float64{1, 0.85, 0.8499, 0.65, 0.6499, 0.45, 0.4499, 0.25, 0.2499, 0}
	for _, row := range []struct {
		confidences []float64
		want        []upstream.Class // per score
	}{
		{[]float64{0.8999, 0.65}, []upstream.Class{C, C, H, H, M, M, L, L, S, S}},
		{[]float64{0.6499, 0.40}, []upstream.Class{C, C, H, H, M, M, S, S, S, S}},
		{[]float64{0.3999, 0.15}, []upstream.Class{C, C, H, H, S, S, S, S, S, S}},
		{[]float64{0.1499, 0}, []upstream.Class{C, C, S, S, S, S, S, S, S, S}},
	} {
		for _, c := range row.confidences {
			for i, score := range scores {
				if got := upstream.Band(score, c, free); got != row.want[i] {
					t.Errorf("score %v at confidence %v: %s, want %s", score, c, got, row.want[i])
				}
			}
		}
	}
}

// TestBandStatic: at confidence 0.9 or more every tenant has its static
// tier's class, whatever its score (seed 004's _static_to_tier).
func TestBandStatic(t *testing.T) {
	for _, tc := range []struct {
		base float64
		want upstream.Class
	}{
		{enterprise, H}, {business, M}, {starter, L}, {free, L},
		{0.55, M}, {0.4, L}, {0.6999, M}, {1, H}, {0, L},
		{upstream.TierBase(1, 3), L}, // 0.4 of three tiers
		{upstream.TierBase(1, 5), M}, // 0.55 of five
	} {
		for _, c := range []float64{0.9, 0.95, 1} {
			for _, score := range []float64{0, 0.5, 1} {
				if got := upstream.Band(score, c, tc.base); got != tc.want {
					t.Errorf("base %v, score %v, confidence %v: %s, want %s", tc.base, score, c, got, tc.want)
				}
			}
		}
		if got := upstream.StaticClass(tc.base); got != tc.want {
			t.Errorf("StaticClass(%v) = %s, want %s", tc.base, got, tc.want)
		}
	}
}

// TestBandRounding: a score that reaches a threshold in decimals reaches
// it in binary too. 0.3 + 0.15 is 0.44999999999999996 in binary: seed
// 004's Python would leave a starter tenant with 500k ARR below medium.
func TestBandRounding(t *testing.T) {
	score := upstream.Score(starter, upstream.Signals{ContractValue: 500_000})
	if score >= 0.45 {
		t.Fatalf("score %v: the rounding this test is about did not happen", score)
	}
	if got := upstream.Band(score, 0.5, starter); got != M {
		t.Errorf("starter with 500k ARR at 0.5: %s, want medium", got)
	}
	if got := upstream.Band(0.45-1e-6, 0.5, starter); got != S {
		t.Errorf("a score truly under 0.45 at 0.5: %s, want suspended", got)
	}
	if got := upstream.Band(0.9, math.NaN(), free); got != C {
		t.Errorf("NaN confidence: %s, want the severest band's critical", got)
	}
}

func TestCycleInterval(t *testing.T) {
	for c, want := range map[float64]time.Duration{1: 30 * time.Second, 0.9: 30 * time.Second, 0.5: 30 * time.Second, 0.4999: 10 * time.Second, 0: 10 * time.Second, math.NaN(): 10 * time.Second} {
		if got := upstream.CycleInterval(c); got != want {
			t.Errorf("CycleInterval(%v) = %s, want %s", c, got, want)
		}
	}
}

// step is one cycle of a hysteresis sequence: a target, the class and
// change it gives.
type step struct {
	target, class upstream.Class
	changed       bool
}

func TestClassifierHysteresis(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"first sight takes the target, no change", []step{{M, M, false}, {M, M, false}}},
		{"upgrade at once", []step{{L, L, false}, {H, H, true}, {C, C, true}}},
		{"downgrade on the second cycle", []step{{H, H, false}, {M, H, false}, {M, M, true}, {M, M, false}}},
		{"a cycle at the class resets the count", []step{{H, H, false}, {M, H, false}, {H, H, false}, {M, H, false}, {M, M, true}}},
		{"an upgrade resets the count", []step{{H, H, false}, {S, H, false}, {C, C, true}, {M, C, false}, {M, M, true}}},
		{"to the higher of the two targets", []step{{H, H, false}, {M, H, false}, {S, M, true}, {S, S, true}}},
		{"the higher of the two, the other way", []step{{H, H, false}, {S, H, false}, {M, M, true}, {S, M, false}, {S, S, true}}},
		{"falling all the way", []step{{C, C, false}, {S, C, false}, {S, S, true}, {S, S, false}}},
		{"between the two targets", []step{{C, C, false}, {L, C, false}, {M, M, true}, {H, H, true}}},
	} {
		var c upstream.Classifier
		for i, s := range tc.steps {
			class, changed := c.Step("acme", s.target)
			c.EndCycle()
			if class != s.class || changed != s.changed {
				t.Errorf("%s: cycle %d, target %s: %s changed %v, want %s changed %v", tc.name, i, s.target, class, changed, s.class, s.changed)
				break
			}
		}
	}
}

// TestClassifierTenants: tenants are independent, and one not stepped in a
// cycle is forgotten; a forgotten tenant starts over.
func TestClassifierTenants(t *testing.T) {
	var c upstream.Classifier
	for i := range 1000 {
		c.Step(fmt.Sprintf("t%d", i), H)
	}
	if n := c.EndCycle(); n != 0 || c.Len() != 1000 {
		t.Fatalf("forgot %d of %d, want none", n, c.Len())
	}
	c.Step("t1", S) // t1 holds high, its downgrade pending
	c.Step("t2", C)
	if n := c.EndCycle(); n != 998 || c.Len() != 2 {
		t.Fatalf("forgot %d, holding %d: want 998 forgotten, 2 held", n, c.Len())
	}
	if class, ok := c.Class("t1"); !ok || class != H {
		t.Errorf("t1: %s %v, want high", class, ok)
	}
	if _, ok := c.Class("t3"); ok {
		t.Error("t3 was not forgotten")
	}
	// t3 comes back: first sight again. t1's second cycle below drops it.
	if class, changed := c.Step("t3", S); class != S || changed {
		t.Errorf("t3 again: %s changed %v, want suspended, no change", class, changed)
	}
	if class, changed := c.Step("t1", S); class != S || !changed {
		t.Errorf("t1: %s changed %v, want suspended, changed", class, changed)
	}
	if class, changed := c.Step("t2", C); class != C || changed {
		t.Errorf("t2: %s changed %v, want critical unchanged", class, changed)
	}
	c.EndCycle()
	// A cycle in which nobody is stepped forgets everyone.
	if c.EndCycle(); c.Len() != 0 {
		t.Errorf("%d tenants after an empty cycle, want 0", c.Len())
	}
}

// TestClassifierRestore: a leader taking over keeps the hysteresis of the
// classes it restores.
func TestClassifierRestore(t *testing.T) {
	var c upstream.Classifier
	c.Restore("acme", H)
	if class, changed := c.Step("acme", S); class != H || changed {
		t.Errorf("first cycle below a restored class: %s changed %v, want high held", class, changed)
	}
	c.EndCycle()
	if class, changed := c.Step("acme", S); class != S || !changed {
		t.Errorf("second cycle: %s changed %v, want suspended, changed", class, changed)
	}
	c.Restore("gone", L)
	c.EndCycle()
	c.EndCycle()
	if _, ok := c.Class("gone"); ok {
		t.Error("a restored tenant never stepped was not forgotten")
	}
}
