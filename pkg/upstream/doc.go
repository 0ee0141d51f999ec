// Package upstream is seed 004's pipeline in quotaplane: when an upstream the
// plane's endpoints depend on (a model provider, any API with its own
// limits) loses capacity, sense it, reclassify tenants into priority
// classes, share what is left by class, and bring the classes back in steps.
//
// # The five components, and where each runs
//
//   - Sensing (seed 004's health probe). The leader manager probes each
//     Upstream (an HTTP request per interval: status, latency and the
//     rate-limit headers x-ratelimit-remaining-requests /
//     x-ratelimit-limit-requests or the IETF RateLimit field) and reads the
//     passive reports enforcers forward from the data path (POST
//     /quota/upstream/report, batched). Window folds both into a rolling
//     window and Confidence computes the seed's capacity confidence:
//     1 − 0.5·errorRate − 0.2·min(p95/latencyCeiling, 1) − 0.3·(1 − remaining/limit),
//     minus the seed's staleness penalty min(age/120 s, 0.5) when the newest
//     reading is old.
//   - The ledger (seed 004's capacity budget ledger) is a Plan in Redis
//     beside the policy, qp:{plane}:upstream:plan, published by the leader
//     each cycle with a TTL, read by every enforcer each reconcile interval.
//   - Reclassification (seed 004's priority engine). Score gives a tenant's
//     priority score from its tier's base score, the TenantQuota's priority
//     signals (contract value, real-time workload, importance) and its live
//     usage ratio; Band maps score and confidence to a Class by the seed's
//     table; Classifier adds the hysteresis (a downgrade needs two
//     consecutive cycles, an upgrade is immediate). The cycle is 30 s, 10 s
//     while confidence is below 0.5.
//   - Negotiation. An upstream's nominal capacity × confidence is the rate
//     its endpoints share. Allocate shares it among the classes with the
//     plane's own weighted max-min (scheduler.MaxMin, the allocator the
//     tiers use; not a second one): critical is reserved its tenants'
//     nominal allocation as a floor, the rest goes by class weight (seed
//     004's 1.0, 0.6, 0.3, 0.1), each class capped by its demand × its
//     phase fraction. Every enforcer computes the same allocation from the
//     plan and the fleet's class demand in Redis, and enforces its part.
//   - Enforcement (seed 004's gateway enforcer) is pkg/enforcer's upstream
//     gate: a suspended tenant gets 503 with Retry-After, X-Outage-Mode: true
//     and X-Tier: <class>; a tenant whose class is out of its allocation a
//     429 naming the reduced limit.
//   - Staged recovery. Recovery walks the seed's phases: 1 (critical and
//     high only), 2 (medium at 50 %), 3 (medium at 100 %, low at 25 %),
//     and full only after confidence has stayed above 0.95 for 2 minutes.
//     A phase rises at most one step per cycle and falls only after two
//     cycles below its threshold, so a flapping confidence does not flap.
//
// # Decisions where the seed is silent
//
//   - Healthy means no gate: while an upstream's phase is Healthy the
//     enforcers do not look at it (one atomic load per request), as the
//     seed defers to static tiers at confidence ≥ 0.9.
//   - No plan in Redis (none published yet, or expired) means healthy, as
//     the seed's ledger assumes. An enforcer that read a plan keeps it until
//     the plan's own expiry (PlanTTL after it was published), its
//     confidence decayed by the seed's staleness penalty, then drops it.
//   - A probe that fails (unreachable, hangs past its timeout, an
//     unexpected status) is an error sample whose latency is the time it
//     took (the timeout for a hang). Rate-limit headers that do not parse
//     are ignored: the quota signal then counts as full, never as empty.
package upstream
