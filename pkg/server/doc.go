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
// body says what is wrong.
//
// The admin handler (NewAdmin) serves what operators and probes read, on a
// listener apart from the API's: /healthz, /readyz, /metrics (Prometheus;
// tenant labels only for tenants the policy names, the rest as "other") and
// /quota/debug?tenant=X.
package server
