// Package fairref is the reference for quotaplane's fairness: each tenant's
// weighted max-min fair share of a contended global rate, computed from the
// definitions the deliberately naive way (bisection on the water level),
// without pkg/scheduler or pkg/enforcer, so that tests and experiments can
// check the engine against it (as Kubernetes API Priority and Fairness
// checks its allocator against a naive one).
//
// Two definitions, a plane's shareBy:
//
//   - ByTier: the capacity is shared among tiers by weighted max-min, every
//     tier getting at least its floor as far as its tenants' claims reach,
//     then each tier's share among its tenants by weighted max-min.
//   - ByTenant (seed 002): one weighted max-min over all the tenants at a
//     water level λ, each tier raised to its floor where its tenants get
//     less: tier k gets max(F_k, Σ_{i in k} min(λ·w_i, c_i)), λ the level
//     at which the tiers add up to the capacity; a tier at its floor shares
//     it among its tenants by weighted max-min.
//
// In both a floor is at most the tier's claims, and floors that add up to
// more than the capacity are all scaled by the same factor.
package fairref

import "math"

// Tier is one tier: its weight and its floor (tokens per second).
type Tier struct {
	Weight      float64
	FloorPerSec float64
}

// Tenant is one claimant: its tier (an index into the tiers), its weight,
// and its claim: the most it can use, min(its demand, its own limit),
// tokens per second.
type Tenant struct {
	Tier      int
	Weight    float64
	CapPerSec float64
}

// Shares returns each tenant's fair share and each tier's total by the
// definition byTenant selects (ByTenant, else ByTier).
func Shares(byTenant bool, capacity float64, tiers []Tier, tenants []Tenant) (shares, tierShares []float64) {
	if byTenant {
		return ByTenant(capacity, tiers, tenants)
	}
	return ByTier(capacity, tiers, tenants)
}

// ByTier is the hierarchical definition: tiers first, then tenants.
func ByTier(capacity float64, tiers []Tier, tenants []Tenant) (shares, tierShares []float64) {
	claims := tierClaims(tiers, tenants)
	weights, floors := make([]float64, len(tiers)), make([]float64, len(tiers))
	for k, tr := range tiers {
		weights[k], floors[k] = tr.Weight, tr.FloorPerSec
	}
	tierShares = WaterFill(capacity, weights, scaledFloors(capacity, floors, claims), claims)
	return withinTiers(tierShares, tenants), tierShares
}

// ByTenant is seed 002's definition: every tenant by its weight, tiers
// held up to their floors.
func ByTenant(capacity float64, tiers []Tier, tenants []Tenant) (shares, tierShares []float64) {
	claims := tierClaims(tiers, tenants)
	var total float64
	for _, c := range claims {
		total += c
	}
	if total <= capacity {
		shares = make([]float64, len(tenants))
		for i, tn := range tenants {
			shares[i] = tn.CapPerSec
		}
		return shares, claims
	}
	floors := make([]float64, len(tiers))
	for k, tr := range tiers {
		floors[k] = tr.FloorPerSec
	}
	floors = scaledFloors(capacity, floors, claims)
	byTenants := func(level float64) []float64 {
		s := make([]float64, len(tiers))
		for _, tn := range tenants {
			s[tn.Tier] += math.Min(level*tn.Weight, tn.CapPerSec)
		}
		return s
	}
	sum := func(level float64) float64 {
		var x float64
		for k, s := range byTenants(level) {
			x += math.Max(floors[k], s)
		}
		return x
	}
	level := bisect(capacity, sum)
	atLevel := byTenants(level)
	tierShares = make([]float64, len(tiers))
	for k := range tiers {
		tierShares[k] = math.Max(floors[k], atLevel[k])
	}
	shares = withinTiers(tierShares, tenants)
	for i, tn := range tenants {
		if atLevel[tn.Tier] >= floors[tn.Tier] {
			shares[i] = math.Min(level*tn.Weight, tn.CapPerSec) // the same, without a second bisection's rounding
		}
	}
	return shares, tierShares
}

// tierClaims sums the tenants' claims per tier.
func tierClaims(tiers []Tier, tenants []Tenant) []float64 {
	claims := make([]float64, len(tiers))
	for _, tn := range tenants {
		claims[tn.Tier] += tn.CapPerSec
	}
	return claims
}

// scaledFloors caps each floor at its tier's claims and, when they add up
// to more than capacity, scales them all to fit.
func scaledFloors(capacity float64, floors, claims []float64) []float64 {
	out := make([]float64, len(floors))
	var sum float64
	for k := range floors {
		out[k] = math.Min(floors[k], claims[k])
		sum += out[k]
	}
	if sum > capacity {
		for k := range out {
			out[k] *= capacity / sum
		}
	}
	return out
}

// withinTiers shares each tier's share among its tenants by weighted
// max-min.
func withinTiers(tierShares []float64, tenants []Tenant) []float64 {
	shares := make([]float64, len(tenants))
	for k, share := range tierShares {
		var idx []int
		var w, f, c []float64
		for i, tn := range tenants {
			if tn.Tier == k {
				idx = append(idx, i)
				w, f, c = append(w, tn.Weight), append(f, 0), append(c, tn.CapPerSec)
			}
		}
		for j, x := range WaterFill(share, w, f, c) {
			shares[idx[j]] = x
		}
	}
	return shares
}

// WaterFill shares capacity among claimants by weighted max-min: claimant i
// gets min(max(level×weights[i], min(floors[i], caps[i])), caps[i]) for the
// one water level at which the allocations add up to capacity, or its whole
// cap when the caps add up to less. Floors that exceed capacity are given
// anyway (the caller keeps floors within capacity).
func WaterFill(capacity float64, weights, floors, caps []float64) []float64 {
	alloc := func(level float64) (x []float64, sum float64) {
		x = make([]float64, len(caps))
		for i := range caps {
			x[i] = math.Min(math.Max(level*weights[i], math.Min(floors[i], caps[i])), caps[i])
			sum += x[i]
		}
		return x, sum
	}
	var total float64
	for _, c := range caps {
		total += c
	}
	if total <= capacity {
		x, _ := alloc(math.Inf(1))
		return x
	}
	x, _ := alloc(bisect(capacity, func(level float64) float64 { _, s := alloc(level); return s }))
	return x
}

// bisect finds, in 200 halvings, the least level at which the
// nondecreasing sum reaches capacity (sum must reach it eventually).
func bisect(capacity float64, sum func(level float64) float64) float64 {
	lo, hi := 0.0, 1.0
	for sum(hi) < capacity {
		hi *= 2
	}
	for range 200 {
		if mid := (lo + hi) / 2; sum(mid) < capacity {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}
