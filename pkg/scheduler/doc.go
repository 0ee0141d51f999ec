// Package scheduler holds the fairness algorithms quotaplane uses when the
// global level of its token-bucket hierarchy (global → tenant → endpoint →
// key) is contended: how much of a scarce rate each claimant gets, and in
// which order queued requests are admitted.
//
// Three pieces, one idea (weighted max-min fairness):
//
//   - MaxMin divides a capacity among claimants with weights, guaranteed
//     floors and caps (their demand). It is what the control loop uses to
//     turn "global is contended" into per-tenant rates.
//   - WFQ and DRR order queued items from many flows so that, while flows are
//     backlogged, each receives service in proportion to its weight. They are
//     what a waiter queue uses when tokens become available.
//
// The package knows nothing about HTTP, Redis, Kubernetes or time. It is pure
// and deterministic (the same calls in the same order give the same results;
// there is no clock, no randomness and no dependence on map iteration order),
// allocation-free in steady state, and not safe for concurrent use: callers
// own the locking. Invalid numeric input is repaired, never panicked on (see
// Item, WFQ.Enqueue, NewDRR); the only panic is MaxMin's len(out) <
// len(items), a programmer error.
//
// # Weighted max-min fairness with floors and caps
//
// Claimant i has weight wᵢ > 0, floor fᵢ and cap cᵢ, with the floor taken as
// min(fᵢ, cᵢ) (a guarantee larger than the demand is meaningless). For a water
// level λ >= 0 define
//
//	xᵢ(λ) = clamp(λ·wᵢ, fᵢ, cᵢ)      S(λ) = Σᵢ xᵢ(λ)
//
// Each xᵢ is continuous and nondecreasing in λ, so S is too, with
// S(0) = Σfᵢ and S(λ) = Σcᵢ once λ >= maxᵢ cᵢ/wᵢ. Let T = min(C, Σcᵢ).
//
// Existence. If Σfᵢ <= T, the intermediate value theorem gives a λ with
// S(λ) = T. (If Σfᵢ > C the floors cannot all be honoured; MaxMin then scales
// every floor by C/Σfᵢ, the only rule that treats all guarantees alike, and
// reports λ = 0. If Σcᵢ <= C everyone gets cᵢ and MaxMin reports λ = +Inf.)
//
// Uniqueness of the allocation. If S(λ₁) = S(λ₂) with λ₁ < λ₂, then
// Σ(xᵢ(λ₂) − xᵢ(λ₁)) = 0 with every term >= 0, so every term is 0: all levels
// solving S(λ) = T give the same allocation x. MaxMin returns the smallest.
//
// Why x is the weighted max-min fair allocation. Call i unsatisfied if
// xᵢ < cᵢ and donor if xᵢ > fᵢ (it could give something up without breaking a
// guarantee). An unsatisfied i has xᵢ = max(fᵢ, λwᵢ), so xᵢ/wᵢ >= λ; a donor j
// has xⱼ = min(λwⱼ, cⱼ), so xⱼ/wⱼ <= λ. Hence
//
//	(F) no unsatisfied i and donor j have xᵢ/wᵢ < xⱼ/wⱼ:
//
// no claimant can be raised except at the expense of one that already has an
// equal or smaller weighted share or is sitting on its floor. Conversely,
// every feasible x (fᵢ <= xᵢ <= cᵢ, Σxᵢ = T) satisfying (F) is x(μ) for
// μ = min over unsatisfied i of xᵢ/wᵢ (or +Inf): an unsatisfied i above its
// floor is a donor, so xᵢ/wᵢ <= μ and hence = μ, i.e. xᵢ = max(fᵢ, μwᵢ); a
// capped donor has cᵢ/wᵢ <= μ. So x = x(μ), S(μ) = T, and by uniqueness (F)
// plus feasibility pins the allocation down completely. This is why the tests
// can check MaxMin with invariants alone, and also compare it with an oracle.
//
// Algorithm and cost. S is piecewise linear with breakpoints fᵢ/wᵢ (item i
// starts rising) and cᵢ/wᵢ (item i saturates). MaxMin sorts these (at most
// 2n) breakpoints, binary-searches them for the first one where S reaches T
// (evaluating S directly as a sum of nonnegative clamps, which has no
// cancellation: a running-sum walk loses small weights when a huge one
// enters and leaves the slope), and solves the line constant + slope·λ on the
// bracketing segment, recomputed exactly from the items: O(n log n) in all,
// with no allocation given a warm Scratch.
//
// This is the problem Kubernetes API Priority and Fairness solves to divide
// concurrency among priority levels: computeConcurrencyAllocation in
// k8s.io/apiserver/pkg/util/flowcontrol/conc_alloc.go finds fairProp with
// Σ clamp(fairProp·target, lowerBound, upperBound) = requiredSum by walking
// the sorted bounds with running sums. MaxMin differs in the search (above),
// and in scaling floors that do not fit where conc_alloc returns an error.
// Like conc_alloc, it is tested against a deliberately naive allocator.
//
// # WFQ: self-clocked fair queueing
//
// Weighted fair queueing (Demers, Keshav, Shenker, "Analysis and Simulation
// of a Fair Queueing Algorithm", SIGCOMM 1989) serves packets in the order a
// fluid bit-by-bit weighted round robin would finish them. Exact WFQ must
// simulate the fluid system to know its virtual time. WFQ here is the
// self-clocked variant (Golestani, "A Self-Clocked Fair Queueing Scheme for
// Broadband Applications", INFOCOM 1994): virtual time V is the finish tag of
// the item last dequeued, an item of cost L from flow i gets
//
//	F = max(V, lastFinishᵢ) + L/wᵢ
//
// and Dequeue takes the smallest F (ties: earlier Enqueue first). Because every
// new tag is >= V and V is the smallest queued tag, tags are dequeued in
// nondecreasing order. A flow with nothing queued has lastFinish <= V, so its
// state is dropped: memory is bounded by the queued items. When the queue is
// empty V restarts at 0, an unobservable translation that keeps float
// precision from eroding. Remove (cancelled waiters) does not charge a flow
// for cancelled items: its lastFinish falls to its largest remaining tag.
//
// Fairness bound (Golestani's theorem for SCFQ), checked by the tests at every
// dequeue over every interval in which flows i and j stay backlogged, with
// Sᵢ the cost served to i in the interval and Lmax the largest cost:
//
//	|Sᵢ/wᵢ − Sⱼ/wⱼ| <= Lmax/wᵢ + Lmax/wⱼ
//
// (Sketch: while i is backlogged its tags are chained, so Sᵢ/wᵢ measured from
// the interval start is a difference of tags of i; after a dequeue of tag F*
// the last served tag of i lies in [F* − Lmax/wᵢ, F*].)
//
// # DRR: deficit round robin
//
// Deficit round robin (Shreedhar, Varghese, "Efficient Fair Queueing using
// Deficit Round Robin", SIGCOMM 1995) visits backlogged flows in a fixed
// cycle; on each visit flow i's deficit grows by Qᵢ = quantum·wᵢ and the flow
// sends head items while their cost fits in the deficit. A flow that empties
// leaves the cycle and its deficit resets to 0, and its state is forgotten.
// If no flow can afford its head for a whole round (costs larger than
// quanta), DRR grants the k idle rounds' quanta at once, which reproduces
// exactly the sends the plain algorithm makes after looping k times, so
// progress is guaranteed and each Dequeue is O(active flows) at worst.
//
// Fairness bound. Shreedhar and Varghese show that over m visits a
// backlogged flow sends between m·Qᵢ − Lmax and m·Qᵢ + Lmax, and the visit
// counts of two flows in any interval differ by at most one. Working through
// the cases (a flow's deficit is below Lmax between its turns and below
// Qᵢ + Lmax during one) gives, over every interval in which i and j stay
// backlogged,
//
//	|Sᵢ/wᵢ − Sⱼ/wⱼ| <= quantum + Lmax/wᵢ + Lmax/wⱼ
//
// which is the per-unit-weight form of the paper's fairness theorem (twice
// the maximum packet size plus the quantum). The tests check this bound at
// every dequeue, including with quanta far smaller than the costs.
//
// # How the pieces agree
//
// For flows that stay backlogged both disciplines give flow i the long-run
// fraction wᵢ/Σwⱼ of the service, their per-interval error being bounded by
// the constants above. That is exactly MaxMin's allocation of the served
// capacity among the same weights with unbounded caps; with finite demands
// the flows that are not backlogged receive their demand and the rest share
// the remainder by weight, which is again MaxMin. The tests check the long-run
// shares of both against MaxMin to within 1%.
//
// # What the tests check
//
//   - MaxMin: hand-computed tables; thousands of seeded random problems
//     (1..200 items, weights 1..10, caps spanning many orders of magnitude
//     including 0, floors sometimes set, sometimes above the cap, capacity
//     below the floors, between, and above the caps) compared with a naive
//     O(n²) progressive-filling oracle to a relative 1e-9 of the total; the
//     invariants min(fᵢ, cᵢ) <= xᵢ <= cᵢ, Σxᵢ = min(C, Σcᵢ) when floors fit,
//     proportional floor scaling when they do not, xᵢ = clamp(λwᵢ, fᵢ, cᵢ),
//     and property (F) via checkMaxMinFair, which is shown able to fail by a
//     negative control (allocation proportional to demand). Extreme
//     magnitudes and invalid inputs must not panic or produce NaN.
//   - WFQ and DRR: the bounds above at every dequeue, long-run shares against
//     MaxMin, a FIFO negative control that must fail the same checks,
//     equivalence with naive reference implementations (which never forget
//     flows and, for DRR, loop through idle rounds) over random operation
//     sequences with flows coming and going and Remove (hence also per-flow
//     FIFO order), tie order, flow state dropping to zero when the queue
//     drains, and termination with absurd weights, costs and quanta.
//   - Allocation: 0 allocs per call in steady state for MaxMin with a
//     Scratch and for WFQ and DRR Enqueue/Dequeue, pinned with
//     testing.AllocsPerRun.
package scheduler
