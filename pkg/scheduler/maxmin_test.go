package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

var inf = math.Inf(1)

// checkMaxMinFair reports a violation of the weighted max-min fairness
// property: an item below its cap whose normalized share x/w is smaller than
// that of an item above its (effective) floor. If such a pair existed, moving
// a little allocation from the second to the first would make the allocation
// fairer without breaking any bound, so the allocation would not be max-min
// fair. tol is an absolute tolerance in allocation units; both items are given
// the benefit of the doubt by tol.
//
// It is O(n): a violating pair exists iff the smallest share among items that
// want more is below the largest share among items that could give some up
// (an item cannot violate against itself, since (x+tol)/w > (x−tol)/w).
func checkMaxMinFair(items []Item, out []float64, tol float64) error {
	lowest, lowestIndex := inf, -1
	highest, highestIndex := -inf, -1
	for i, it := range items {
		floor := math.Min(it.Floor, it.Cap)
		if out[i] < it.Cap-tol {
			if share := (out[i] + tol) / it.Weight; share < lowest {
				lowest, lowestIndex = share, i
			}
		}
		if out[i] > floor+tol {
			if share := (out[i] - tol) / it.Weight; share > highest {
				highest, highestIndex = share, i
			}
		}
	}
	if lowestIndex >= 0 && highestIndex >= 0 && lowest < highest {
		low, high := items[lowestIndex], items[highestIndex]
		return fmt.Errorf("not max-min fair: item %d (x=%g w=%g cap=%g) wants more at share %g, "+
			"while item %d (x=%g w=%g floor=%g) is above its floor at larger share %g",
			lowestIndex, out[lowestIndex], low.Weight, low.Cap, out[lowestIndex]/low.Weight,
			highestIndex, out[highestIndex], high.Weight, high.Floor, out[highestIndex]/high.Weight)
	}
	return nil
}

// allocationScale is the size of the quantity being divided, the natural unit
// for absolute rounding tolerances: errors in any one item are a few ulps of
// the total, not of the item.
func allocationScale(capacity float64, items []Item) float64 {
	var sumCaps float64
	for _, it := range items {
		sumCaps += it.Cap
	}
	return math.Min(capacity, sumCaps)
}

// checkAllocation checks everything MaxMin promises about one result, for
// valid items: bounds, the total, the two special regimes and the clamp
// formula with the returned level, and the fairness property.
func checkAllocation(capacity float64, items []Item, out []float64, level, tol float64) error {
	var sumCaps, sumFloors, sumOut float64
	for i, it := range items {
		floor := math.Min(it.Floor, it.Cap)
		sumCaps += it.Cap
		sumFloors += floor
		sumOut += out[i]
		if math.IsNaN(out[i]) {
			return fmt.Errorf("out[%d] is NaN", i)
		}
		if out[i] > it.Cap+tol || out[i] < -tol {
			return fmt.Errorf("out[%d]=%g outside [0, cap=%g]", i, out[i], it.Cap)
		}
	}
	switch {
	case sumCaps <= capacity:
		if !math.IsInf(level, 1) {
			return fmt.Errorf("caps fit (Σcap=%g <= C=%g) but level=%g, want +Inf", sumCaps, capacity, level)
		}
		for i, it := range items {
			if out[i] != it.Cap {
				return fmt.Errorf("caps fit but out[%d]=%g != cap %g", i, out[i], it.Cap)
			}
		}
		return nil
	case sumFloors > capacity:
		if level != 0 {
			return fmt.Errorf("floors do not fit but level=%g, want 0", level)
		}
		for i, it := range items {
			want := math.Min(it.Floor, it.Cap) * (capacity / sumFloors)
			if math.Abs(out[i]-want) > tol {
				return fmt.Errorf("floors do not fit: out[%d]=%g, want scaled floor %g", i, out[i], want)
			}
		}
	default:
		for i, it := range items {
			floor := math.Min(it.Floor, it.Cap)
			if out[i] < floor-tol {
				return fmt.Errorf("out[%d]=%g below floor %g", i, out[i], floor)
			}
			if want := clamp(level*it.Weight, floor, it.Cap); out[i] != want {
				return fmt.Errorf("out[%d]=%g != clamp(level·w, floor, cap)=%g at level %g", i, out[i], want, level)
			}
		}
	}
	if target := math.Min(capacity, sumCaps); math.Abs(sumOut-target) > tol {
		return fmt.Errorf("Σout=%g, want min(C, Σcap)=%g (diff %g, tol %g)", sumOut, target, sumOut-target, tol)
	}
	return checkMaxMinFair(items, out, tol)
}

func TestMaxMinTable(t *testing.T) {
	tests := []struct {
		name      string
		capacity  float64
		items     []Item
		want      []float64
		wantLevel float64
	}{
		{
			name:     "equal weights, two caps bind",
			capacity: 10,
			items:    []Item{{Weight: 1, Cap: 2}, {Weight: 1, Cap: 4}, {Weight: 1, Cap: 10}},
			want:     []float64{2, 4, 4}, wantLevel: 4,
		},
		{
			name:     "weights 1 and 2, unbounded demand",
			capacity: 10,
			items:    []Item{{Weight: 1, Cap: inf}, {Weight: 2, Cap: inf}},
			want:     []float64{10.0 / 3, 20.0 / 3}, wantLevel: 10.0 / 3,
		},
		{
			name:     "weights 1 and 2, light item capped",
			capacity: 10,
			items:    []Item{{Weight: 1, Cap: 2}, {Weight: 2, Cap: inf}},
			want:     []float64{2, 8}, wantLevel: 4,
		},
		{
			name:     "weights 1 and 2, heavy item capped",
			capacity: 10,
			items:    []Item{{Weight: 1, Cap: inf}, {Weight: 2, Cap: 4}},
			want:     []float64{6, 4}, wantLevel: 6,
		},
		{
			name:     "weights 1,2,2, two caps bind",
			capacity: 10,
			items:    []Item{{Weight: 1, Cap: 1}, {Weight: 2, Cap: 3}, {Weight: 2, Cap: 100}},
			want:     []float64{1, 3, 6}, wantLevel: 3,
		},
		{
			name:     "binding floor",
			capacity: 12,
			items:    []Item{{Weight: 1, Floor: 6, Cap: 10}, {Weight: 1, Cap: 10}, {Weight: 1, Cap: 10}},
			want:     []float64{6, 3, 3}, wantLevel: 3,
		},
		{
			name:     "non-binding floor",
			capacity: 12,
			items:    []Item{{Weight: 1, Floor: 2, Cap: 10}, {Weight: 1, Cap: 10}, {Weight: 1, Cap: 10}},
			want:     []float64{4, 4, 4}, wantLevel: 4,
		},
		{
			name:     "binding floor on a light item next to a heavy one",
			capacity: 20,
			items:    []Item{{Weight: 1, Floor: 10, Cap: inf}, {Weight: 3, Cap: inf}},
			want:     []float64{10, 10}, wantLevel: 10.0 / 3,
		},
		{
			name:     "floor above cap counts as cap",
			capacity: 10,
			items:    []Item{{Weight: 1, Floor: 5, Cap: 3}, {Weight: 1, Cap: 10}},
			want:     []float64{3, 7}, wantLevel: 7,
		},
		{
			name:     "zero caps get nothing",
			capacity: 10,
			items:    []Item{{Weight: 1, Cap: 0}, {Weight: 1, Cap: 5}, {Weight: 1, Cap: 20}},
			want:     []float64{0, 5, 5}, wantLevel: 5,
		},
		{
			name:     "sum of caps below capacity",
			capacity: 100,
			items:    []Item{{Weight: 1, Cap: 1}, {Weight: 2, Cap: 2}, {Weight: 3, Cap: 3}},
			want:     []float64{1, 2, 3}, wantLevel: inf,
		},
		{
			name:     "sum of caps equals capacity",
			capacity: 6,
			items:    []Item{{Weight: 1, Cap: 1}, {Weight: 2, Cap: 2}, {Weight: 3, Cap: 3}},
			want:     []float64{1, 2, 3}, wantLevel: inf,
		},
		{
			name:     "capacity zero",
			capacity: 0,
			items:    []Item{{Weight: 1, Cap: 5}, {Weight: 2, Cap: 5}},
			want:     []float64{0, 0}, wantLevel: 0,
		},
		{
			name:     "capacity zero with floors",
			capacity: 0,
			items:    []Item{{Weight: 1, Floor: 1, Cap: 5}, {Weight: 2, Floor: 2, Cap: 5}},
			want:     []float64{0, 0}, wantLevel: 0,
		},
		{
			name:     "one item",
			capacity: 5,
			items:    []Item{{Weight: 2, Cap: 10}},
			want:     []float64{5}, wantLevel: 2.5,
		},
		{
			name:     "floors above capacity are scaled proportionally",
			capacity: 6,
			items:    []Item{{Weight: 1, Floor: 4, Cap: 10}, {Weight: 5, Floor: 8, Cap: 10}},
			want:     []float64{2, 4}, wantLevel: 0,
		},
		{
			name:     "floors exactly use the capacity",
			capacity: 12,
			items:    []Item{{Weight: 1, Floor: 4, Cap: 10}, {Weight: 1, Floor: 8, Cap: 10}},
			want:     []float64{4, 8}, wantLevel: 0,
		},
		{
			// Regression: a walk keeping running sums of the slope added and
			// then subtracted 1e300, losing the unit weights entirely.
			name:     "weights 300 orders of magnitude apart",
			capacity: 5,
			items:    []Item{{Weight: 1e300, Cap: 1e-300}, {Weight: 1, Cap: 10}, {Weight: 1, Cap: 10}},
			want:     []float64{1e-300, 2.5, 2.5}, wantLevel: 2.5,
		},
		{
			name:      "no items",
			capacity:  10,
			items:     nil,
			want:      []float64{},
			wantLevel: inf,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := make([]float64, len(tt.items))
			level := MaxMin(tt.capacity, tt.items, out, new(Scratch))
			for i := range tt.want {
				if math.Abs(out[i]-tt.want[i]) > 1e-12*math.Max(1, math.Abs(tt.want[i])) {
					t.Errorf("out = %v, want %v", out, tt.want)
					break
				}
			}
			if level != tt.wantLevel && math.Abs(level-tt.wantLevel) > 1e-12*math.Abs(tt.wantLevel) {
				t.Errorf("level = %v, want %v", level, tt.wantLevel)
			}
			ref := referenceMaxMin(tt.capacity, tt.items)
			for i := range ref {
				if math.Abs(ref[i]-tt.want[i]) > 1e-12*math.Max(1, math.Abs(tt.want[i])) {
					t.Errorf("reference allocator = %v, want %v (the oracle disagrees with the hand computation)", ref, tt.want)
					break
				}
			}
			if err := checkAllocation(tt.capacity, tt.items, out, level, 1e-12*math.Max(1, tt.capacity)); err != nil {
				t.Error(err)
			}
		})
	}
}

// randomProblem draws a MaxMin problem that stresses the interesting
// regimes: caps spanning six decades around a random scale (and sometimes 0,
// or +Inf in a quarter of the problems), integer and fractional weights, floors absent, sparse or
// everywhere (sometimes above the cap), and a capacity below the floors,
// between floors and caps, at either boundary, or above the caps.
func randomProblem(r *rand.Rand, maxItems int, magnitude float64) (float64, []Item) {
	n := 1 + r.IntN(maxItems)
	items := make([]Item, n)
	floorMode := r.IntN(3)
	allowInfiniteCaps := r.IntN(4) == 0
	var finiteCaps, sumFloors float64
	for i := range items {
		weight := float64(1 + r.IntN(10))
		if r.IntN(2) == 0 {
			weight = 1 + 9*r.Float64()
		}
		var itemCap float64
		switch r.IntN(20) {
		case 0, 1:
			itemCap = 0
		case 2:
			itemCap = inf
			if !allowInfiniteCaps {
				itemCap = magnitude
			}
		default:
			itemCap = magnitude * math.Pow(10, 6*r.Float64()-3)
		}
		var floor float64
		if floorMode == 2 || (floorMode == 1 && r.IntN(3) == 0) {
			if math.IsInf(itemCap, 1) {
				floor = magnitude * r.Float64()
			} else {
				floor = itemCap * 1.5 * r.Float64() // sometimes above the cap
			}
		}
		items[i] = Item{Weight: weight, Floor: floor, Cap: itemCap}
		if !math.IsInf(itemCap, 1) {
			finiteCaps += itemCap
		}
		sumFloors += math.Min(floor, itemCap)
	}
	var capacity float64
	switch r.IntN(8) {
	case 0:
		capacity = 0
	case 1:
		capacity = sumFloors * r.Float64()
	case 2:
		capacity = sumFloors
	case 3:
		capacity = finiteCaps
	case 4:
		capacity = finiteCaps * (1 + r.Float64())
	default:
		capacity = sumFloors + (finiteCaps-sumFloors)*r.Float64()
	}
	return capacity, items
}

func TestMaxMinMatchesReferenceOnRandomProblems(t *testing.T) {
	const cases = 3000
	r := rand.New(rand.NewPCG(1, 2))
	var scratch Scratch
	out := make([]float64, 200)
	regimes := map[string]int{}
	for c := range cases {
		magnitude := math.Pow(10, float64(r.IntN(13)-6))
		capacity, items := randomProblem(r, 200, magnitude)
		level := MaxMin(capacity, items, out, &scratch)
		got := out[:len(items)]
		tol := 1e-9 * allocationScale(capacity, items)

		switch {
		case math.IsInf(level, 1):
			regimes["caps fit"]++
		case level == 0:
			regimes["level 0 (floors bind or capacity 0)"]++
		default:
			regimes["contended"]++
		}

		if err := checkAllocation(capacity, items, got, level, tol); err != nil {
			t.Fatalf("case %d: %v\ncapacity=%v items=%v", c, err, capacity, items)
		}
		want := referenceMaxMin(capacity, items)
		for i := range want {
			if math.Abs(got[i]-want[i]) > tol {
				t.Fatalf("case %d: out[%d]=%v, reference %v (diff %g, tol %g)\ncapacity=%v items=%v",
					c, i, got[i], want[i], got[i]-want[i], tol, capacity, items)
			}
		}
	}
	t.Logf("regimes over %d problems: %v", cases, regimes)
	// The generator must actually reach every regime, or the test proves less
	// than it claims.
	for _, regime := range []string{"caps fit", "level 0 (floors bind or capacity 0)", "contended"} {
		if regimes[regime] < cases/20 {
			t.Errorf("regime %q hit only %d times out of %d: generator too narrow (%v)", regime, regimes[regime], cases, regimes)
		}
	}
}

func TestMaxMinExtremeMagnitudes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var scratch Scratch
	out := make([]float64, 50)
	for _, magnitude := range []float64{1e-200, 1e-30, 1e30, 1e200} {
		for c := range 300 {
			capacity, items := randomProblem(r, 50, magnitude)
			level := MaxMin(capacity, items, out, &scratch)
			got := out[:len(items)]
			tol := 1e-9 * allocationScale(capacity, items)
			if err := checkAllocation(capacity, items, got, level, tol); err != nil {
				t.Fatalf("magnitude %g case %d: %v\ncapacity=%v items=%v", magnitude, c, err, capacity, items)
			}
			want := referenceMaxMin(capacity, items)
			for i := range want {
				if math.Abs(got[i]-want[i]) > tol {
					t.Fatalf("magnitude %g case %d: out[%d]=%v, reference %v", magnitude, c, i, got[i], want[i])
				}
			}
		}
	}

	// One problem mixing twelve decades of caps and weights from 1e-6 to 1e6.
	items := make([]Item, 0, 100)
	for i := range 100 {
		items = append(items, Item{
			Weight: math.Pow(10, float64(i%13)-6),
			Cap:    math.Pow(10, float64(i%22)-9),
			Floor:  math.Pow(10, float64(i%22)-12) * float64(i%2),
		})
	}
	for _, capacity := range []float64{1e-6, 1, 1e3, 1e9, 1e12} {
		got := make([]float64, len(items))
		level := MaxMin(capacity, items, got, &scratch)
		tol := 1e-9 * allocationScale(capacity, items)
		if err := checkAllocation(capacity, items, got, level, tol); err != nil {
			t.Fatalf("mixed magnitudes, capacity %g: %v", capacity, err)
		}
		want := referenceMaxMin(capacity, items)
		for i := range want {
			if math.Abs(got[i]-want[i]) > tol {
				t.Fatalf("mixed magnitudes, capacity %g: out[%d]=%v, reference %v", capacity, i, got[i], want[i])
			}
		}
	}
}

func TestMaxMinRepairsInvalidInput(t *testing.T) {
	nan := math.NaN()
	items := []Item{
		{Weight: nan, Cap: 10},
		{Weight: 0, Cap: 10},
		{Weight: -3, Cap: 10},
		{Weight: inf, Cap: 10},
		{Weight: 1, Floor: nan, Cap: 10},
		{Weight: 1, Floor: -2, Cap: 10},
		{Weight: 1, Floor: inf, Cap: inf},
		{Weight: 1, Cap: nan},
		{Weight: 1, Cap: -4},
		{Weight: 1, Cap: inf},
		{Weight: 1e-300, Cap: 1e300},
		{Weight: 1e300, Cap: 1e-300},
	}
	for _, capacity := range []float64{nan, -5, 0, 1, 25, 1e6, inf} {
		out := make([]float64, len(items))
		level := MaxMin(capacity, items, out, nil)
		if math.IsNaN(level) {
			t.Errorf("capacity %v: level is NaN", capacity)
		}
		sum := 0.0
		for i, x := range out {
			_, floor, itemCap := sanitizeItem(items[i])
			if math.IsNaN(x) || x < 0 || x > itemCap || (x < floor && !(level == 0)) {
				t.Errorf("capacity %v: out[%d]=%v outside [%v, %v]", capacity, i, x, floor, itemCap)
			}
			sum += x
		}
		if effective := math.Max(0, capacity); !math.IsNaN(capacity) && !math.IsInf(capacity, 1) &&
			math.Abs(sum-effective) > 1e-9*math.Max(1, effective) {
			t.Errorf("capacity %v: Σout=%v, want %v (demand is unbounded)", capacity, sum, effective)
		}
		if math.IsNaN(capacity) && sum != 0 {
			t.Errorf("NaN capacity must count as 0, got Σout=%v", sum)
		}
	}

	// A zero weight is repaired to minWeight, not dropped: it still gets a
	// share, just a negligible one.
	out := make([]float64, 2)
	MaxMin(10, []Item{{Weight: 0, Cap: inf}, {Weight: 1, Cap: inf}}, out, nil)
	if want := 10 * minWeight / (1 + minWeight); math.Abs(out[0]-want) > 1e-20 {
		t.Errorf("zero weight got %v, want %v", out[0], want)
	}
}

func TestMaxMinPanicsOnShortOutput(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "len(out)") {
			t.Errorf("recover() = %v, want a panic about len(out)", r)
		}
	}()
	MaxMin(1, []Item{{Weight: 1, Cap: 1}, {Weight: 1, Cap: 1}}, make([]float64, 1), nil)
}

// proportionalToDemand is a plausible but unfair allocator: everyone gets the
// same fraction of what they asked for. It is the negative control showing
// that checkMaxMinFair can fail.
func proportionalToDemand(capacity float64, items []Item, out []float64) {
	var sumCaps float64
	for _, it := range items {
		sumCaps += it.Cap
	}
	for i, it := range items {
		out[i] = it.Cap * math.Min(1, capacity/sumCaps)
	}
}

func TestCheckMaxMinFairRejectsProportionalToDemand(t *testing.T) {
	// Equal weights, demands 2 and 18, capacity 10: proportional gives 1 and
	// 9, which is feasible and sums to the capacity, yet the small claimant
	// is below its demand while the big one holds a 9x larger share. Max-min
	// gives 2 and 8.
	items := []Item{{Weight: 1, Cap: 2}, {Weight: 1, Cap: 18}}
	out := make([]float64, 2)
	proportionalToDemand(10, items, out)
	if out[0] != 1 || out[1] != 9 {
		t.Fatalf("proportional allocation = %v, want [1 9]", out)
	}
	if err := checkMaxMinFair(items, out, 1e-12); err == nil {
		t.Fatal("checkMaxMinFair accepted the proportional-to-demand allocation [1 9]; the fairness check cannot fail")
	} else {
		t.Logf("negative control rejected as expected: %v", err)
	}
	MaxMin(10, items, out, nil)
	if err := checkMaxMinFair(items, out, 1e-12); err != nil || out[0] != 2 || out[1] != 8 {
		t.Fatalf("MaxMin = %v (%v), want [2 8] and fair", out, err)
	}

	// And not just on one hand-picked case: on random contended problems the
	// proportional allocator is almost always caught.
	r := rand.New(rand.NewPCG(5, 6))
	caught, contended := 0, 0
	for range 500 {
		capacity, items := randomProblem(r, 50, 1)
		for i := range items {
			items[i].Floor = 0
		}
		if sumCaps(items) > capacity && capacity > 0 && !hasInfiniteCap(items) {
			contended++
			out := make([]float64, len(items))
			proportionalToDemand(capacity, items, out)
			if checkMaxMinFair(items, out, 1e-9*capacity) != nil {
				caught++
			}
		}
	}
	if contended < 100 || caught < contended*9/10 {
		t.Errorf("proportional allocator caught in %d of %d contended problems, want >= 90%%", caught, contended)
	}
}

func sumCaps(items []Item) float64 {
	var sum float64
	for _, it := range items {
		sum += it.Cap
	}
	return sum
}

func hasInfiniteCap(items []Item) bool {
	for _, it := range items {
		if math.IsInf(it.Cap, 1) {
			return true
		}
	}
	return false
}

func TestMaxMinDoesNotAllocateWithScratch(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	items := make([]Item, 1000)
	for i := range items {
		items[i] = Item{Weight: float64(1 + r.IntN(10)), Floor: float64(r.IntN(3)), Cap: float64(r.IntN(100))}
	}
	out := make([]float64, len(items))
	var scratch Scratch
	MaxMin(20000, items, out, &scratch) // grow the scratch once
	allocs := testing.AllocsPerRun(50, func() {
		MaxMin(20000, items, out, &scratch)
	})
	if allocs != 0 {
		t.Errorf("MaxMin with a warm Scratch allocates %v times per call, want 0", allocs)
	}
}

func benchmarkMaxMin(b *testing.B, n int) {
	r := rand.New(rand.NewPCG(9, uint64(n)))
	items := make([]Item, n)
	var sumCaps float64
	for i := range items {
		items[i] = Item{Weight: float64(1 + r.IntN(10)), Cap: math.Pow(10, 4*r.Float64())}
		if r.IntN(4) == 0 {
			items[i].Floor = items[i].Cap * r.Float64()
		}
		sumCaps += items[i].Cap
	}
	out := make([]float64, n)
	var scratch Scratch
	MaxMin(sumCaps/2, items, out, &scratch) // steady state: the scratch has grown
	b.ReportAllocs()
	for b.Loop() {
		MaxMin(sumCaps/2, items, out, &scratch)
	}
}

func BenchmarkMaxMin1000(b *testing.B) { benchmarkMaxMin(b, 1000) }
func BenchmarkMaxMin5000(b *testing.B) { benchmarkMaxMin(b, 5000) }
