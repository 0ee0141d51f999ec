package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// Forward auth: a gateway (Caddy's forward_auth, Traefik's ForwardAuth,
// nginx's auth_request) asks before it proxies a request, and proxies it
// only on a 2xx. The original request comes in the standard forwarded
// header fields; the caller's tenant, api key and units in the same fields
// as the decision API's, copied by the gateway from the client's request.
const (
	// ForwardAuthPath serves forward auth for gateways that hand any answer
	// to the client as it is (Caddy, Traefik): a quota denial is a 429.
	ForwardAuthPath = "/forward-auth"
	// AuthRequestPath serves forward auth for nginx's auth_request, which
	// passes only 2xx, 401 and 403 on (anything else becomes a 500): a
	// quota denial is a 403 with Retry-After, every other refusal a 403
	// without, and the nginx configuration makes the first a 429.
	AuthRequestPath = "/auth-request"
	// HeaderForwardedMethod is the original request's method.
	HeaderForwardedMethod = "X-Forwarded-Method"
	// HeaderForwardedURI is the original request's URI: a path and
	// perhaps a query, as the client sent it.
	HeaderForwardedURI = "X-Forwarded-Uri"
)

// maxMethodBytes bounds X-Forwarded-Method; the methods matches name are
// at most 7 bytes.
const maxMethodBytes = 32

// forwardAuth returns the handler of forward auth that answers a quota
// denial with denyStatus (429, or 403 for nginx). It decides the request a
// gateway forwards: 200 (no body) with the RateLimit fields when it may
// pass; on a quota denial denyStatus with Retry-After, X-Quota-Level,
// X-Quota-Reason, RateLimit and RateLimit-Policy, and the decision API's
// JSON body, so that the gateway can hand all of it to the client; 400
// when the forwarded request is malformed and 403 when the plane refuses it
// (unknown tenant or endpoint, a key not bound to the tenant), each with
// X-Quota-Reason saying why and no Retry-After: retrying will not help.
// When denyStatus is 403 every one of these is a 403, since a gateway that
// cannot pass a 429 on cannot pass a 400 either; Retry-After tells a quota
// denial apart.
//
// Its own query is ignored: Caddy's forward_auth passes the client's query
// along, so a parameter here would be the client's to set.
func (a *API) forwardAuth(denyStatus int) http.HandlerFunc {
	refusalStatus := func(status int) int {
		if denyStatus == http.StatusForbidden && status >= 400 && status < 500 {
			return http.StatusForbidden
		}
		return status // server errors stay what they are
	}
	return func(w http.ResponseWriter, r *http.Request) {
		req, problem := classify(a.engine.Policy(), r.Header)
		if problem != "" {
			writeRefusal(w, refusalStatus(http.StatusBadRequest), enforcer.LevelNone, problem)
			return
		}
		start := time.Now()
		d, err := a.engine.Decide(r.Context(), req)
		if err != nil {
			status, level, message := engineRefusal(err)
			if status == http.StatusNotFound {
				// The plane denies requests no endpoint match takes: a refusal
				// of this request, not a path this server lacks.
				status, level = http.StatusForbidden, enforcer.LevelEndpoint
			}
			writeRefusal(w, refusalStatus(status), level, message)
			return
		}
		a.metrics.Observe(&req, &d, time.Since(start))
		limits := d.Limits(&req)
		quotaheaders.Set(w.Header(), &limits, &d)
		if d.Allow {
			w.Header()["Cache-Control"] = cacheControlNoStore
			w.WriteHeader(http.StatusOK)
			return
		}
		status := denyStatus
		if denyStatus == http.StatusTooManyRequests {
			status = quotaheaders.Status(&d) // nginx's auth_request passes only 401 and 403 on
		}
		writeDecision(w, status, &decision{Tenant: req.Tenant, Endpoint: req.Endpoint, Cost: d.Cost, Remaining: d.Remaining,
			Level: string(d.Level), Reason: d.Reason, RetryAfterSec: d.RetryAfter.Seconds()})
	}
}

// classify reads the forwarded request from h and classifies it under p:
// the caller's tenant, api key and units (as the decision API reads them),
// and the endpoint the most specific of p's matches gives the original
// method and canonical path ("" when none takes it: a request for no named
// endpoint). A non-empty problem says what is wrong with the request.
func classify(p *policy.Policy, h http.Header) (req enforcer.Request, problem string) {
	methods, uris := h[HeaderForwardedMethod], h[HeaderForwardedURI]
	switch {
	case len(methods) == 0 || methods[0] == "":
		return req, "missing " + HeaderForwardedMethod + " header: the gateway must forward the original request's method (nginx: proxy_set_header X-Forwarded-Method $request_method)"
	case len(uris) == 0 || uris[0] == "":
		return req, "missing " + HeaderForwardedURI + " header: the gateway must forward the original request's URI (nginx: proxy_set_header X-Forwarded-Uri $request_uri)"
	case len(methods) > 1 || len(uris) > 1:
		return req, fmt.Sprintf("send %s and %s once each: the gateway must replace, not add to, what the client sent", HeaderForwardedMethod, HeaderForwardedURI)
	case !validMethodToken(methods[0]):
		return req, fmt.Sprintf("%s must be an HTTP method, 1 to %d letters, '-' or '_', not %q", HeaderForwardedMethod, maxMethodBytes, methods[0])
	}
	path, err := policy.CanonicalPath(uris[0])
	if err != nil {
		return req, fmt.Sprintf("%s: %v", HeaderForwardedURI, err)
	}
	if req, problem = parseCaller(h); problem != "" {
		return req, problem
	}
	req.Endpoint, _ = p.MatchEndpoint(methods[0], path)
	return req, ""
}

// validMethodToken reports whether m can be an HTTP method: a short token
// of letters (the methods matches name are upper case; a method is case
// sensitive, so "get" is not GET).
func validMethodToken(m string) bool {
	if len(m) == 0 || len(m) > maxMethodBytes {
		return false
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// writeRefusal answers a request that is not decided: the message in the
// JSON body and in X-Quota-Reason (gateways pass header fields on where
// they drop bodies), and the level it names, if any, in X-Quota-Level.
func writeRefusal(w http.ResponseWriter, status int, level enforcer.Level, message string) {
	if level != enforcer.LevelNone {
		w.Header().Set(HeaderLevel, string(level))
	}
	w.Header().Set(HeaderReason, quotaheaders.Text(message, quotaheaders.MaxReasonBytes))
	writeError(w, status, message)
}
