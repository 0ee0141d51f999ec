package enforcer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/fairref"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

// TestClaimCurvesFindTheFleetsShares: tenants of three tiers (weights 8, 4,
// 1, floors 40/10/0% as experiment 5's plane) with Zipf demands pinned to
// 20 nodes, each node binning its own into curves; the curves summed as
// reconcile.lua sums them give each node a claim (its tenants at the
// fleet's levels) within 3% of the sum of its tenants' fair shares by
// pkg/fairref, in both definitions, and each tier's within 3% of its
// share. The negative control: one level over all the tenants without the
// floors (what reconcile.lua computed before) misses the tiers' shares by
// more than 10%.
func TestClaimCurvesFindTheFleetsShares(t *testing.T) {
	const nodes, tenants, capacity = 20, 20000, 20000.0
	weights := []int64{8, 4, 1}
	floorPercents := []float64{40, 10, 0}
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.2, 1, tenants*10)
	type tenant struct {
		tier, node int
		demand     float64
	}
	ts := make([]tenant, tenants)
	for i := range ts {
		tier := 2
		if r := rng.IntN(100); r < 1 {
			tier = 0
		} else if r < 20 {
			tier = 1
		}
		ts[i] = tenant{tier: tier, node: i % nodes, demand: 4 * float64(zipf.Uint64()+1)}
	}
	for _, byTenant := range []bool{true, false} {
		snap := &snapshot{shareByTenant: byTenant, globalPerSec: capacity, tierWeights: weights}
		tiers := make([]fairref.Tier, 3)
		for k := range tiers {
			snap.floors = append(snap.floors, capacity*floorPercents[k]/100)
			tiers[k] = fairref.Tier{Weight: float64(weights[k]), FloorPerSec: snap.floors[k]}
		}
		ref := make([]fairref.Tenant, len(ts))
		bins := make([]claimBins, nodes)
		for n := range bins {
			bins[n].reset(capacity, 3)
		}
		for i, tn := range ts {
			w := float64(weights[tn.tier])
			ref[i] = fairref.Tenant{Tier: tn.tier, Weight: w, CapPerSec: tn.demand}
			bins[tn.node].add(tn.tier, tn.demand, w)
		}
		shares, tierShares := fairref.Shares(byTenant, capacity, tiers, ref)
		fleet := make(claimCurves, 3)
		for n := range bins {
			for k, c := range bins[n].curves() {
				for g := range c {
					fleet[k][g] += c[g]
				}
			}
		}
		grid := &bins[0].grid
		levels := fleet.levels(snap, grid, capacity, &scheduler.Scratch{})
		fair := make([]float64, nodes)
		for i, tn := range ts {
			fair[tn.node] += shares[i]
		}
		var worst float64
		for n := range bins {
			worst = max(worst, math.Abs(bins[n].curves().claim(grid, &levels)/fair[n]-1))
		}
		if worst > 0.03 {
			t.Errorf("shareBy tenant %v: a node's claim is %.1f%% off its tenants' fair shares, want within 3%%", byTenant, 100*worst)
		}
		tierOff := func(levels [policy.MaxTiers]float64) (off float64) {
			for k := range 3 {
				off = max(off, math.Abs(fleet[k].at(grid, levels[k])/tierShares[k]-1))
			}
			return off
		}
		if off := tierOff(levels); off > 0.03 {
			t.Errorf("shareBy tenant %v: a tier's claims at its level are %.1f%% off its share, want within 3%%", byTenant, 100*off)
		}
		// The control: one level over all the tenants, without the floors
		// (the level reconcile.lua computed before), or the other
		// definition's.
		snap.floors = []float64{0, 0, 0}
		snap.shareByTenant = true
		if off := tierOff(fleet.levels(snap, grid, capacity, &scheduler.Scratch{})); off < 0.1 {
			t.Errorf("shareBy tenant %v: one level without the floors is only %.1f%% off the tiers' shares: the test cannot tell", byTenant, 100*off)
		}
	}
}

// TestClaimCurveIsExactAtTheGrid: a node's curve is Σ min(d, λ·w) at every
// level of the grid, and parses back from the bytes reconcile.lua sums.
func TestClaimCurveIsExactAtTheGrid(t *testing.T) {
	var b claimBins
	b.reset(1000, 2)
	rng := rand.New(rand.NewPCG(3, 4))
	type tenant struct {
		tier      int
		demand, w float64
	}
	var ts []tenant
	for range 500 {
		tn := tenant{tier: rng.IntN(2), demand: math.Exp(rng.Float64()*20 - 8), w: float64(1 + rng.IntN(8))}
		ts = append(ts, tn)
		b.add(tn.tier, tn.demand, tn.w)
	}
	cs := b.curves()
	for k := range cs {
		for g, level := range b.grid {
			var want float64
			for _, tn := range ts {
				if tn.tier == k {
					want += min(tn.demand, level*tn.w)
				}
			}
			if math.Abs(cs[k][g]-want) > 1e-9*max(want, 1) {
				t.Fatalf("tier %d at level %g: curve %g, want %g", k, level, cs[k][g], want)
			}
		}
	}
	back, ok := parseClaimCurves(string(cs.bytes()), 2)
	if !ok || back[1] != cs[1] || back[0] != cs[0] {
		t.Fatal("the curves do not read back from their bytes")
	}
}
