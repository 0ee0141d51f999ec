package enforcer

import (
	"encoding/binary"
	"math"

	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

// A claim curve is what a local-reconciled node's tenants of one tier claim
// of the plane as a function of the tier's water level λ (tokens/s per unit
// of weight): c(λ) = Σ min(d, λ·w·p) over the tier's tenants with demand
// here, d its demand here, w its weight and p the part of its fleet-wide
// demand that is here (tenantState.part). Summed over the live nodes
// (reconcile.lua), a tier's curves are the fleet's claims in that tier at
// every level, from which each node finds the fleet's levels as the tick
// finds a node's (shareBy tenant: one level raised to the tiers' floors;
// shareBy tier: the tiers' shares by weight, then a level per tier). The
// node claims the plane by its own curves at those levels, smoothed as its
// demand is (reconciler.fair), and, where its tenants are pinned rather
// than spread over every node, its fairness tick paces them at those
// levels (fleetView, fairness.allocate).
//
// Why every tenant and not only the busiest the fleet reports one by one:
// with tenants pinned to 100 nodes, a node's hundreds of small tenants are
// most of its demand and none of its busiest, and the floors move the
// levels. Counted from the busiest alone and without floors, the level
// came out half as high again as the reference's, a node claimed its
// whole demand less only its busiest tenants' excess, and nodes holding
// many tenants above their shares got more of the plane than those
// shares: 19.7% off at the median node, free +22.5%, enterprise −19.6%;
// with the curves 2.2%, +4.5% and −8.2%, and with the tick pacing at the
// fleet's levels 1.9%, −1.5% and −1.4% (100 nodes, 100,000 tenants:
// docs/scale.md, the simulation). And why the claim is the curves' and
// not the node's measured demand less the excess: the two are measured
// apart, and a claim that jitters by their difference installs new
// shares (each O(tenants) on the node) every other reconcile.
//
// A curve is sampled at claimPoints levels spaced evenly in log from
// claimLow to claimHigh times the global rate (a step of 1.39) and
// interpolated linearly between them; a tenant is binned by the level at
// which it stops growing (d / (w·p)), so a node builds its curves in one
// pass over its tenants whatever their number.
const (
	claimPoints = lua.ClaimPoints
	claimLow    = 1e-7 // of the global rate per second
	claimHigh   = 1e2
)

// claimGrid is the levels curves are sampled at, for a plane whose global
// rate is rate tokens/s.
type claimGrid [claimPoints]float64

func newClaimGrid(rate float64) (g claimGrid) {
	for i := range g {
		g[i] = rate * claimLow * math.Pow(claimHigh/claimLow, float64(i)/(claimPoints-1))
	}
	return g
}

// claimCurve is one tier's claim at the grid's levels.
type claimCurve [claimPoints]float64

// claimBins accumulates a node's tenants into its curves: per tier rank,
// ends[k] is the demand of the tenants that stop growing above level k-1
// and at or below level k, and slopes[k] their weight (w·p); index
// claimPoints holds those that grow past the grid.
type claimBins struct {
	grid   claimGrid
	tiers  int
	ends   [policy.MaxTiers][claimPoints + 1]float64
	slopes [policy.MaxTiers][claimPoints + 1]float64
}

func (b *claimBins) reset(rate float64, tiers int) {
	b.grid, b.tiers = newClaimGrid(rate), tiers
	clear(b.ends[:])
	clear(b.slopes[:])
}

// add counts a tenant of tier rank, demand d and weight w·p.
func (b *claimBins) add(rank int, d, wp float64) {
	if d <= 0 || wp <= 0 || b.grid[0] <= 0 || rank < 0 || rank >= b.tiers {
		return
	}
	stop := d / wp
	k := 0
	if stop > b.grid[0] {
		// the first level at or above stop: from the log, then exact
		k = min(claimPoints, int(math.Log(stop/b.grid[0])/math.Log(claimHigh/claimLow)*(claimPoints-1)))
		for k > 0 && b.grid[k-1] >= stop {
			k--
		}
		for k < claimPoints && b.grid[k] < stop {
			k++
		}
	}
	b.ends[rank][k] += d
	b.slopes[rank][k] += wp
}

// curves are the node's claims per tier at each level: the demand of the
// tenants stopped by then and the growing ones' weight times the level.
func (b *claimBins) curves() claimCurves {
	cs := make(claimCurves, b.tiers)
	for t := range cs {
		var slope, ended float64
		for _, s := range b.slopes[t] {
			slope += s
		}
		for g, level := range b.grid {
			ended += b.ends[t][g]
			slope -= b.slopes[t][g]
			cs[t][g] = ended + max(slope, 0)*level
		}
	}
	return cs
}

// claimCurves are curves per tier rank.
type claimCurves []claimCurve

// at is the curve at level: linear between the grid's levels, from 0
// below the first, its last value above the last (+Inf included).
func (c *claimCurve) at(grid *claimGrid, level float64) float64 {
	lo, clo := 0.0, 0.0
	for g, hi := range grid {
		if level <= hi {
			return clo + (c[g]-clo)*(level-lo)/(hi-lo)
		}
		lo, clo = hi, c[g]
	}
	return c[claimPoints-1]
}

// water is the level at which the curve meets x, +Inf when it does not
// within the grid (the tier's claims fit in x).
func (c *claimCurve) water(grid *claimGrid, x float64) float64 {
	lo, clo := 0.0, 0.0
	for g, hi := range grid {
		if c[g] > x {
			return lo + (hi-lo)*(x-clo)/(c[g]-clo)
		}
		lo, clo = hi, c[g]
	}
	return math.Inf(1)
}

// top is what the tier claims in full.
func (c *claimCurve) top() float64 { return c[claimPoints-1] }

// levels are the fleet's water levels per tier rank for these (the
// fleet's) curves and capacity tokens/s, as the fairness tick's
// allocation finds them (levelsByTenant, levelsByTier); +Inf for a tier
// whose claims fit.
func (cs claimCurves) levels(snap *snapshot, grid *claimGrid, capacity float64, scratch *scheduler.Scratch) (levels [policy.MaxTiers]float64) {
	for k := range levels {
		levels[k] = math.Inf(1)
	}
	var floors [policy.MaxTiers]float64
	var total, floorSum float64
	for k := range cs {
		if k < len(snap.floors) && snap.globalPerSec > 0 {
			floors[k] = min(snap.floor(k, capacity), cs[k].top())
		}
		total += cs[k].top()
		floorSum += floors[k]
	}
	if total <= capacity {
		return levels
	}
	if !snap.shareByTenant {
		items := make([]scheduler.Item, len(cs))
		for k := range cs {
			items[k] = scheduler.Item{Weight: float64(snap.tierWeights[k]), Floor: floors[k], Cap: cs[k].top()}
		}
		shares := make([]float64, len(cs))
		scheduler.MaxMin(capacity, items, shares, scratch)
		for k := range cs {
			levels[k] = cs[k].water(grid, shares[k])
		}
		return levels
	}
	if floorSum > capacity {
		for k := range cs {
			floors[k] *= capacity / floorSum
		}
		floorSum = capacity
	}
	// One level λ with every tier at max(its floor, its claims at λ); a
	// tier below its floor there has its floor shared at its own level.
	claimAt := func(g int) (x float64) {
		for k := range cs {
			x += max(floors[k], cs[k][g])
		}
		return x
	}
	lo, xlo, level := 0.0, floorSum, math.Inf(1)
	for g, hi := range grid {
		if x := claimAt(g); x > capacity {
			level = lo + (hi-lo)*(capacity-xlo)/(x-xlo)
			break
		} else {
			lo, xlo = hi, x
		}
	}
	for k := range cs {
		levels[k] = level
		if cs[k].at(grid, level) < floors[k] {
			levels[k] = cs[k].water(grid, floors[k])
		}
	}
	return levels
}

// claim is what the curves (a node's) claim at levels.
func (cs claimCurves) claim(grid *claimGrid, levels *[policy.MaxTiers]float64) (x float64) {
	for k := range cs {
		x += cs[k].at(grid, levels[k])
	}
	return x
}

// bytes are the curves as reconcile.lua takes them: claimPoints
// little-endian float64 per tier rank, in rank order.
func (cs claimCurves) bytes() []byte {
	b := make([]byte, 0, 8*claimPoints*len(cs))
	for _, c := range cs {
		for _, v := range c {
			b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
		}
	}
	return b
}

// parseClaimCurves reads the curves of tiers tiers reconcile.lua returned;
// false when v is not that.
func parseClaimCurves(v any, tiers int) (claimCurves, bool) {
	s, _ := v.(string)
	if tiers == 0 || len(s) != 8*claimPoints*tiers {
		return nil, false
	}
	b := []byte(s)
	cs := make(claimCurves, tiers)
	for k := range cs {
		for g := range cs[k] {
			cs[k][g] = math.Float64frombits(binary.LittleEndian.Uint64(b[8*(k*claimPoints+g):]))
		}
	}
	return cs, true
}
