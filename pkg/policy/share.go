package policy

import (
	"fmt"
	"math"
	"slices"
)

// Share returns the policy one node of a fleet enforces on its own: every
// limit (global, tier, endpoint, tenant and key limits, the burst pool and
// its ceiling) scaled by fraction, the node's share of the fleet. The
// distributed backends use it for local enforcement: local-reconciled mode
// between reconciles, central mode while Redis is unreachable.
//
// Rates round to the nearest token and stay at least 1 (0 stays 0). Bursts
// and sliding-window capacities round up and are never scaled below the
// costliest endpoint's cost (nor above the original): a share too small to
// hold one request would deny that endpoint on every node, where the whole
// fleet's limit admits it. The rounding is the accuracy cost of a share; it
// is at most one token per limit and node, plus that floor.
//
// The result keeps p's version; its hash is its own content's. fraction
// must be in (0, 1]; 1 returns p.
func (p *Policy) Share(fraction float64) (*Policy, error) { return p.share(fraction, true) }

// SharePlane is Share for the plane-wide limits only: the global limit and
// the burst pool (its size, refill and per-tenant ceiling) scaled by
// fraction, every tenant, endpoint and key limit whole. Local-reconciled
// mode enforces it, each tenant's limits at the node's part of them, which
// follows where the tenant's demand is (pkg/enforcer).
func (p *Policy) SharePlane(fraction float64) (*Policy, error) { return p.share(fraction, false) }

// share scales the plane-wide limits by fraction, and the tenant,
// endpoint and key limits too when lower.
func (p *Policy) share(fraction float64, lower bool) (*Policy, error) {
	if !(fraction > 0 && fraction <= 1) {
		return nil, fmt.Errorf("share of plane %s: fraction %v is not in (0, 1]", p.Plane(), fraction)
	}
	if fraction == 1 {
		return p, nil
	}
	spec := p.spec
	maxCost := p.MaxCost()
	scale := func(l Limit) Limit { return l.Share(fraction, maxCost) }
	scalePtr := func(l *Limit) *Limit {
		if l == nil {
			return nil
		}
		s := scale(*l)
		return &s
	}
	spec.Global = scale(spec.Global)
	// newPolicy writes into its tenants: never into p's, which decisions read.
	spec.Tenants = slices.Clone(spec.Tenants)
	if lower {
		spec.Tiers = slices.Clone(spec.Tiers)
		for i := range spec.Tiers {
			spec.Tiers[i].Tenant = scalePtr(spec.Tiers[i].Tenant)
			spec.Tiers[i].Key = scalePtr(spec.Tiers[i].Key)
		}
		spec.Endpoints = slices.Clone(spec.Endpoints)
		for i := range spec.Endpoints {
			e := &spec.Endpoints[i]
			e.Limit = scalePtr(e.Limit)
			e.Tiers = slices.Clone(e.Tiers)
			for j := range e.Tiers {
				e.Tiers[j].Limit = scale(e.Tiers[j].Limit)
			}
		}
		spec.Tenants = slices.Clone(spec.Tenants)
		for i := range spec.Tenants {
			t := &spec.Tenants[i]
			t.Limit = scalePtr(t.Limit)
			t.Keys = slices.Clone(t.Keys)
			for j := range t.Keys {
				t.Keys[j].Limit = scale(t.Keys[j].Limit)
			}
			t.Endpoints = slices.Clone(t.Endpoints)
			for j := range t.Endpoints {
				t.Endpoints[j].Limit = scale(t.Endpoints[j].Limit)
			}
		}
	}
	if bp := spec.BurstPool; bp != nil {
		spec.BurstPool = shareBurstPool(*bp, fraction, maxCost)
	}
	shared, err := newPolicy(spec)
	if err != nil {
		return nil, fmt.Errorf("share %v of plane %s: %w", fraction, p.Plane(), err)
	}
	shared.version = p.version
	return shared, nil
}

func shareBurstPool(c BurstPool, fraction float64, maxCost int64) *BurstPool {
	if c.RefillRate > 0 {
		c.RefillRate = max(1, int64(math.Round(float64(c.RefillRate)*fraction)))
	}
	c.Size = shareCapacity(c.Size, fraction, maxCost)
	c.PerTenantCeiling = min(shareCapacity(c.PerTenantCeiling, fraction, maxCost), c.Size)
	return &c
}

// MaxCost is the cost of the costliest endpoint, at least 1 (the cost of an
// unknown endpoint).
func (p *Policy) MaxCost() int64 {
	var c int64 = 1
	for _, e := range p.spec.Endpoints {
		c = max(c, e.Cost)
	}
	return c
}

// Share is the part fraction (in (0, 1]) of the limit, rounded as
// Policy.Share rounds: the rate to the nearest token, at least 1 (0 stays
// 0); the burst, or a sliding window's capacity, up, and not below
// minCapacity unless the whole was.
func (l Limit) Share(fraction float64, minCapacity int64) Limit {
	if l.Algorithm == SlidingWindow {
		l.Rate = shareCapacity(l.Rate, fraction, minCapacity)
		return l
	}
	if l.Rate > 0 {
		l.Rate = max(1, int64(math.Round(float64(l.Rate)*fraction)))
	}
	l.Burst = shareCapacity(l.Burst, fraction, minCapacity)
	return l
}

// shareCapacity scales a bucket size or window capacity: rounded up, not
// below the costliest request (unless the whole was already below it).
func shareCapacity(capacity int64, fraction float64, maxCost int64) int64 {
	if capacity == 0 {
		return 0
	}
	scaled := int64(math.Ceil(float64(capacity) * fraction))
	return min(capacity, max(scaled, maxCost, 1))
}
