package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/quotaheaders"
)

// gatewayPlane is a plane whose endpoints forward auth tells apart by
// method and path, with no catch-all: a request no match takes is a
// request for no named endpoint. Free tenants hold 20 tokens; a generate
// costs 5.
func gatewayPlane(unknownTenants, unknownEndpoints string) string {
	return fmt.Sprintf(`apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: main}
spec:
  global: {rate: 1000, burst: 1000}
  unknownTenants: %s
  unknownEndpoints: %s
  tiers:
    - name: free
      tenant: {rate: 10, burst: 20}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: generate}
spec:
  endpoint: generate
  cost: 5
  match:
    - path: {type: Pattern, value: /v1/models/*/generate}
      methods: [POST]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: list-models}
spec:
  endpoint: list-models
  match:
    - path: {type: Exact, value: /v1/models}
      methods: [GET, HEAD]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: models}
spec:
  endpoint: models
  cost: 2
  match:
    - path: {type: PathPrefix, value: /v1/models}
`, unknownTenants, unknownEndpoints)
}

// frozen is the time of every decision in these tests: buckets never
// refill, so a bucket that moved was debited.
var frozen = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// gatewayAPI serves plane (YAML) on an engine whose clock stands still.
func gatewayAPI(t testing.TB, plane string) (http.Handler, *enforcer.Engine) {
	t.Helper()
	p := policytest.Compile(t, plane)
	e, err := enforcer.New(p, enforcer.WithClock(func() time.Time { return frozen }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return NewAPI(e, nil), e
}

// forward asks h at target (ForwardAuthPath or AuthRequestPath, perhaps
// with a query) about method uri as a gateway forwards it; headers are the
// client's fields the gateway copies (an empty value drops the field).
func forward(h http.Handler, target, method, uri string, headers map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.Header.Set(HeaderForwardedMethod, method)
	req.Header.Set(HeaderForwardedURI, uri)
	req.Header.Set("X-Forwarded-Host", "api.example.com")
	for k, v := range headers {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func caller(tenant string) map[string]string {
	return map[string]string{HeaderTenant: tenant, HeaderAPIKey: "k1"}
}

// buckets is what a request may change: the global bucket, the burst
// pool, and the tenant's levels, at the frozen time.
func buckets(e *enforcer.Engine, tenant string) string {
	s := planeBuckets(e)
	if ts, ok := e.TenantStatusAt(frozen, tenant); ok {
		for _, l := range ts.Limits {
			s += fmt.Sprintf(" %s/%s %d", l.Level, l.Name, l.Remaining)
		}
		s += fmt.Sprintf(" admitted %d", ts.AdmittedCost)
	}
	return s
}

// planeBuckets is the global bucket and the burst pool at the frozen time.
func planeBuckets(e *enforcer.Engine) string {
	plane := e.PlaneStatusAt(frozen)
	return fmt.Sprintf("global %d pool %d", plane.Global.Remaining, plane.PoolRemaining)
}

func TestClassifyForwardedRequests(t *testing.T) {
	p := policytest.Compile(t, gatewayPlane("default", "default"))
	for _, tc := range []struct{ method, uri, want string }{
		{"POST", "/v1/models/gpt/generate", "generate"},
		{"POST", "/v1/models/gpt/generate?stream=1", "generate"}, // the query is not the path
		{"POST", "/v1/models/x/../gpt/generate", "generate"},     // as the upstream reads it
		{"POST", "/v1/models/%67pt/generate", "generate"},
		{"POST", "//v1/models/gpt/generate/", "generate"}, // a trailing slash does not dodge a Pattern
		{"GET", "/v1/models/gpt/generate", "models"},      // methods narrow a match
		{"post", "/v1/models/gpt/generate", "models"},     // and a method is case sensitive
		{"GET", "/v1/models", "list-models"},              // exact before prefix
		{"HEAD", "/v1/models?page=2", "list-models"},
		{"POST", "/v1/models", "models"},
		{"GET", "/v1/models-old", ""}, // prefixes go segment by segment
		{"GET", "/", ""},
	} {
		h := http.Header{HeaderForwardedMethod: {tc.method}, HeaderForwardedURI: {tc.uri}, HeaderTenant: {"acme"}, HeaderAPIKey: {"k"}}
		req, problem := classify(p, h)
		if problem != "" || req.Endpoint != tc.want || req.Tenant != "acme" || req.APIKey != "k" {
			t.Errorf("%s %s: %+v %q; want endpoint %q", tc.method, tc.uri, req, problem, tc.want)
		}
	}
}

// TestForwardAuthAllowsThenDenies: a free tenant's 20 tokens are four
// generates; the fifth is denied with every header a gateway hands the
// client: a 429 at /forward-auth, a 403 at /auth-request (nginx's), never
// anything the query asks for (Caddy passes the client's query along).
func TestForwardAuthAllowsThenDenies(t *testing.T) {
	h, e := gatewayAPI(t, gatewayPlane("default", "default"))
	for i := range 4 {
		rec := forward(h, ForwardAuthPath, "POST", "/v1/models/gpt/generate", caller("free-1"))
		if rec.Code != http.StatusOK || rec.Body.Len() != 0 {
			t.Fatalf("generate %d: %d %q; want 200 without a body", i+1, rec.Code, rec.Body)
		}
		if rec.Header().Get(HeaderRateLimit) == "" || rec.Header().Get(HeaderRateLimitPolicy) == "" || rec.Header().Get("Retry-After") != "" {
			t.Fatalf("generate %d: header %v; want RateLimit and RateLimit-Policy, no Retry-After", i+1, rec.Header())
		}
	}
	before := buckets(e, "free-1")
	for _, tc := range []struct {
		target string
		status int
	}{{ForwardAuthPath, 429}, {ForwardAuthPath + "?deny-status=403&page=2", 429}, {AuthRequestPath, 403}, {AuthRequestPath + "?x=1", 403}} {
		rec := forward(h, tc.target, "POST", "/v1/models/gpt/generate", caller("free-1"))
		if rec.Code != tc.status {
			t.Fatalf("%s: status %d %s; want %d", tc.target, rec.Code, rec.Body, tc.status)
		}
		want := map[string]string{
			"Retry-After":         "1",
			HeaderLevel:           "tenant",
			HeaderRateLimit:       `"tenant";r=0;t=1`,
			HeaderRateLimitPolicy: `"global";q=1000;w=1, "tenant";q=10;w=1`,
		}
		for name, value := range want {
			if got := rec.Header().Get(name); got != value {
				t.Errorf("%s: %s %q; want %q", tc.target, name, got, value)
			}
		}
		if got := rec.Header().Get(HeaderReason); !strings.Contains(got, "tenant limit") {
			t.Errorf("%s: %s %q; want it to name the tenant limit", tc.target, HeaderReason, got)
		}
		var body decision
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Endpoint != "generate" || body.Cost != 5 || body.Level != "tenant" {
			t.Errorf("%s: body %s (%v); want the decision: endpoint generate, cost 5, level tenant", tc.target, rec.Body, err)
		}
	}
	if after := buckets(e, "free-1"); after != before {
		t.Errorf("denials moved buckets: %s, then %s", before, after)
	}
	// A request no match takes is for no named endpoint: cost 1 and no
	// endpoint limit (unknownEndpoints: default).
	before = buckets(e, "free-2")
	if rec := forward(h, ForwardAuthPath, "GET", "/elsewhere", caller("free-2")); rec.Code != http.StatusOK {
		t.Errorf("a request for no named endpoint: %d %s; want 200", rec.Code, rec.Body)
	}
	if ts, _ := e.TenantStatusAt(frozen, "free-2"); ts.AdmittedCost != 1 {
		t.Errorf("a request for no named endpoint cost %d; want 1 (buckets %s, then %s)", ts.AdmittedCost, before, buckets(e, "free-2"))
	}
}

// TestForwardAuthTakesAnyMethod: Caddy and nginx ask with GET, Traefik
// with the original request's method; the forwarded method is what counts.
func TestForwardAuthTakesAnyMethod(t *testing.T) {
	h, _ := gatewayAPI(t, gatewayPlane("default", "default"))
	for i, method := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		req := httptest.NewRequest(method, []string{ForwardAuthPath, AuthRequestPath}[i%2], nil)
		req.Header = http.Header{HeaderForwardedMethod: {"POST"}, HeaderForwardedURI: {"/v1/models/a/generate"},
			HeaderTenant: {"t-" + method}, HeaderAPIKey: {"k"}}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get(HeaderRateLimitPolicy), `"tenant";q=10`) {
			t.Errorf("%s %s: %d %v; want 200 with the tenant's limits", method, req.URL, rec.Code, rec.Header())
		}
	}
}

// TestForwardAuthRefusals: what is wrong with a forwarded request, or why
// the plane refuses it, is a 400 or a 403 that says so, in the body and in
// X-Quota-Reason, never with Retry-After, and never moving a bucket. At
// /auth-request all of them are 403s (nginx passes nothing else on).
func TestForwardAuthRefusals(t *testing.T) {
	open, openEngine := gatewayAPI(t, gatewayPlane("default", "default"))
	strict, strictEngine := gatewayAPI(t, gatewayPlane("deny", "deny"))
	with := func(k, v string) map[string]string {
		m := caller("free-1")
		m[k] = v
		return m
	}
	cases := []struct {
		name        string
		strict      bool
		method, uri string
		headers     map[string]string
		status      int
		level       string
		says        string
	}{
		{name: "no method", method: "", uri: "/v1/models", headers: caller("free-1"), status: 400, says: "missing X-Forwarded-Method"},
		{name: "no uri", method: "GET", uri: "", headers: caller("free-1"), status: 400, says: "missing X-Forwarded-Uri"},
		{name: "method not a token", method: "GET /", uri: "/v1/models", headers: caller("free-1"), status: 400, says: "must be an HTTP method"},
		{name: "relative uri", method: "GET", uri: "v1/models", headers: caller("free-1"), status: 400, says: "X-Forwarded-Uri: the path"},
		{name: "absolute-form uri", method: "GET", uri: "http://h/v1/models", headers: caller("free-1"), status: 400, says: "does not start with '/'"},
		{name: "bad percent-encoding", method: "GET", uri: "/v1/%zz", headers: caller("free-1"), status: 400, says: "bad percent-encoding"},
		{name: "raw non-ASCII", method: "GET", uri: "/v1/caf\xc3\xa9", headers: caller("free-1"), status: 400, says: "non-ASCII"},
		{name: "uri too long", method: "GET", uri: "/" + strings.Repeat("a", policy.MaxPathBytes), headers: caller("free-1"), status: 400, says: "longer than"},
		{name: "no tenant", method: "GET", uri: "/v1/models", headers: with(HeaderTenant, ""), status: 400, says: "missing X-Tenant"},
		{name: "no key", method: "GET", uri: "/v1/models", headers: with(HeaderAPIKey, ""), status: 400, says: "missing X-Api-Key"},
		{name: "tenant with a space", method: "GET", uri: "/v1/models", headers: with(HeaderTenant, "a b"), status: 400, says: "tenant has byte 0x20 at offset 1"},
		{name: "units zero", method: "GET", uri: "/v1/models", headers: with(HeaderUnits, "0"), status: 400, says: "X-Quota-Units must be"},
		{name: "unknown tenant", strict: true, method: "GET", uri: "/v1/models", headers: caller("free-1"), status: 403, level: "tenant", says: "unknown tenant"},
		{name: "no endpoint", strict: true, method: "GET", uri: "/v2", headers: caller("free-1"), status: 403, level: "endpoint", says: "unknown endpoint"},
	}
	for _, tc := range cases {
		for _, target := range []string{ForwardAuthPath, AuthRequestPath} {
			t.Run(tc.name+target, func(t *testing.T) {
				h, e := open, openEngine
				if tc.strict {
					h, e = strict, strictEngine
				}
				tenant := tc.headers[HeaderTenant]
				before := buckets(e, tenant)
				req := httptest.NewRequest(http.MethodGet, target, nil)
				for k, v := range tc.headers {
					if v != "" {
						req.Header[k] = []string{v}
					}
				}
				if tc.method != "" {
					req.Header[HeaderForwardedMethod] = []string{tc.method}
				}
				if tc.uri != "" {
					req.Header[HeaderForwardedURI] = []string{tc.uri}
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				status := tc.status
				if target == AuthRequestPath {
					status = 403
				}
				if rec.Code != status || !strings.Contains(rec.Body.String(), tc.says) {
					t.Errorf("status %d body %s; want %d saying %q", rec.Code, rec.Body, status, tc.says)
				}
				if got := rec.Header().Get(HeaderReason); !strings.Contains(got, quotaheaders.Text(tc.says, quotaheaders.MaxReasonBytes)) {
					t.Errorf("%s %q; want it to say %q", HeaderReason, got, tc.says)
				}
				if got := rec.Header().Get(HeaderLevel); got != tc.level {
					t.Errorf("%s %q; want %q", HeaderLevel, got, tc.level)
				}
				if got := rec.Header().Get("Retry-After"); got != "" {
					t.Errorf("Retry-After %q on a refusal: retrying will not help", got)
				}
				if after := buckets(e, tenant); after != before {
					t.Errorf("a refusal moved buckets: %s, then %s", before, after)
				}
			})
		}
	}
}

func TestForwardAuthRefusesDuplicates(t *testing.T) {
	h, _ := gatewayAPI(t, gatewayPlane("default", "default"))
	for _, name := range []string{HeaderForwardedMethod, HeaderForwardedURI, HeaderTenant, HeaderAPIKey, HeaderUnits} {
		req := httptest.NewRequest(http.MethodGet, ForwardAuthPath, nil)
		req.Header = http.Header{HeaderForwardedMethod: {"GET"}, HeaderForwardedURI: {"/v1/models"}, HeaderTenant: {"acme"}, HeaderAPIKey: {"k"}}
		req.Header[name] = append(req.Header[name], "1", "2")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "once") {
			t.Errorf("%s sent twice: %d %s; want 400 asking for it once", name, rec.Code, rec.Body)
		}
	}
}

// TestKeyNotBoundIsRefused: on a plane that binds api keys to tenants, a
// key that is not the tenant's is a 403 naming the key level, with the
// reason in X-Quota-Reason and the body and without Retry-After, on the
// decision API and on forward auth alike; the key itself is never echoed.
func TestKeyNotBoundIsRefused(t *testing.T) {
	plane := strings.Replace(gatewayPlane("default", "default"), "  unknownEndpoints: default\n", "  unknownEndpoints: default\n  keyBinding: bound\n", 1) + `---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec:
  tenant: acme
  tier: free
  keyHashes: ["` + policy.HashKey("acme-key") + `"]
`
	h, e := gatewayAPI(t, plane)
	const stolen = "someone-elses-key"
	before := buckets(e, "acme")
	for _, rec := range []*httptest.ResponseRecorder{
		post(h, "/api/generate", map[string]string{HeaderTenant: "acme", HeaderAPIKey: stolen}, ""),
		forward(h, ForwardAuthPath, "POST", "/v1/models/a/generate", map[string]string{HeaderTenant: "acme", HeaderAPIKey: stolen}),
		forward(h, AuthRequestPath, "POST", "/v1/models/a/generate", map[string]string{HeaderTenant: "acme", HeaderAPIKey: stolen}),
	} {
		reason := rec.Header().Get(HeaderReason)
		var body struct{ Error string }
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != http.StatusForbidden || rec.Header().Get(HeaderLevel) != "key" || rec.Header().Get("Retry-After") != "" ||
			!strings.Contains(reason, `not a key of tenant "acme"`) || body.Error != reason {
			t.Errorf("a key not acme's: %d %v %s; want 403, %s key, the reason in %s and the body, no Retry-After",
				rec.Code, rec.Header(), rec.Body, HeaderLevel, HeaderReason)
		}
		if strings.Contains(rec.Body.String()+fmt.Sprint(rec.Header()), stolen) {
			t.Errorf("the answer echoes the api key: %v %s", rec.Header(), rec.Body)
		}
	}
	if after := buckets(e, "acme"); after != before {
		t.Errorf("refusals moved buckets: %s, then %s", before, after)
	}
	if rec := forward(h, ForwardAuthPath, "POST", "/v1/models/a/generate", map[string]string{HeaderTenant: "acme", HeaderAPIKey: "acme-key"}); rec.Code != http.StatusOK {
		t.Errorf("acme's own key: %d %s; want 200", rec.Code, rec.Body)
	}
}
