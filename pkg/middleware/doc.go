// Package middleware enforces quotaplane decisions in a Go service: net/http
// middleware (HTTP) and gRPC server interceptors (UnaryServerInterceptor,
// StreamServerInterceptor) that decide each request before its handler runs,
// the tool guard of seed 001 for services written in Go.
//
// The decisions come from a Decider: an engine in the same process (Local,
// for a single process or a plane in mode central or local-reconciled
// shared through Redis), or a remote enforcer's decision API
// (*client.Client). Either way the caller's handler sees only allowed
// requests; a denied one is answered with the same fields the enforcer's own
// API sends (429 with Retry-After, X-Quota-Level, X-Quota-Reason, RateLimit,
// RateLimit-Policy; gRPC ResourceExhausted with those fields as header
// metadata and a google.rpc.RetryInfo).
//
// What a request is, for the plane, is the caller's: a function names its
// tenant, endpoint, api key and units, from whatever authenticated it.
//
// A decider that fails (an enforcer unreachable or shutting down, a context
// that ended) fails closed by default (503, Unavailable); WithFailureMode
// (FailOpen) serves the request instead. The plane's refusals (a tenant or
// endpoint it denies, a key that is not the tenant's) are refused in both
// modes: they are decisions, not failures.
package middleware
