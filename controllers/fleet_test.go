package controllers

import (
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

func TestRecommend(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rate    float64
		current int32
		target  int64
		want    int32
	}{
		// 10 replicas at 100/s each are sized for 1,000/s: ±10% holds them.
		{"exactly sized", 1000, 10, 100, 10},
		{"9.9% above holds", 1099, 10, 100, 10},
		{"9.9% below holds", 901, 10, 100, 10},
		{"10.1% above scales up", 1101, 10, 100, 12},
		{"10.1% below scales down", 899, 10, 100, 9},
		{"far above", 5000, 10, 100, 50},
		{"far below", 120, 10, 100, 2},
		{"rounds up", 1, 5, 100, 1},
		{"no load", 0, 10, 100, 0},
		// Without replicas there is nothing to hold: the rate alone decides.
		{"from zero replicas", 250, 0, 100, 3},
		{"from zero replicas, no load", 0, 0, 100, 0},
		{"huge rate is capped at MaxInt32", 1e30, 3, 1, math.MaxInt32},
		{"infinite rate is capped at MaxInt32", math.Inf(1), 3, 1, math.MaxInt32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := recommend(tc.rate, tc.current, tc.target); got != tc.want {
				t.Errorf("recommend(%g/s, %d replicas, %d/s each) = %d, want %d", tc.rate, tc.current, tc.target, got, tc.want)
			}
		})
	}
}

// step is one call of scaler.replicas at a time after the test's start.
type step struct {
	at        time.Duration
	current   int32
	rate      float64
	reporting bool
	fleet     policy.Enforcer
	want      int32
}

func TestScalerReplicas(t *testing.T) {
	const delay = time.Minute
	fleet := policy.Enforcer{DeploymentName: "enforcer", MinReplicas: 2, MaxReplicas: 20, TargetRatePerReplica: 1000}
	noTarget := fleet
	noTarget.TargetRatePerReplica = 0
	lowMax := fleet
	lowMax.MaxReplicas = 5
	highMin := fleet
	highMin.MinReplicas = 6
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"within the tolerance the fleet holds", []step{
			{0, 4, 4000, true, fleet, 4},
			{10 * time.Second, 4, 4390, true, fleet, 4},
			{20 * time.Second, 4, 3610, true, fleet, 4},
			{30 * time.Second, 4, 4000, true, fleet, 4},
		}},
		{"scale up at once", []step{
			{0, 4, 4000, true, fleet, 4},
			{time.Second, 4, 9500, true, fleet, 10},
		}},
		{"scale up at once even right after a lower recommendation", []step{
			{0, 8, 8000, true, fleet, 8},
			{time.Second, 8, 3000, true, fleet, 8},
			{2 * time.Second, 8, 12000, true, fleet, 12},
		}},
		{"scale down only once every recommendation of the delay was lower", []step{
			{0, 8, 8000, true, fleet, 8},
			{10 * time.Second, 8, 3000, true, fleet, 8},
			{30 * time.Second, 8, 3000, true, fleet, 8},
			{delay, 8, 3000, true, fleet, 8},               // 8 was recommended exactly one delay ago
			{delay + time.Second, 8, 3000, true, fleet, 3}, // now only 3s in the window
		}},
		{"scale down to the highest recommendation of the delay", []step{
			{0, 10, 10000, true, fleet, 10},
			{10 * time.Second, 10, 6000, true, fleet, 10},
			{20 * time.Second, 10, 3000, true, fleet, 10},
			{delay + 5*time.Second, 10, 3000, true, fleet, 6}, // the 10 left the window, the 6 has not
			{delay + 15*time.Second, 6, 3000, true, fleet, 3},
		}},
		{"a short rise restarts the delay", []step{
			{0, 8, 8000, true, fleet, 8},
			{10 * time.Second, 8, 3000, true, fleet, 8},
			{40 * time.Second, 8, 7600, true, fleet, 8}, // within 10% of 8,000/s
			{50 * time.Second, 8, 3000, true, fleet, 8},
			{40*time.Second + delay, 8, 3000, true, fleet, 8},
			{41*time.Second + delay, 8, 3000, true, fleet, 3},
		}},
		{"clamped to maxReplicas", []step{
			{0, 4, 4000, true, fleet, 4},
			{time.Second, 4, 1e6, true, fleet, 20},
		}},
		{"clamped to minReplicas", []step{
			{0, 2, 2000, true, fleet, 2},
			{time.Second, 2, 10, true, fleet, 2},
			{delay * 2, 2, 0, true, fleet, 2},
		}},
		{"a lowered maxReplicas applies at once", []step{
			{0, 12, 12000, true, fleet, 12},
			{time.Second, 12, 12000, true, lowMax, 5},
		}},
		{"a raised minReplicas applies at once", []step{
			{0, 3, 3000, true, fleet, 3},
			{time.Second, 3, 3000, true, highMin, 6},
		}},
		{"no target: only clamping", []step{
			{0, 7, 1e6, true, noTarget, 7},
			{time.Second, 7, 0, true, noTarget, 7},
			{2 * time.Second, 1, 0, true, noTarget, 2},
			{3 * time.Second, 30, 1e6, true, noTarget, 20},
		}},
		{"no reports: hold", []step{
			{0, 7, 7000, true, fleet, 7},
			{time.Second, 7, 0, false, fleet, 7},
			{2 * delay, 7, 0, false, fleet, 7},
			{3 * delay, 1, 0, false, fleet, 2},
			{4 * delay, 25, 0, false, fleet, 20},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scaler{delay: delay}
			for i, st := range tc.steps {
				got := s.replicas("ns", start.Add(st.at), st.current, st.rate, st.reporting, st.fleet)
				if got != st.want {
					t.Fatalf("step %d (at +%s, %d replicas, %g/s, reporting %t, %+v): %d replicas, want %d",
						i, st.at, st.current, st.rate, st.reporting, st.fleet, got, st.want)
				}
			}
		})
	}
}

// TestScalerKeys checks that fleets do not share a history.
func TestScalerKeys(t *testing.T) {
	fleet := policy.Enforcer{MinReplicas: 1, MaxReplicas: 20, TargetRatePerReplica: 1000}
	s := &scaler{delay: time.Minute}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.replicas("a", start, 8, 8000, true, fleet)
	s.replicas("b", start, 3, 3000, true, fleet)
	// Only b's 3 is in b's window; a's 8, also in the window, is not b's.
	if got := s.replicas("b", start.Add(30*time.Second), 8, 3000, true, fleet); got != 3 {
		t.Errorf("b: %d replicas, want 3 (a's history leaked into b's)", got)
	}
	if got := s.replicas("a", start.Add(30*time.Second), 8, 3000, true, fleet); got != 8 {
		t.Errorf("a: %d replicas, want 8 held for the delay", got)
	}
}

func TestScalerHistoryBounded(t *testing.T) {
	fleet := policy.Enforcer{MinReplicas: 1, MaxReplicas: 100, TargetRatePerReplica: 1000}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const calls = 10_000

	t.Run("equal recommendations merge", func(t *testing.T) {
		s := &scaler{delay: time.Hour}
		// 10,000 calls within one delay, the rate swinging within the
		// tolerance of 10 replicas: every recommendation is 10.
		for i := range calls {
			rate := 9200.0
			if i%2 == 1 {
				rate = 10800
			}
			if got := s.replicas("ns", start.Add(time.Duration(i)*time.Millisecond), 10, rate, true, fleet); got != 10 {
				t.Fatalf("call %d: %d replicas, want 10", i, got)
			}
		}
		if n := len(s.history["ns"]); n != 1 {
			t.Errorf("history holds %d recommendations after %d equal ones; want them merged into 1", n, calls)
		}
	})

	t.Run("alternating recommendations keep only the window's maximum", func(t *testing.T) {
		s := &scaler{delay: time.Hour}
		// Alternating recommendations (12 and 5) within one delay: only
		// the highest and the latest matter, so at most 2 stay.
		for i := range calls {
			rate := 12000.0
			if i%2 == 1 {
				rate = 5000
			}
			if got := s.replicas("ns", start.Add(time.Duration(i)*time.Millisecond), 12, rate, true, fleet); got != 12 {
				t.Fatalf("call %d: %d replicas; a 12 within the delay holds the fleet at 12", i, got)
			}
		}
		if n := len(s.history["ns"]); n > 2 {
			t.Errorf("history holds %d recommendations after %d alternating ones; want at most 2", n, calls)
		}
	})
}

// TestScalerFirstSightHolds: a scaler that has never seen a fleet (after a
// restart or a leader change) does not shrink it at once.
func TestScalerFirstSightHolds(t *testing.T) {
	fleet := policy.Enforcer{MinReplicas: 1, MaxReplicas: 20, TargetRatePerReplica: 1000}
	s := &scaler{delay: time.Minute}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := s.replicas("ns", start, 10, 2000, true, fleet); got != 10 {
		t.Fatalf("first sight of 10 replicas at 2,000/s: %d replicas; want 10 held for the delay", got)
	}
	if got := s.replicas("ns", start.Add(59*time.Second), 10, 2000, true, fleet); got != 10 {
		t.Fatalf("before the delay: %d replicas, want 10", got)
	}
	if got := s.replicas("ns", start.Add(61*time.Second), 10, 2000, true, fleet); got != 2 {
		t.Fatalf("after the delay: %d replicas, want 2", got)
	}
}

func TestScalerForget(t *testing.T) {
	fleet := policy.Enforcer{MinReplicas: 1, MaxReplicas: 20, TargetRatePerReplica: 1000}
	s := &scaler{delay: time.Minute}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.replicas("gone", start, 8, 8000, true, fleet)
	s.replicas("kept", start, 8, 8000, true, fleet)
	s.forget("gone")
	if _, ok := s.history["gone"]; ok {
		t.Errorf("forget left a history: %v", s.history["gone"])
	}
	if len(s.history["kept"]) != 1 {
		t.Errorf("forget of another fleet dropped this one's history: %v", s.history["kept"])
	}
	s.forget("never seen") // no history: nothing to do
	if len(s.history) != 1 {
		t.Errorf("forget of an unknown fleet changed the histories: %v", s.history)
	}
}
