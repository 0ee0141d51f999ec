// Package server is the enforcer's HTTP surface: POST /api/{endpoint} answers
// whether a request may pass, with the headers gateways and clients act on.
//
// A request names its tenant in X-Tenant and its api key in X-Api-Key, and may
// claim several units of the endpoint's cost in X-Quota-Units. The answer is
// 200 with a small JSON body, or 429 with Retry-After (whole seconds, rounded
// up), X-Quota-Level (global|tenant|endpoint|key) and X-Quota-Reason. Both
// carry the IETF RateLimit-Policy field (the limits in force, one item per
// level) and RateLimit (the level that bounds the answer, its remaining
// tokens and when to come back). Every other outcome is a 4xx or 5xx whose
// body says what is wrong; a refusal by the plane (an unknown tenant, an
// api key that is not the tenant's under keyBinding bound) is a 403 whose
// X-Quota-Level (tenant, key) and X-Quota-Reason say which and why, without
// Retry-After: retrying will not help.
//
// Forward auth, on the same listener, puts the enforcer in a gateway's
// request path: the gateway asks before it proxies a request and proxies it
// only on a 2xx. /forward-auth (Caddy's forward_auth, Traefik's
// ForwardAuth; any method) reads the original request from
// X-Forwarded-Method and X-Forwarded-Uri and the caller from X-Tenant,
// X-Api-Key and X-Quota-Units, classifies it into an endpoint by the
// plane's EndpointQuota matches (policy.CanonicalPath, then
// policy.Policy.MatchEndpoint; no match is a request for no named
// endpoint) and decides it: 200 with RateLimit and RateLimit-Policy, or the
// 429 above with every header field, for the gateway to hand to the client;
// a malformed forwarded request is a 400, a refusal a 403, each saying why
// in X-Quota-Reason too (gateways pass header fields on where they drop
// bodies). /auth-request is the same for nginx's auth_request, which passes
// only 2xx, 401 and 403 on: every denial and refusal is a 403, and a quota
// denial is the one with Retry-After (docs/gateways.md has the nginx
// configuration that turns it into a 429). Forward auth ignores its own
// query, which Caddy fills with the client's.
//
// The admin handler (NewAdmin) serves what operators and probes read, on a
// listener apart from the API's: /healthz, /readyz, /metrics (Prometheus,
// every name starting with MetricPrefix, plus the Go runtime's and the
// process's; tenant and endpoint labels only for those the policy names,
// the rest as "other": see Metrics and docs/observability.md),
// /quota/debug?tenant=X and /quota/ui, the live view (ui.go, docs/ui.md).
//
// /quota/debug is JSON: the tenant's tier, weight, limits with their
// remaining tokens, counters, demand and fair share, and its recent
// decisions on this enforcer (api keys as short hashes). Whose remaining
// tokens they are depends on the mode (limitsNote says): in mode local this
// enforcer's, which are the plane's; in local-reconciled this enforcer's
// share; in central the fleet's, read from Redis at Redis TIME by
// peek.lua, which writes nothing (enforcer.RedisStatusOf): global, tenant,
// endpoints, the api keys the policy names for the tenant that have state,
// the burst pool and the borrow allowance (levels burstPool and
// borrowAllowance) — on any enforcer, whether or not it decided for the
// tenant; while the breaker is open, this enforcer's degraded share. In the
// distributed modes a fleet section lists the plane's enforcers from the
// reports in Redis (WithFleet; reload.Loader.Report writes one a second,
// lapsing after three): each one's policy version, mode and whether it is
// degraded, and the answering enforcer's own state, marked self, listed
// also when Redis holds no report of it (a degraded enforcer may not reach
// Redis to report).
package server
