package upstream

import (
	"math"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestAllocateContended(t *testing.T) {
	var out [NumClasses]float64
	var scratch scheduler.Scratch
	demand := [NumClasses]float64{Suspended: 500, Low: 200, Medium: 200, High: 200, Critical: 50}
	// 600/s nominal at confidence 0.4: 240/s. Critical reserved 60 (more
	// than its measured 50: a reservation); 180 by weight 0.6/0.3/0.1.
	Allocate(240, 60, demand, Degraded.Fractions(), &out, &scratch)
	want := [NumClasses]float64{Suspended: 0, Low: 18, Medium: 54, High: 108, Critical: 60}
	if out != want {
		for c := range Class(NumClasses) {
			if !near(out[c], want[c]) {
				t.Errorf("%s: got %.3f, want %.3f", c, out[c], want[c])
			}
		}
	}
	// Phase 1 holds medium and low back: high takes what they leave.
	Allocate(240, 60, demand, Phase1.Fractions(), &out, &scratch)
	if !near(out[High], 180) || out[Medium] != 0 || out[Low] != 0 || !near(out[Critical], 60) {
		t.Errorf("phase 1: %v, want critical 60, high 180, medium and low 0", out)
	}
	// Phase 2: medium at half its demand (100), high the rest.
	Allocate(240, 60, demand, Phase2.Fractions(), &out, &scratch)
	if !near(out[Medium], 60) || !near(out[High], 120) {
		t.Errorf("phase 2: %v, want medium 60 (0.3 of 180 by weight, under its cap 100), high 120", out)
	}
}

func TestAllocateSpareGoesToOpenClasses(t *testing.T) {
	var out [NumClasses]float64
	demand := [NumClasses]float64{Low: 10, Medium: 10, High: 10, Critical: 0}
	Allocate(1000, 100, demand, Phase3.Fractions(), &out, nil)
	// Low is held back to a quarter of its demand; critical has no demand,
	// so nothing is reserved; the 977.5 left go to critical, high and
	// medium by weight 1 : 0.6 : 0.3.
	if !near(out[Low], 2.5) {
		t.Errorf("low %.3f, want 2.5 (25%% of 10)", out[Low])
	}
	spare := 1000 - 22.5
	if !near(out[High], 10+spare*0.6/1.9) || !near(out[Critical], spare*1/1.9) {
		t.Errorf("high %.3f critical %.3f, want %.3f and %.3f", out[High], out[Critical], 10+spare*0.6/1.9, spare/1.9)
	}
	var sum float64
	for _, v := range out {
		sum += v
	}
	if !near(sum, 1000) {
		t.Errorf("allocations add up to %.3f, want the capacity 1000", sum)
	}
	Allocate(0, 100, demand, Phase3.Fractions(), &out, nil)
	if out != ([NumClasses]float64{}) {
		t.Errorf("no capacity: %v, want nothing", out)
	}
}

func TestAllocateReserveAboveCapacity(t *testing.T) {
	var out [NumClasses]float64
	demand := [NumClasses]float64{High: 100, Critical: 500}
	Allocate(100, 400, demand, Degraded.Fractions(), &out, nil)
	if !near(out[Critical], 100) || out[High] > 1e-9 {
		t.Errorf("%v: critical's reserve takes the whole capacity", out)
	}
}

func TestPartAddsUpToOne(t *testing.T) {
	for _, c := range []struct {
		nodes  []float64
		fleet  float64
		expect []float64
	}{
		{[]float64{30, 10, 0, 0}, 40, nil},
		{[]float64{0, 0}, 0, []float64{0.5, 0.5}},
		{[]float64{100}, 100, []float64{1}},
	} {
		var sum float64
		for i, d := range c.nodes {
			p := Part(d, c.fleet, len(c.nodes))
			sum += p
			if c.expect != nil && !near(p, c.expect[i]) {
				t.Errorf("Part(%v, %v, %d) = %v, want %v", d, c.fleet, len(c.nodes), p, c.expect[i])
			}
		}
		if !near(sum, 1) {
			t.Errorf("parts of %v add up to %v", c.nodes, sum)
		}
	}
	if p := Part(30, 40, 4); !near(p, 0.99*0.75+0.01/4) {
		t.Errorf("Part(30, 40, 4) = %v", p)
	}
}
