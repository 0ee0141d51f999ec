// Package enforcer is quotaplane's decision engine: given a compiled policy
// (pkg/policy) it answers, for each request, whether it may pass and, if not,
// which limit fired, why, and when to retry.
//
// # The hierarchy
//
// A request names a tenant, an endpoint, an api key and a number of units;
// its cost is the endpoint's cost times max(units, 1). It must pass four
// levels in order — global (the plane), tenant, endpoint (per tenant) and key
// (per tenant and key) — and is denied at the first that cannot cover its
// cost. A denied request consumes nothing anywhere: the levels below global
// are evaluated on the tenant's own state under its lock, the global level
// and the burst pool under the plane's lock (taken after the tenant's), and
// every level is debited only once all of them pass. Decisions are therefore
// linearisable: concurrent decisions give the same answers some serial order
// would, and no tokens leak.
//
// # Buckets
//
// Every limit is a token bucket or a sliding window. A bucket's level is an
// integer in token·µs (tokens × period in µs): refilling elapsed µs adds
// elapsed×rate, a cost c takes c×period, with no division and no fraction of
// a token lost, so the engine is exact and agrees to the token with the Redis
// scripts. A clock that goes backwards refills nothing. Changing a limit
// settles the bucket at the old rate first and carries its tokens over,
// capped by the new burst. A sliding window is an exact log of the costs
// admitted in the last period (for small limits such as 2 per 300 s).
//
// # Borrowing and tiers
//
// A soft tenant (not hard, in a tier the BurstPool admits) that is short at
// its own level borrows the shortfall from the plane's burst pool, up to its
// PerTenantCeiling of outstanding debt; debt is repaid at the pool's refill
// rate. Hard tenants never borrow; endpoint, key and global limits never
// borrow. Tiers are ranked by weight, which is also their priority.
//
// # Fairness
//
// When the global level is contended and the plane's fairness is maxmin, wfq
// or drr, a tick that runs every fairness interval of engine time measures
// each tenant's demand and shares the global rate hierarchically: among tiers
// by weighted max-min with their floors, then within each tier among tenants
// by weighted max-min on demand (pkg/scheduler); a tenant's claim is capped by
// what its own limit lets through. Each tenant is then paced at its share, so
// a noisy tenant gets its fair share and no more; every tier keeps its floor
// as far as its tenants want it, and among tiers that want more than their
// share the lower-weight tier is cut more. A tenant's demand is a moving
// average over at least 256 of its own arrivals (500 ms for a busy tenant, up
// to 16 s for a trickle), so the thousands of small tenants of a tier are
// neither mistaken for silence nor for bursts. A paced tenant's share bucket
// holds half a second of its share and at least 8 of the plane's cheapest
// requests; a costlier request is admitted from a full bucket and repaid as
// debt. In the queueing modes (wfq, drr),
// Decide may hold a request denied at the contended global level for a
// bounded time and serve waiters in the discipline's order. With fairness
// none, decisions are first come first served and tier floors are only
// reserves of the global burst that lower tiers cannot take (no tick runs).
// When the plane is not contended, no fairness code runs on the decision
// path; the tick that measures demand runs once per interval, inside the
// decision that crosses it.
//
// # Backends
//
// The plane's mode picks where decisions are made; the engine's contract is
// the same in all three. A distributed mode needs WithRedis; WithNodeID names
// the node; Close stops the background loops and flushes what they owe Redis.
//
//   - local: the engine's own state, as described above.
//   - central: every decision is decide.lua in Redis (pkg/lua): all four
//     levels, the burst pool and the borrow allowance checked and debited in
//     one atomic call, at Redis TIME, with the same integer arithmetic as
//     the Go engine (the behaviour suite replays the Go engine's decisions
//     through it). Concurrent decisions are coalesced into batches, one call
//     per batch (central.go). Tier floors are reserves of the global bucket
//     whatever the fairness mode: weighted max-min pacing needs a view of the
//     fleet's demand that central mode does not keep. Each call has a
//     deadline; a circuit breaker opens after failures, and meanwhile the
//     plane's failureMode decides (failure.go): degrade (this node's share of
//     every limit, debited from the fleet's buckets when Redis is back),
//     allow or deny. A plane may be split into shards over a Redis Cluster,
//     and a whale tenant over several shards (shards.go).
//   - local-reconciled: decisions are local at this node's share of every
//     limit, sized by demand and reconciled with the fleet's bucket in Redis
//     every reconcileInterval (reconcile.go).
//
// In the distributed modes the engine's own state holds this node's share of
// the policy (policy.Share); Policy returns the policy itself.
//
// # Time
//
// DecideAt takes the time as an argument and never waits: the same requests
// at the same times give the same decisions, so simulations in virtual time
// are exact and repeatable. Decide reads a coarse clock (one atomic load; the
// system clock costs about 100 ns on the VMs this runs on). In central mode
// the script reads Redis TIME, one clock for the fleet, so nodes' clocks do
// not matter; DecideAt passes its time to the script instead (simulations,
// and the tests that replay the Go engine), which a fleet must not mix with
// Decide.
//
// # Memory
//
// State for tenants the policy does not name and for api keys is forgotten
// once it has been idle for the idle TTL and is as a fresh state would be, so
// forgetting it never changes a decision; the number of such tenants and of
// keys per tenant is bounded, beyond which newcomers share one state. Each
// tenant keeps a trace of its last TraceLength decisions and its counters for
// the debug view (TenantStatusAt).
package enforcer
