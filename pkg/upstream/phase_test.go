package upstream_test

import (
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/upstream"
)

const (
	healthy  = upstream.Healthy
	degraded = upstream.Degraded
	phase1   = upstream.Phase1
	phase2   = upstream.Phase2
	phase3   = upstream.Phase3
)

func TestPhaseFor(t *testing.T) {
	for c, want := range map[float64]upstream.Phase{
		0: phase1, 0.4: phase1, 0.6999: phase1, 0.7: phase2, 0.8499: phase2, 0.85: phase3, 0.95: phase3, 1: phase3, math.NaN(): phase1,
	} {
		if got := upstream.PhaseFor(c); got != want {
			t.Errorf("PhaseFor(%v) = %s, want %s", c, got, want)
		}
	}
}

// change is a phase change at a time since t0.
type change struct {
	at    time.Duration
	phase upstream.Phase
}

// run steps p from t0 for d, one cycle per CycleInterval of the cycle's
// confidence (as the leader does), and returns the changes.
func run(t *testing.T, p *upstream.Phases, start, d time.Duration, confidence func(at time.Duration) float64) (changes []change, end time.Duration) {
	t.Helper()
	at := start
	for ; at < start+d; at += upstream.CycleInterval(confidence(at)) {
		phase, changed := p.Step(t0.Add(at), confidence(at))
		if changed {
			changes = append(changes, change{at, phase})
			if !p.Since().Equal(t0.Add(at)) {
				t.Errorf("at %s: since %v, want the change's time", at, p.Since().Sub(t0))
			}
		}
		if phase != p.Phase() {
			t.Errorf("at %s: Step said %s, Phase %s", at, phase, p.Phase())
		}
	}
	return changes, at
}

func equalChanges(a, b []change) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPhasesOutage: a 5-minute outage at confidence 0.4 from 0:30, then
// full recovery. Cycles are 10 s while below 0.5, 30 s above.
func TestPhasesOutage(t *testing.T) {
	var p upstream.Phases
	conf := func(at time.Duration) float64 {
		if at >= 30*time.Second && at < 330*time.Second {
			return 0.4
		}
		return 1
	}
	got, _ := run(t, &p, 0, 10*time.Minute, conf)
	want := []change{
		{30 * time.Second, degraded}, // the first cycle below 0.9
		{40 * time.Second, phase1},   // the second, 10 s later
		{330 * time.Second, phase2},  // recovery: one step per cycle
		{360 * time.Second, phase3},
		{450 * time.Second, healthy}, // 2 minutes at ≥ 0.95 from 5:30
	}
	if !equalChanges(got, want) {
		t.Errorf("changes %v, want %v", got, want)
	}
}

// TestPhasesFlapping: a confidence alternating 0.55 and 0.95 every cycle
// settles; it does not flap the phase.
func TestPhasesFlapping(t *testing.T) {
	var p upstream.Phases
	cycle := 0
	alternate := func(time.Duration) float64 {
		if cycle%2 == 0 {
			return 0.55
		}
		return 0.95
	}
	var changes []change
	at := time.Duration(0)
	for ; cycle < 40; cycle++ {
		if phase, changed := p.Step(t0.Add(at), alternate(at)); changed {
			changes = append(changes, change{at, phase})
		}
		at += 30 * time.Second
	}
	// One blip back to healthy, then the second settles in phase 3.
	want := []change{{0, degraded}, {30 * time.Second, healthy}, {60 * time.Second, degraded}, {90 * time.Second, phase3}}
	if !equalChanges(changes, want) {
		t.Errorf("changes %v, want %v", changes, want)
	}
	// When it stops flapping, phase 3 recovers 2 minutes after the last
	// cycle at 0.95 (the 40th, 30 s before).
	got, _ := run(t, &p, at, 5*time.Minute, func(time.Duration) float64 { return 0.97 })
	if want := []change{{at - 30*time.Second + 2*time.Minute, healthy}}; !equalChanges(got, want) {
		t.Errorf("after the flapping: %v, want %v", got, want)
	}

	// Flapping while in phase 1 climbs to phase 3 and stays there.
	var q upstream.Phases
	q.Restore(phase1, t0)
	changes = nil
	for i := range 40 {
		c := 0.55
		if i%2 == 0 {
			c = 0.95
		}
		if phase, changed := q.Step(t0.Add(time.Duration(i)*30*time.Second), c); changed {
			changes = append(changes, change{time.Duration(i) * 30 * time.Second, phase})
		}
	}
	if want := []change{{0, phase2}, {60 * time.Second, phase3}}; !equalChanges(changes, want) {
		t.Errorf("flapping in phase 1: %v, want %v", changes, want)
	}
}

// TestPhasesSustain: phase 3 goes healthy after 2 minutes of cycles at ≥
// 0.95; a dip at 1:59 restarts the 2 minutes.
func TestPhasesSustain(t *testing.T) {
	for _, tc := range []struct {
		name string
		dip  time.Duration // a cycle at 0.93 at this time; 0 none
		want time.Duration
	}{
		{"no dip", 0, 2 * time.Minute},
		{"a dip at 1:59", 119 * time.Second, 120*time.Second + 2*time.Minute}, // from the cycle after it
		{"a dip at 0:10", 10 * time.Second, 20*time.Second + 2*time.Minute},
	} {
		var p upstream.Phases
		p.Restore(phase3, t0.Add(-time.Hour))
		var healthyAt time.Duration
		cycles := []time.Duration{}
		for at := time.Duration(0); at <= 6*time.Minute; at += 10 * time.Second {
			cycles = append(cycles, at)
			if tc.dip != 0 && at < tc.dip && at+10*time.Second > tc.dip {
				cycles = append(cycles, tc.dip)
			}
		}
		for _, at := range cycles {
			c := 0.97
			if at == tc.dip && tc.dip != 0 {
				c = 0.93
			}
			if phase, changed := p.Step(t0.Add(at), c); changed {
				if phase != healthy || healthyAt != 0 {
					t.Errorf("%s: %s at %s, want only healthy", tc.name, phase, at)
				}
				healthyAt = at
			}
		}
		if healthyAt != tc.want {
			t.Errorf("%s: healthy at %s, want %s", tc.name, healthyAt, tc.want)
		}
	}
}

// TestPhasesSteps: the machine's rules cycle by cycle.
func TestPhasesSteps(t *testing.T) {
	type cycle struct {
		c    float64
		want upstream.Phase
	}
	for _, tc := range []struct {
		name   string
		start  upstream.Phase
		cycles []cycle
	}{
		{"healthy holds at 0.9", healthy, []cycle{{0.9, healthy}, {1, healthy}}},
		{"a blip", healthy, []cycle{{0.8999, degraded}, {0.9, healthy}}},
		{"degraded to its phase", healthy, []cycle{{0.5, degraded}, {0.8, phase2}}},
		{"degraded to phase 3", healthy, []cycle{{0.1, degraded}, {0.88, phase3}}},
		{"a fall needs two cycles", phase3, []cycle{{0.6, phase3}, {0.6, phase1}}},
		{"to the second cycle's phase", phase3, []cycle{{0.6, phase3}, {0.8, phase2}}},
		{"an interrupted fall", phase3, []cycle{{0.6, phase3}, {0.9, phase3}, {0.6, phase3}, {0.6, phase1}}},
		{"a rise interrupts a fall", phase2, []cycle{{0.5, phase2}, {0.9, phase3}, {0.5, phase3}, {0.5, phase1}}},
		{"one step up per cycle", phase1, []cycle{{0.99, phase2}, {0.99, phase3}, {0.99, phase3}}},
		{"phase 3 holds below 0.95", phase3, []cycle{{0.94, phase3}, {0.94, phase3}, {0.94, phase3}, {0.94, phase3}, {0.94, phase3}, {0.94, phase3}}},
		{"phase 1 is the floor", phase1, []cycle{{0, phase1}, {0, phase1}, {0, phase1}}},
	} {
		var p upstream.Phases
		p.Restore(tc.start, t0)
		for i, c := range tc.cycles {
			if got, _ := p.Step(t0.Add(time.Duration(i+1)*30*time.Second), c.c); got != c.want {
				t.Errorf("%s: cycle %d at %v: %s, want %s", tc.name, i, c.c, got, c.want)
				break
			}
		}
	}
}

// TestPhasesBlips: a blip every few minutes is a blip each time; two
// within 2 minutes are an outage.
func TestPhasesBlips(t *testing.T) {
	var p upstream.Phases
	steps := []struct {
		at   time.Duration
		c    float64
		want upstream.Phase
	}{
		{0, 0.8, degraded}, {30 * time.Second, 0.95, healthy},
		{150 * time.Second, 0.8, degraded}, {180 * time.Second, 0.95, healthy}, // 2:30 after the last: a blip again
		{270 * time.Second, 0.8, degraded}, {300 * time.Second, 0.95, healthy}, // 2:00 after: still a blip
		{380 * time.Second, 0.8, degraded}, {410 * time.Second, 0.95, phase3}, // 1:50 after: the second
	}
	for _, s := range steps {
		if got, _ := p.Step(t0.Add(s.at), s.c); got != s.want {
			t.Errorf("at %s, %v: %s, want %s", s.at, s.c, got, s.want)
		}
	}
}

func TestPhasesZeroAndRestore(t *testing.T) {
	var p upstream.Phases
	if p.Phase() != healthy || !p.Since().IsZero() {
		t.Errorf("zero: %s since %v, want healthy since zero", p.Phase(), p.Since())
	}
	p.Restore(phase2, t0)
	if p.Phase() != phase2 || !p.Since().Equal(t0) {
		t.Errorf("restored: %s since %v, want phase 2 since %v", p.Phase(), p.Since(), t0)
	}
	p.Restore(upstream.NumPhases+3, t0)
	if p.Phase() != healthy {
		t.Errorf("restored out of range: %s, want healthy", p.Phase())
	}
	// A clock going backwards restarts the sustain, and nothing breaks.
	p.Restore(phase3, t0)
	p.Step(t0.Add(time.Minute), 1)
	p.Step(t0, 1)
	if got, _ := p.Step(t0.Add(119*time.Second), 1); got != phase3 {
		t.Errorf("after the clock went back: %s at 1:59 from the restart, want phase 3", got)
	}
	if got, _ := p.Step(t0.Add(2*time.Minute), 1); got != healthy {
		t.Errorf("%s at 2:00 from the restart, want healthy", got)
	}
	if got, changed := p.Step(t0.Add(3*time.Minute), math.NaN()); got != degraded || !changed {
		t.Errorf("NaN confidence: %s, want degraded (NaN counts as 0)", got)
	}
}
