package scheduler

import (
	"math"
	"slices"
)

// Item is one claimant in a max-min allocation problem. Units are the
// caller's (tokens per second).
//
// Invalid fields are treated as caller bugs and repaired rather than
// rejected, so that one bad policy row degrades one claimant instead of
// failing the whole allocation: a Weight that is NaN or <= 0 becomes
// minWeight (1e-9), +Inf becomes maxWeight (1e9); a Floor that is NaN,
// negative or infinite becomes 0; a Cap that is NaN or negative becomes 0
// (+Inf is a legitimate "unbounded demand").
type Item struct {
	Weight float64 // > 0; the claimant's share of capacity above its floor is proportional to it
	Floor  float64 // guaranteed lower bound, 0 <= Floor; an effective floor above Cap is lowered to Cap
	Cap    float64 // upper bound (the claimant's demand, possibly capped by its own limit), Cap >= 0
}

// Scratch holds the buffers MaxMin needs, so that a caller recomputing
// allocations on every control-loop tick does not produce garbage. The zero
// value is ready to use. A Scratch must not be used by two goroutines at once.
type Scratch struct {
	claims []claim
	levels []uint64 // breakpoint levels as float64 bits, see levelBits
}

// claim is an Item after repair: the numbers MaxMin actually computes with.
type claim struct {
	weight, floor, cap float64
}

// Weights outside (0, +Inf) are caller bugs; these are the values they are
// repaired to. Finite positive weights are never changed.
const (
	minWeight = 1e-9
	maxWeight = 1e9
)

func sanitizeWeight(w float64) float64 {
	switch {
	case w > 0 && w <= math.MaxFloat64:
		return w
	case w > math.MaxFloat64: // +Inf
		return maxWeight
	default: // NaN, zero, negative
		return minWeight
	}
}

// sanitizeItem returns the weight, the effective floor min(Floor, Cap) and
// the cap actually used for it. MaxMin and its final pass both derive every
// number from this one function, so breakpoints and classifications are
// computed from bit-identical inputs.
func sanitizeItem(it Item) (weight, floor, capacity float64) {
	weight = sanitizeWeight(it.Weight)
	capacity = it.Cap
	if !(capacity > 0) { // NaN, negative, and -0 (which would break levelBits' ordering)
		capacity = 0
	}
	floor = it.Floor
	if !(floor > 0) || math.IsInf(floor, 1) {
		floor = 0
	}
	floor = min(floor, capacity)
	return weight, floor, capacity
}

func clamp(v, lo, hi float64) float64 {
	if v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}

// MaxMin writes into out the weighted max-min fair allocation of capacity
// among items and returns the water level λ:
//
//	out[i] = clamp(λ·Weight, min(Floor, Cap), Cap)   with   Σ out = min(capacity, Σ Cap)
//
// whenever the floors fit (Σ min(Floor, Cap) <= capacity). The allocation is
// unique; when several λ produce it, the smallest is returned. Two regimes sit
// outside that formula and are part of the contract:
//
//   - If Σ Cap <= capacity, there is nothing to arbitrate: every item gets its
//     Cap and λ is +Inf. (This includes an empty items slice.)
//   - If the floors do not fit, a promise has to be broken, and breaking all
//     of them by the same factor is the only choice that does not favour
//     anyone: out[i] = min(Floor, Cap)·capacity/Σ min(Floor, Cap), and λ is 0.
//
// A capacity that is NaN or negative is treated as 0; +Inf is allowed. Item
// fields are repaired as documented on Item. The result is exact up to
// float64 rounding (the sum is off by a few ulps of the total) as long as no
// intermediate sum overflows.
//
// MaxMin panics if len(out) < len(items): that is a programmer error, not
// input. It runs in O(n log n). With a non-nil scratch it does not allocate
// once the scratch has grown to the problem size; a nil scratch allocates a
// temporary one.
func MaxMin(capacity float64, items []Item, out []float64, scratch *Scratch) (level float64) {
	if len(out) < len(items) {
		panic("scheduler.MaxMin: len(out) < len(items)")
	}
	out = out[:len(items)]
	if !(capacity >= 0) {
		capacity = 0
	}

	var sumCaps, sumFloors float64
	for i := range items {
		_, floor, itemCap := sanitizeItem(items[i])
		sumCaps += itemCap
		sumFloors += floor
	}
	if sumCaps <= capacity {
		for i := range items {
			_, _, out[i] = sanitizeItem(items[i])
		}
		return math.Inf(1)
	}
	if sumFloors > capacity {
		scale := capacity / sumFloors
		for i := range items {
			_, floor, _ := sanitizeItem(items[i])
			out[i] = floor * scale
		}
		return 0
	}

	// From here Σ floor <= capacity < Σ cap, so S(0) <= capacity < S(+Inf)
	// and, S being continuous and nondecreasing, a level with S(λ) = capacity
	// exists. S is linear between consecutive breakpoints (levels at which an
	// item leaves its floor or reaches its cap); find the pair that brackets
	// the solution.
	if scratch == nil {
		scratch = new(Scratch)
	}
	claims := scratch.claims[:0]
	levels := scratch.levels[:0]
	for i := range items {
		weight, floor, itemCap := sanitizeItem(items[i])
		claims = append(claims, claim{weight: weight, floor: floor, cap: itemCap})
		switch {
		case floor == itemCap: // pinned: contributes a constant at every level
		case floor == 0: // rises from level 0, which is where the search starts anyway
			levels = append(levels, levelBits(itemCap/weight))
		default:
			levels = append(levels, levelBits(floor/weight), levelBits(itemCap/weight))
		}
	}
	scratch.claims, scratch.levels = claims, levels
	slices.Sort(levels)

	// Binary search for the first breakpoint where S reaches capacity,
	// evaluating S from scratch each time. A single walk keeping running
	// sums of slope and constant would be O(n) instead of O(n log n) after
	// the sort, but its cancellations lose small weights entirely when a
	// large one enters and leaves the slope (weights 1e300 and 1 in one
	// problem); a sum of nonnegative clamps has no cancellation, and its
	// rounding is monotone in λ, so the search is well defined.
	first, last := 0, len(levels)
	for first < last {
		middle := int(uint(first+last) >> 1)
		if totalAt(claims, math.Float64frombits(levels[middle])) < capacity {
			first = middle + 1
		} else {
			last = middle
		}
	}
	segmentLow, segmentHigh := 0.0, 0.0
	switch {
	case first == len(levels):
		// Only reachable through rounding (S at the last breakpoint is
		// Σ cap > capacity): everything is capped there.
		if first > 0 {
			segmentLow = math.Float64frombits(levels[first-1])
		}
		segmentHigh = segmentLow
	case first > 0:
		segmentLow, segmentHigh = math.Float64frombits(levels[first-1]), math.Float64frombits(levels[first])
	default:
		segmentHigh = math.Float64frombits(levels[0])
	}

	// No breakpoint lies strictly inside the segment, so on all of it every
	// item is pinned, capped, floored or rising: S is exactly
	// fixed + slope·λ there. Solve that line.
	var fixed, slope float64
	for _, c := range claims {
		switch {
		case c.floor == c.cap:
			fixed += c.cap
		case c.cap/c.weight <= segmentLow:
			fixed += c.cap
		case c.floor/c.weight >= segmentHigh:
			fixed += c.floor
		default:
			slope += c.weight
		}
	}
	level = segmentLow
	if slope > 0 {
		level = clamp((capacity-fixed)/slope, segmentLow, segmentHigh)
	}
	if math.IsNaN(level) {
		level = segmentLow
	}
	for i, c := range claims {
		out[i] = clamp(level*c.weight, c.floor, c.cap)
	}
	return level
}

// levelBits encodes a breakpoint level for sorting. Levels are never
// negative, -0 or NaN (weights are positive, floors and caps are +0 or
// positive, possibly +Inf), and for such values IEEE 754 bit patterns compare
// as unsigned integers exactly as the numbers do. Sorting integers avoids the
// NaN handling of float comparison, which is most of the cost of the sort,
// which in turn dominates MaxMin (about 20% faster overall, measured).
func levelBits(level float64) uint64 { return math.Float64bits(level) }

// totalAt is S(λ) = Σ clamp(λ·wᵢ, floorᵢ, capᵢ), the total allocated at
// water level λ.
func totalAt(claims []claim, level float64) float64 {
	var total float64
	for _, c := range claims {
		total += clamp(level*c.weight, c.floor, c.cap)
	}
	return total
}
