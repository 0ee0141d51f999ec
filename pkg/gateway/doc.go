// Package gateway is the enforcer's gRPC surface for Envoy: the rate
// limit service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit,
// what Envoy's ratelimit filter calls) and external authorization
// (envoy.service.auth.v3.Authorization/Check, what its ext_authz filter
// calls), on one gRPC server with gRPC health and reflection. Both decide
// on the same engine as the HTTP decision API and answer with the same
// header fields (package quotaheaders), so a 429 from Envoy says what a 429
// from the API says.
//
// # Rate limit service
//
// The request's domain must be the QuotaPlane's name (read for every call:
// the policy hot-reloads); another domain is InvalidArgument naming the one
// served. Each descriptor is one quotaplane request: its tenant, endpoint
// and api key are the values of the entries the plane's spec.descriptors
// names (by default the keys tenant, endpoint and api_key; of a list, the
// first key present wins; other entries are ignored, as is a descriptor's
// limit override: the policy decides). A descriptor without a tenant entry
// is InvalidArgument naming the keys looked for; without an endpoint entry
// it is a request for no named endpoint; without an api_key entry it skips
// the key level. Its units are its own hits_addend when set, else the
// request's; 0 means 1. Every value goes through enforcer.ValidateRequest,
// the validator of every surface; a bad value (a space in the api key, a
// 300-byte tenant: what Envoy copied from the client) is an OVER_LIMIT
// answer whose X-Quota-Reason names the descriptor and the problem, since
// an error would be let through (see below). At most MaxDescriptors descriptors (else ResourceExhausted)
// of at most MaxEntries entries (else InvalidArgument); a message larger
// than MaxRecvMsgBytes is refused by gRPC (ResourceExhausted) unread.
//
// All descriptors of one request are decided together, all-or-nothing
// (enforcer.Engine.DecideAll): every one passes and is debited, or none is.
// envoyproxy/ratelimit decides each descriptor on its own and debits those
// that pass even when another is over its limit, so a request that Envoy
// refuses still spends quota (envoyproxy/ratelimit issue 185); here a
// refused request spends nothing anywhere. The answer's overall_code is OK
// or OVER_LIMIT; each descriptor's status says whether it would pass
// (code), the limit of the level that bounds it (current_limit, named
// after the level), the tokens left there (limit_remaining) and how long
// until the request would pass or, when it passes, until that level's
// bucket is full again (duration_until_reset). current_limit is the
// limit's rate per period in Envoy's units: the longest unit the period is
// a whole number of, with unit_multiplier when it is more than one (100
// per 300s is 100 per 5 MINUTE); a period that is not a whole number of
// seconds is scaled to a rate per second, rounded (at least 1 when the
// bucket refills at all), which is approximate. response_headers_to_add
// carries RateLimit and RateLimit-Policy and, on a denial, Retry-After,
// X-Quota-Level and X-Quota-Reason: of the descriptor that denied the
// request, or of the tightest (fewest tokens left) when it passed. Envoy
// adds them to its 429 and, when allowed, to the upstream's response.
//
// # External authorization
//
// Check reads the original request from attributes.request.http: the
// tenant from x-tenant, the api key from x-api-key (both required), units
// from x-quota-units (1 to enforcer.MaxUnits), each at most once (with
// Envoy's encode_raw_headers; otherwise Envoy has already merged repeats
// into one value, which then names no tenant or key of the plane). The
// endpoint is the route's context extension "quotaplane-endpoint" (Envoy's
// per-route check_settings.context_extensions) when set; otherwise the
// request is classified like forward auth: its path made canonical
// (policy.CanonicalPath) and matched with its method against the plane's
// endpoint matches (policy.Policy.MatchEndpoint); no match is a request for
// no named endpoint. Allowed: an OkHttpResponse whose
// response_headers_to_add carry RateLimit and RateLimit-Policy to the
// client. Denied by a limit: a DeniedHttpResponse with status 429, the
// same header fields as the decision API's 429 and its JSON body. A
// malformed request: 400 with {"error": "..."}. A decision reads no body:
// configure ext_authz without with_request_body, and with allowed_headers
// listing x-tenant, x-api-key and x-quota-units, so that a CheckRequest
// stays small (MaxRecvMsgBytes bounds it).
//
// # Refusals are answers, not errors
//
// Envoy treats an error from either service according to its failure mode,
// and both filters let the request through by default (ratelimit's
// failure_mode_deny is false; ext_authz's failure_mode_allow is what many
// configurations set). So everything that means "refuse this request" is
// an answer: a tenant the plane does not name when it denies unknown
// tenants, an endpoint it does not name when it denies unknown endpoints,
// and an api key that is not one of the tenant's keys when its keyBinding
// is bound. The rate limit service answers OVER_LIMIT for that descriptor
// (the others of the request, not decided, are UNKNOWN), with X-Quota-Level
// (tenant, endpoint or key) and X-Quota-Reason; Check answers 403 with the
// same fields, as forward auth does. Neither carries Retry-After: retrying
// will not help. Nothing is debited anywhere. Check answers a malformed
// request with a 400, not an error, for the same reason. What remains an
// error is what Envoy's failure mode is for, and a misconfiguration that
// Envoy's ratelimit.error statistics should show: the enforcer has no
// policy yet or is stopping (Unavailable), a request the rate limit
// service cannot read (InvalidArgument: wrong domain, no tenant entry, an
// entry twice, too many entries), one too large (ResourceExhausted), a call that ended first
// (Canceled, DeadlineExceeded).
//
// # Serving
//
// NewServer takes grpc.ServerOptions (package authn's mTLS credentials and
// token interceptors) and bounds every connection (MaxRecvMsgBytes,
// MaxConcurrentStreams). Until SetEngine every call is Unavailable and
// health (the server, and each service by name) NOT_SERVING; after it,
// SERVING. Shutdown turns health to NOT_SERVING, lets calls in flight
// finish until its context ends, then stops.
package gateway
