// Package enforcer is quotaplane's decision engine: given a compiled policy
// (pkg/policy) it answers, for each request, whether it may pass and, if not,
// which limit fired, why, and when to retry.
//
// # The hierarchy
//
// A request names a tenant, an endpoint, an api key and a number of units;
// its cost is the endpoint's cost times max(units, 1) (an endpoint the plane
// does not name, or none, costs 1 and has no endpoint limit, when the
// plane's unknownEndpoints lets it through). It must pass four
// levels in order — global (the plane), tenant, endpoint (per tenant) and key
// (per tenant and key) — and is denied at the first that cannot cover its
// cost. A denied request consumes nothing anywhere: the levels below global
// are evaluated on the tenant's own state under its lock, the global level
// and the burst pool under the plane's lock (taken after the tenant's), and
// every level is debited only once all of them pass. Decisions are therefore
// linearisable: concurrent decisions give the same answers some serial order
// would, and no tokens leak.
//
// # Requests from the wire
//
// Every decision, in every mode, starts with ValidateRequest, the one
// validator of requests (gateways call it too, to answer 400 first): the
// tenant and the api key are names (1 to 256 printable ASCII bytes without
// spaces; the key may be absent), the endpoint is absent or an endpoint
// name (1 to 128 of [A-Za-z0-9._~-]), the tier absent or a DNS label,
// units in [0, MaxUnits]. Its errors wrap ErrInvalidRequest, name the field
// and the rule, and never quote the api key nor a value that breaks the
// rule. An endpoint name resolves canonically: the endpoint of that name,
// else the one equal to it but for ASCII case (policy.ResolveEndpoint;
// Compile refuses two endpoints that differ only in case), so that
// "Export" costs what export costs and meets export's limits, in the
// engine and in Redis alike; a variant such as "export " is refused rather
// than taken for a cheaper unknown endpoint.
//
// # Key binding
//
// A plane whose keyBinding is bound admits a request only with an api key
// that is one of its tenant's (policy.KeyBelongs: the key's SHA-256 among
// the tenant's compiled hashes); another tenant's key, an unknown key, no
// key, or a tenant the plane does not name fail with ErrKeyNotBound, after
// validation and before anything else: no state is created and no bucket
// moves, so rotating made-up tenant names costs nothing. The error names
// the tenant and the key's policy.ShortKeyHash, never the key; traces and
// TenantStatus show keys the same way (TraceEntry.KeyHash,
// LimitStatus.Name).
//
// # Groups
//
// DecideAll decides up to MaxGroup requests as one group, all or nothing:
// Envoy's rate limit service asks about a request's descriptors together,
// and quotaplane admits the request only if all pass, debiting none of them
// otherwise (envoyproxy/ratelimit debits those that passed). Every request
// is validated and resolved before any is decided (*RequestError says
// which failed); then each is decided in order on top of the earlier
// ones' debits, so two requests of one tenant need both costs at its level.
// A denied group leaves every bucket, window, pool, borrow allowance and
// share as it found it; counters count only what stays admitted (the
// plane's admitted count that local-reconciled pushes included), and a
// request that passed in a denied group is traced as undone. A group of one
// is Decide; larger groups never wait in the queueing modes.
//
// In the engine's own state (modes local and local-reconciled, and central
// while its failureMode degrades) a group holds its tenants' locks, taken
// in the order of their ids, and the plane's, from its first evaluation to
// its commit or undo: no concurrent decision sees its tentative debits,
// and groups and single decisions stay linearisable. In mode central,
// decide.lua decides a group in one atomic call, restoring its in-memory
// state of every level the group touched when one of its requests is
// denied; while Redis cannot answer, the failureMode decides the whole
// group (allow all, deny all, or degrade: the group on the node's share).
//
// A plane sharded over a Redis Cluster (spec.shards > 1) whose group's
// tenants live in different shards cannot be decided in one atomic call:
// each shard decides its part all or nothing, in one pipelined round trip,
// and a part admitted while another shard denied its part (or could not
// decide it) is given back (refund.lua) before DecideAll returns. That is
// the honest limit of a group across shards: between a part's debit and
// its refund, a concurrent decision on that shard sees the debit and may
// be denied for it; a refund is capped at the bucket's burst (as if the
// debit had never happened, less any refill the cap swallowed); and a
// refund that fails (Redis failing meanwhile) leaves the debit, so a split
// group may make its shards admit less, never more.
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
// each tenant's demand and shares the global rate by weighted max-min on
// demand (pkg/scheduler), as the plane's shareBy says: tenant (the
// default, seed 002's) shares it among all the tenants by their weights
// (a tenant's weight is its tier's or its own), then raises each tier its
// tenants leave below its floor to the floor; tier shares it among the
// tiers by their weights and floors first, then within each tier among its
// tenants, so that a tier's total does not grow with its number of tenants.
// A tenant's claim is capped by what its own limit lets through. Each
// tenant is then paced at its share, so a noisy tenant gets its fair share
// and no more; every tier keeps its floor as far as its tenants want it.
// The outcome is one water level per tier, a tenant's share its tier's
// level times its weight. pkg/fairref is the reference both are tested
// against. A tenant's demand is a moving
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
// In mode central the same allocation runs on the fleet's demand
// (central_fair.go). Every fairness interval each node measures its
// tenants' demand from its decisions through Redis, reports its busiest
// tenants by name and the rest summed per tier and ratio of demand to
// weight, and reads back every live node's report in one atomic call
// (heartbeat.lua); it then allocates the plane's whole global rate among
// the fleet's claimants, sorted by tier and name, so that nodes that read
// the same reports compute the same water levels. A node sees its part of
// a spread tenant's arrivals, so its averages may run as many times longer
// as there are nodes, and the arrivals of tenants too sparse to have an
// average at a node yet are claimed in full rather than left out. While
// the plane is
// contended, a paced request carries its tenant's fair share to decide.lua,
// which paces the tenant fleet-wide with a share bucket in Redis (the same
// size and rules as the engine's) and denies it at the global level with
// the same reason. wfq and drr pace as maxmin there: central mode has no
// waiting queue.
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
//     per batch (central.go). Fairness and tier floors hold fleet-wide, as
//     rate guarantees, with the fleet's demand exchanged every fairness
//     interval (see Fairness); a tenant beyond a node's busiest 128 is
//     counted as spread over the nodes as the fleet's requests are, so a
//     small tenant pinned to one node is under-counted. Each call has a
//     deadline; a circuit breaker opens after failures, and meanwhile the
//     plane's failureMode decides (failure.go): degrade (this node's share of
//     every limit, debited from the fleet's buckets when Redis is back),
//     allow or deny. A plane may be split into shards over a Redis Cluster,
//     and a whale tenant over several shards (shards.go).
//   - local-reconciled: decisions are local at this node's share of every
//     limit, sized by demand and reconciled with the fleet's bucket in Redis
//     every reconcileInterval: the global level by the node's share of the
//     plane (reconcile.go), each tenant, endpoint and key limit by the
//     node's part of that limit, which follows where its demand arrives
//     (reconcile_levels.go), so that a tenant pinned to one node gets its
//     whole limit there.
//
// In the distributed modes the engine's own state holds this node's share of
// the policy (policy.Share); Policy returns the policy itself.
//
// The modes are not three deciders behind one interface, and that is a
// decision: local-reconciled decides on the engine's own state (its
// reconcile loop resizes that state and never decides), and central falls
// back to that state whenever Redis cannot answer. So there is one
// decision path over the engine's own state, and one separate decider,
// central's (central.go: its batches, breaker and scripts), taken when the
// policy in force has mode central (its snapshot is set). What an
// interface would give is had otherwise: the mode is a typed enum
// (policy.Mode), each mode's code is in files of its own (central*.go,
// reconcile*.go, hybrid.go for the limits too small to split), and only
// the mode in force runs background loops (loops.go).
//
// Both distributed modes treat an unavailable Redis alike: the node is
// degraded (central: its circuit breaker is open; local-reconciled: three
// reconciles in a row failed, until one succeeds), BackendStatus.Degraded
// says so (the enforcer's quotaplane_enforcer_backend_degraded metric), the engine logs
// a warning on entry and a line on exit (WithLogger), and the plane's
// failureMode decides: degrade on the node's share (local-reconciled: its
// parts as the last reconcile sized them), allow admits, deny denies at
// the global level. Readiness does not change: failing it would take the
// fleet out of service in the outage the failureMode is there for.
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
// keys per tenant is bounded, beyond which newcomers share one state. A
// tenant's state holds only what is its own: its buckets (an endpoint's only
// once it used a limited endpoint, the borrow allowance only on a plane with
// a burst pool), its first api key's state (a map only from the second),
// its counters, and a pointer to what the policy says of it, resolved once
// per policy version for each named tenant and each tier's unknown tenants
// (tenantRecord); a bucket is its limit's shape, shared by every holder and
// derived once per policy version (limitShape), its level and its clock.
// What only some tenants need is in tenantMore, made when needed. About 195
// bytes a tenant, 275 with one api key, its name and its slot in the
// registry included (BenchmarkTenantMemory). Each tenant keeps a trace of its last TraceLength
// decisions (api keys as their short hash) for the debug view
// (TenantStatusAt): from its first decision for a tenant the policy names,
// from its first denial for one it does not (most of a million unknown
// tenants are never denied, and their traces would be most of their
// memory); the counters count every decision.
package enforcer
