package upstream

import (
	"github.com/quotaplane/quotaplane/pkg/scheduler"
)

// Allocate shares an upstream's capacity now (tokens per second: nominal
// capacity × confidence) among the classes, into out: scheduler.MaxMin, the
// weighted max-min the plane's tiers share their global rate by, over one
// claimant per class with seed 004's class weight (ClassWeights) and the
// class's fleet-wide demand (tokens per second) times its phase fraction as
// its cap. Critical is reserved its tenants' nominal allocation first
// (reserve, the floor and the least of its cap) while it has any demand:
// a reservation, not a forecast. A suspended class, or one its phase gives
// 0, gets 0.
//
// What the claims leave unused goes to the classes the phase does not
// hold back (fraction 1), by weight: a class's allocation is a ceiling,
// not a forecast, and demand measured over the last interval must not deny
// the next burst while capacity is idle. The allocations add up to at most
// capacity.
func Allocate(capacity, reserve float64, demand [NumClasses]float64, fractions [NumClasses]float64, out *[NumClasses]float64, scratch *scheduler.Scratch) {
	*out = [NumClasses]float64{}
	if !(capacity > 0) {
		return
	}
	var items [NumClasses]scheduler.Item
	var shares [NumClasses]float64
	for c := range Class(NumClasses) {
		items[c] = scheduler.Item{Weight: ClassWeights[c], Cap: max(demand[c], 0) * fractions[c]}
		if c == Suspended || fractions[c] <= 0 {
			items[c] = scheduler.Item{Weight: 1, Cap: 0}
		}
	}
	if items[Critical].Cap > 0 {
		items[Critical].Floor = min(max(reserve, 0), capacity)
		items[Critical].Cap = max(items[Critical].Cap, items[Critical].Floor)
	}
	scheduler.MaxMin(capacity, items[:], shares[:], scratch)
	var used, open float64
	for c := range Class(NumClasses) {
		out[c] = shares[c]
		used += out[c]
		if c != Suspended && fractions[c] >= 1 {
			open += ClassWeights[c]
		}
	}
	if spare := capacity - used; spare > 0 && open > 0 {
		for c := range Class(NumClasses) {
			if c != Suspended && fractions[c] >= 1 {
				out[c] += spare * ClassWeights[c] / open
			}
		}
	}
}

// Part is the part of a class's fleet-wide allocation one node enforces: its
// share of the class's fleet demand, with partFloor of the allocation
// spread evenly over the live nodes so that a node that had no demand last
// interval can still admit the first requests of the next. Parts of the
// live nodes add up to 1.
func Part(node, fleet float64, nodes int) float64 {
	nodes = max(nodes, 1)
	even := 1 / float64(nodes)
	if !(fleet > 0) || node <= 0 {
		if fleet > 0 {
			return partFloor * even
		}
		return even
	}
	return (1-partFloor)*min(node/fleet, 1) + partFloor*even
}

// partFloor is the part of every class's allocation kept evenly over the
// nodes (Part): what a critical tenant routed to one node of many loses of
// its reserve, so small (0.5 % of it on 2 nodes).
const partFloor = 0.01
