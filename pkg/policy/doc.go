// Package policy compiles the quotaplane.io/v1alpha1 objects of one plane into an
// immutable, versioned Policy that the enforcers load.
//
// Compile is pure and deterministic: the same objects, in any order, give a
// byte-identical encoding and the same content hash. It never talks to Kubernetes
// or Redis; the manager, the enforcer's file mode and the offline check all run
// it, so one validator guards every entry point.
//
// Compile reports every problem it finds, each naming the object, the field and
// how to fix it. A problem in a TenantQuota, EndpointQuota or BurstPool rejects
// that object only: it is left out of the policy and the rest still compiles, so
// one bad object never blocks the plane. A problem with the plane itself (no
// QuotaPlane, two of them, an invalid global limit or tier) yields no policy at
// all, so the last good one stays in force. LoadDir, used by files and the check
// command, treats any problem as an error.
//
// Units: token counts are whole tokens (int64); durations are time.Durations
// whose enforced resolution is one microsecond, the unit the engine and the
// Redis scripts share. Every limit satisfies burst × period(µs) ≤ 2^53, so a
// bucket's scaled level (tokens × period in µs) is exact both in Go's int64 and
// in Lua's float64.
//
// Upstreams (seed 004) are checked by Compile but are not part of the
// policy: the leader compiles them with CompileUpstreams and publishes its
// plan beside the policy (pkg/upstream). What the policy carries for seed
// 004 is each tier's base score (Policy.PriorityBase, DefaultPriorityBase)
// and each named tenant's priority signals (Tenant.Priority).
package policy
