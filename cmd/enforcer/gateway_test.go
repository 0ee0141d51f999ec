package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// TestRateLimitAttribution: each level fires in turn and is named in the
// descriptor's status (code, current_limit, limit_remaining) and in
// X-Quota-Level; hits_addend, the request's and a descriptor's own, is
// the units.
func TestRateLimitAttribution(t *testing.T) {
	p := startEnforcer(t, writePlane(t, planeYAML("", "")))
	client := rlsv3.NewRateLimitServiceClient(p.dial())

	// key: acme's k-small, 3 an hour.
	for left := int64(2); left >= 0; left-- {
		resp := rls(t, client, 0, desc("tenant=acme", "endpoint=read", "api_key=k-small"))
		st, h := resp.Statuses[0], headers(t, resp)
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.CurrentLimit.GetName() != "key" || int64(st.LimitRemaining) != left {
			t.Fatalf("key, %d left: %v", left, resp)
		}
		// t: until the key's bucket is full again, 1,200 s a token.
		if h["RateLimit"] != `"key";r=`+itoa(left)+`;t=`+itoa((3-left)*1200) || h["X-Quota-Level"] != "" || h["Retry-After"] != "" {
			t.Fatalf("allowed headers with %d left: %v", left, h)
		}
	}
	resp := rls(t, client, 0, desc("tenant=acme", "endpoint=read", "api_key=k-small"))
	expectDenied(t, resp, "key", 3, rlsv3.RateLimitResponse_RateLimit_HOUR, 0)
	if h := headers(t, resp); !strings.HasPrefix(h["RateLimit"], `"key";r=0;t=`) || !strings.Contains(h["RateLimit-Policy"], `"key";q=3;w=3600`) {
		t.Fatalf("key denial headers: %v", h)
	}

	// endpoint: write costs 5, 10 per 5 minutes per tenant.
	for i := 0; i < 2; i++ {
		if resp := rls(t, client, 0, desc("tenant=beta", "endpoint=write", "api_key=k1")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("write %d: %v", i, resp)
		}
	}
	resp = rls(t, client, 0, desc("tenant=beta", "endpoint=write", "api_key=k1"))
	expectDenied(t, resp, "endpoint", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE, 5)

	// tenant: gamma is not named (unknownTenants default: tier basic, 100 a
	// day); no api_key entry skips the key level. Request-level hits 60,
	// then 41 (over), then a descriptor's own 40 over the request's 41.
	resp = rls(t, client, 60, desc("tenant=gamma", "endpoint=read"))
	if st := resp.Statuses[0]; resp.OverallCode != rlsv3.RateLimitResponse_OK || st.CurrentLimit.GetName() != "tenant" || st.LimitRemaining != 40 {
		t.Fatalf("60 units: %v", resp)
	}
	resp = rls(t, client, 41, desc("tenant=gamma", "endpoint=read"))
	expectDenied(t, resp, "tenant", 100, rlsv3.RateLimitResponse_RateLimit_DAY, 0)
	resp = rls(t, client, 41, withHits(desc("tenant=gamma", "endpoint=read"), 40))
	if st := resp.Statuses[0]; resp.OverallCode != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 0 {
		t.Fatalf("the descriptor's own 40 units over the request's 41: %v", resp)
	}
	if left, _ := p.remaining("gamma"); left["tenant"] != 0 {
		t.Fatalf("gamma's tenant level after 100 units: %v", left)
	}

	// global: 1,000 an hour, of which 113 are spent above; whale's own
	// limit is 100,000 a day. More than the global limit holds is denied
	// there, saying it can never pass; 950 are denied as used up.
	resp = rls(t, client, 1001, desc("tenant=whale", "endpoint=read"))
	if h := headers(t, resp); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h["X-Quota-Level"] != "global" || !strings.Contains(h["X-Quota-Reason"], "can never pass") {
		t.Fatalf("1,001 units against a global limit of 1,000: %v", resp)
	}
	resp = rls(t, client, 950, desc("tenant=whale", "endpoint=read"))
	expectDenied(t, resp, "global", 1000, rlsv3.RateLimitResponse_RateLimit_HOUR, 0)
}

// expectDenied checks a one-descriptor OVER_LIMIT at level.
func expectDenied(t *testing.T, resp *rlsv3.RateLimitResponse, level string, perUnit uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, multiplier uint32) {
	t.Helper()
	st, h := resp.Statuses[0], headers(t, resp)
	var gotMultiplier uint32
	if st.GetCurrentLimit().GetUnitMultiplier() != nil {
		gotMultiplier = st.CurrentLimit.UnitMultiplier.Value
	}
	switch {
	case resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.Code != rlsv3.RateLimitResponse_OVER_LIMIT:
		t.Fatalf("want OVER_LIMIT at %s: %v", level, resp)
	case st.CurrentLimit.GetName() != level || st.CurrentLimit.GetRequestsPerUnit() != perUnit || st.CurrentLimit.GetUnit() != unit || gotMultiplier != multiplier:
		t.Fatalf("want current_limit %s %d per %v ×%d: %v", level, perUnit, unit, multiplier, st.CurrentLimit)
	case st.DurationUntilReset.AsDuration() <= 0:
		t.Fatalf("no duration_until_reset on a denial: %v", st)
	case h["X-Quota-Level"] != level || h["Retry-After"] == "" || !strings.Contains(h["X-Quota-Reason"], "is used up"):
		t.Fatalf("want X-Quota-Level %s, Retry-After and a reason: %v", level, h)
	case !strings.HasPrefix(h["RateLimit"], `"`+level+`";r=`) || h["RateLimit-Policy"] == "":
		t.Fatalf("want RateLimit of %s and RateLimit-Policy: %v", level, h)
	}
}

// TestRateLimitAllOrNothing: a request's descriptors are decided
// together; when one is over its limit, the others' buckets do not move.
func TestRateLimitAllOrNothing(t *testing.T) {
	p := startEnforcer(t, writePlane(t, planeYAML("", "")))
	client := rlsv3.NewRateLimitServiceClient(p.dial())
	for i := 0; i < 2; i++ { // beta's write endpoint: 10 of 10 taken
		rls(t, client, 0, desc("tenant=beta", "endpoint=write", "api_key=k1"))
	}
	rls(t, client, 0, desc("tenant=acme", "endpoint=read", "api_key=k1"))
	acme, _ := p.remaining("acme")
	beta, _ := p.remaining("beta")
	if acme["tenant"] != 99 || acme[keyLimit("k1")] != 49 || acme["global"] != 989 {
		t.Fatalf("acme before: %v", acme)
	}

	resp := rls(t, client, 0, desc("tenant=acme", "endpoint=read", "api_key=k1"), desc("tenant=beta", "endpoint=write", "api_key=k1"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT || headers(t, resp)["X-Quota-Level"] != "endpoint" {
		t.Fatalf("acme read + beta write over its endpoint limit: %v", resp)
	}
	if got, _ := p.remaining("acme"); !equalMaps(got, acme) {
		t.Fatalf("the group was refused but acme's buckets moved: %v → %v", acme, got)
	}
	if got, _ := p.remaining("beta"); !equalMaps(got, beta) {
		t.Fatalf("the group was refused but beta's buckets moved: %v → %v", beta, got)
	}

	// Two descriptors of one tenant that each fit alone but not together.
	resp = rls(t, client, 0, withHits(desc("tenant=acme", "endpoint=read"), 60), withHits(desc("tenant=acme", "endpoint=read"), 60))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || headers(t, resp)["X-Quota-Level"] != "tenant" {
		t.Fatalf("60 + 60 units of a tenant with 99 left: %v", resp)
	}
	if got, _ := p.remaining("acme"); !equalMaps(got, acme) {
		t.Fatalf("60 + 60 was refused but acme's buckets moved: %v → %v", acme, got)
	}

	// A group that passes is debited in full.
	resp = rls(t, client, 0, desc("tenant=acme", "endpoint=read", "api_key=k1"), desc("tenant=acme", "endpoint=read", "api_key=k2"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 2 {
		t.Fatalf("two reads of acme: %v", resp)
	}
	got, _ := p.remaining("acme")
	if got["tenant"] != 97 || got[keyLimit("k1")] != 48 || got[keyLimit("k2")] != 49 || got["global"] != 987 {
		t.Fatalf("after two admitted reads: %v", got)
	}
}

// keyLimit names a key's limit as remaining does: the debug view shows a
// key's short hash, never the key.
func keyLimit(key string) string { return "key/" + policy.ShortKeyHash(key) }

func equalMaps(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestUnknownNames: a tenant the plane does not name gets the default
// tier under unknownTenants default, and is refused (OVER_LIMIT with
// X-Quota-Level tenant; ext_authz 403) under deny, as is an unknown
// endpoint under unknownEndpoints deny; refusals debit nothing.
func TestUnknownNames(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		p := startEnforcer(t, writePlane(t, planeYAML("  unknownTenants: default\n", "")))
		client := rlsv3.NewRateLimitServiceClient(p.dial())
		resp := rls(t, client, 0, desc("tenant=stranger", "endpoint=nowhere"))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 99 {
			t.Fatalf("an unknown tenant on an unknown endpoint under default: %v", resp)
		}
	})
	t.Run("deny", func(t *testing.T) {
		p := startEnforcer(t, writePlane(t, planeYAML("  unknownTenants: deny\n  unknownEndpoints: deny\n", "")))
		conn := p.dial()
		client := rlsv3.NewRateLimitServiceClient(conn)
		rls(t, client, 0, desc("tenant=acme", "endpoint=read"))
		before, _ := p.remaining("acme")

		resp := rls(t, client, 0, desc("tenant=acme", "endpoint=read"), desc("tenant=stranger", "endpoint=read"))
		h := headers(t, resp)
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
			resp.Statuses[0].Code != rlsv3.RateLimitResponse_UNKNOWN || h["X-Quota-Level"] != "tenant" ||
			!strings.Contains(h["X-Quota-Reason"], `"stranger" is not a tenant of plane gw`) || h["Retry-After"] != "" {
			t.Fatalf("an unknown tenant under deny: %v", resp)
		}
		resp = rls(t, client, 0, desc("tenant=acme", "endpoint=nowhere"))
		h = headers(t, resp)
		if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h["X-Quota-Level"] != "endpoint" || !strings.Contains(h["X-Quota-Reason"], `"nowhere" is not an endpoint`) {
			t.Fatalf("an unknown endpoint under deny: %v", resp)
		}
		if after, _ := p.remaining("acme"); !equalMaps(after, before) {
			t.Fatalf("refusals moved acme's buckets: %v → %v", before, after)
		}
		if _, ok := p.remaining("stranger"); ok {
			t.Fatal("a refused unknown tenant has state")
		}

		check := checkClient(conn)
		ans := check(t, "GET", "/v1/read", map[string]string{"x-tenant": "stranger", "x-api-key": "k"}, nil)
		if ans.status != 403 || ans.headers["X-Quota-Level"] != "tenant" || !strings.Contains(ans.body, "not a tenant") {
			t.Fatalf("ext_authz, an unknown tenant under deny: %+v", ans)
		}
		ans = check(t, "GET", "/elsewhere", map[string]string{"x-tenant": "acme", "x-api-key": "k"}, nil)
		if ans.status != 403 || ans.headers["X-Quota-Level"] != "endpoint" {
			t.Fatalf("ext_authz, a path no endpoint matches under deny: %+v", ans)
		}
	})
}

// TestRateLimitBadRequests: requests that are too large or malformed get
// the right code and a message that says what to fix, and debit nothing.
func TestRateLimitBadRequests(t *testing.T) {
	p := startEnforcer(t, writePlane(t, planeYAML("", "")))
	client := rlsv3.NewRateLimitServiceClient(p.dial())
	rls(t, client, 0, desc("tenant=acme", "endpoint=read"))
	before, _ := p.remaining("acme")

	many := make([]*ratelimitv3.RateLimitDescriptor, 1000)
	for i := range many {
		many[i] = desc("tenant=acme", "endpoint=read")
	}
	wide := desc("tenant=acme")
	for range 16 {
		wide.Entries = append(wide.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "generic_key", Value: "x"})
	}
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		code codes.Code
		want string
	}{
		{"1 MiB", &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant=acme", "generic_key="+strings.Repeat("x", 1<<20))}},
			codes.ResourceExhausted, "larger than max"},
		{"1,000 descriptors", &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: many}, codes.ResourceExhausted, "1000 descriptors in one request; at most 64"},
		{"17 entries", &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{wide}}, codes.InvalidArgument, "descriptor 0: 17 entries; at most 16"},
		{"another domain", &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant=acme")}},
			codes.InvalidArgument, `this enforcer serves domain "gw"`},
		{"no tenant", &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant=acme"), desc("user=acme")}},
			codes.InvalidArgument, `descriptor 1: no tenant entry: looked for the key "tenant"`},
		// A bad value is the client's (Envoy copies it from a header): an
		// OVER_LIMIT answer, which no failure mode lets through.
		{"a tenant with a space", &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant=acme"), desc("tenant=a b")}},
			codes.OK, "descriptor 1: invalid request: tenant has byte 0x20 at offset 1"},
		{"an endpoint with a slash", &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("tenant=acme", "endpoint=/v1/read")}},
			codes.OK, "descriptor 0: invalid request: endpoint"},
		{"too many units", &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("tenant=acme"), 1<<40)}},
			codes.InvalidArgument, "hits_addend 1099511627776 out of range [0, 1000000]"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.ShouldRateLimit(ctx, tc.req)
		cancel()
		if tc.code == codes.OK {
			var reason string
			for _, h := range resp.GetResponseHeadersToAdd() {
				if h.GetKey() == "X-Quota-Reason" {
					reason = h.GetValue()
				}
			}
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || !strings.Contains(reason, tc.want) {
				t.Errorf("%s: got %v, %v; want OVER_LIMIT with X-Quota-Reason containing %q", tc.name, resp, err, tc.want)
			}
			continue
		}
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: got %v, want %v containing %q", tc.name, err, tc.code, tc.want)
		}
	}
	if after, _ := p.remaining("acme"); !equalMaps(after, before) {
		t.Fatalf("refused requests moved acme's buckets: %v → %v", before, after)
	}
	// The connection is still good after the refusals.
	if resp := rls(t, client, 0, desc("tenant=acme", "endpoint=read")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the refusals: %v", resp)
	}
}

// TestHealthAndReflection: health says SERVING for the server and for each
// service, and reflection lists both services.
func TestHealthAndReflection(t *testing.T) {
	p := startEnforcer(t, writePlane(t, planeYAML("", "")))
	conn := p.dial()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, service := range []string{"", "envoy.service.ratelimit.v3.RateLimitService", "envoy.service.auth.v3.Authorization"} {
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q: %v, %v", service, resp, err)
		}
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, s := range resp.GetListServicesResponse().GetService() {
		listed[s.Name] = true
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "envoy.service.auth.v3.Authorization", "grpc.health.v1.Health"} {
		if !listed[want] {
			t.Errorf("reflection does not list %s: %v", want, listed)
		}
	}
}

// TestKeyBinding: with keyBinding bound, tenant alpha's request with
// tenant bravo's key is refused at level key on both surfaces, and neither
// tenant's buckets move; the reason never shows the key.
func TestKeyBinding(t *testing.T) {
	const alphaKey, bravoKey = "alpha-secret-key-1", "bravo-secret-key-1"
	docs := `
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata:
  name: alpha
spec:
  tenant: alpha
  tier: basic
  keyHashes: ["` + policy.HashKey(alphaKey) + `"]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata:
  name: bravo
spec:
  tenant: bravo
  tier: basic
  keyHashes: ["` + policy.HashKey(bravoKey) + `"]
`
	p := startEnforcer(t, writePlane(t, planeYAML("  keyBinding: bound\n", docs)))
	conn := p.dial()
	client := rlsv3.NewRateLimitServiceClient(conn)
	for _, own := range [][2]string{{"alpha", alphaKey}, {"bravo", bravoKey}} {
		if resp := rls(t, client, 0, desc("tenant="+own[0], "endpoint=read", "api_key="+own[1])); resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s with its own key: %v", own[0], resp)
		}
	}
	alpha, _ := p.remaining("alpha")
	bravo, _ := p.remaining("bravo")

	resp := rls(t, client, 0, desc("tenant=alpha", "endpoint=read", "api_key="+bravoKey))
	h := headers(t, resp)
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || h["X-Quota-Level"] != "key" || !strings.Contains(h["X-Quota-Reason"], `is not a key of tenant "alpha"`) {
		t.Fatalf("alpha with bravo's key: %v", resp)
	}
	resp = rls(t, client, 0, desc("tenant=alpha", "endpoint=read"))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || headers(t, resp)["X-Quota-Level"] != "key" {
		t.Fatalf("alpha without a key: %v", resp)
	}
	ans := checkClient(conn)(t, "GET", "/v1/read", map[string]string{"x-tenant": "alpha", "x-api-key": bravoKey}, nil)
	if ans.status != 403 || ans.headers["X-Quota-Level"] != "key" {
		t.Fatalf("ext_authz, alpha with bravo's key: %+v", ans)
	}
	for _, text := range []string{h["X-Quota-Reason"], ans.body, ans.headers["X-Quota-Reason"]} {
		if strings.Contains(text, bravoKey) {
			t.Fatalf("a refusal shows the key: %q", text)
		}
	}
	if got, _ := p.remaining("alpha"); !equalMaps(got, alpha) {
		t.Fatalf("alpha's buckets moved: %v → %v", alpha, got)
	}
	if got, _ := p.remaining("bravo"); !equalMaps(got, bravo) {
		t.Fatalf("bravo's buckets moved: %v → %v", bravo, got)
	}
}

// checkAnswer is a Check response as a client would see it.
type checkAnswer struct {
	allowed bool
	status  int
	headers map[string]string
	body    string
}

// checkClient returns a function that calls Check for a request of method
// and path with headers and context extensions.
func checkClient(conn *grpc.ClientConn) func(t *testing.T, method, path string, h, extensions map[string]string) checkAnswer {
	client := authv3.NewAuthorizationClient(conn)
	return func(t *testing.T, method, path string, h, extensions map[string]string) checkAnswer {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			ContextExtensions: extensions,
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: method, Path: path, Headers: h,
			}},
		}})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		ans := checkAnswer{headers: map[string]string{}}
		var fields []*corev3.HeaderValueOption
		if ok := resp.GetOkResponse(); ok != nil {
			ans.allowed, ans.status, fields = true, 200, ok.ResponseHeadersToAdd
			if resp.Status.GetCode() != int32(codes.OK) {
				t.Fatalf("an OkResponse with status %v", resp.Status)
			}
		} else {
			denied := resp.GetDeniedResponse()
			ans.status, fields, ans.body = int(denied.GetStatus().GetCode()), denied.GetHeaders(), denied.GetBody()
			if resp.Status.GetCode() == int32(codes.OK) {
				t.Fatalf("a DeniedResponse with status OK")
			}
		}
		for _, f := range fields {
			ans.headers[f.Header.Key] = f.Header.Value
		}
		return ans
	}
}

// TestExtAuthz: Check classifies the original request (path and method,
// or the route's context extension), allows with the RateLimit fields,
// denies with 429 and the decision API's headers and body, and answers a
// malformed request with a 400.
func TestExtAuthz(t *testing.T) {
	p := startEnforcer(t, writePlane(t, planeYAML("", "")))
	check := checkClient(p.dial())
	caller := func(tenant string, more ...string) map[string]string {
		h := map[string]string{"x-tenant": tenant, "x-api-key": "k1"}
		for i := 0; i+1 < len(more); i += 2 {
			h[more[i]] = more[i+1]
		}
		return h
	}

	ans := check(t, "GET", "/v1/read/7?full=1", caller("acme"), nil)
	if !ans.allowed || ans.headers["RateLimit"] == "" || !strings.Contains(ans.headers["RateLimit-Policy"], `"tenant";q=100;w=86400`) {
		t.Fatalf("a read: %+v", ans)
	}
	// POST /v1/items is write (cost 5, 10 per 5 minutes): 2 pass.
	for i := 0; i < 2; i++ {
		if ans := check(t, "POST", "/v1/items", caller("beta"), nil); !ans.allowed {
			t.Fatalf("write %d: %+v", i, ans)
		}
	}
	ans = check(t, "POST", "/v1/items", caller("beta"), nil)
	var body struct {
		Allowed bool   `json:"allowed"`
		Level   string `json:"level"`
		Cost    int64  `json:"cost"`
	}
	if err := json.Unmarshal([]byte(ans.body), &body); err != nil {
		t.Fatalf("429 body %q: %v", ans.body, err)
	}
	if ans.status != 429 || ans.headers["X-Quota-Level"] != "endpoint" || ans.headers["Retry-After"] == "" ||
		ans.headers["Content-Type"] != "application/json" || body.Allowed || body.Level != "endpoint" || body.Cost != 5 {
		t.Fatalf("the third write: %+v", ans)
	}
	// GET /v1/items is no endpoint (the match needs POST): cost 1, allowed.
	if ans := check(t, "GET", "/v1/items", caller("beta"), nil); !ans.allowed {
		t.Fatalf("GET /v1/items: %+v", ans)
	}
	// The route names the endpoint: write again, whatever the path.
	if ans := check(t, "GET", "/anything", caller("beta"), map[string]string{"quotaplane-endpoint": "write"}); ans.status != 429 || ans.headers["X-Quota-Level"] != "endpoint" {
		t.Fatalf("a route naming write: %+v", ans)
	}
	// Units: 2 × 5 for delta, then nothing is left of its write limit.
	if ans := check(t, "POST", "/v1/items", caller("delta", "x-quota-units", "2"), nil); !ans.allowed {
		t.Fatalf("2 units of write: %+v", ans)
	}
	if ans := check(t, "POST", "/v1/items", caller("delta"), nil); ans.status != 429 {
		t.Fatalf("after 2 units of write: %+v", ans)
	}

	before, _ := p.remaining("acme")
	for _, tc := range []struct {
		name string
		h    map[string]string
		path string
		want string
	}{
		{"no tenant", map[string]string{"x-api-key": "k1"}, "/v1/read", "missing X-Tenant header"},
		{"no key", map[string]string{"x-tenant": "acme"}, "/v1/read", "missing X-Api-Key header"},
		{"bad units", caller("acme", "x-quota-units", "lots"), "/v1/read", "X-Quota-Units must be a whole number"},
		{"bad path", caller("acme"), "v1/read", "does not start with '/'"},
	} {
		ans := check(t, "GET", tc.path, tc.h, nil)
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal([]byte(ans.body), &e)
		if ans.status != 400 || !strings.Contains(e.Error, tc.want) {
			t.Errorf("%s: got %+v, want 400 with %q", tc.name, ans, tc.want)
		}
	}
	if after, _ := p.remaining("acme"); !equalMaps(after, before) {
		t.Fatalf("400s moved acme's buckets: %v → %v", before, after)
	}
}

// TestGlobalOverExtAuthz: the global level fires over ext_authz too.
func TestGlobalOverExtAuthz(t *testing.T) {
	p := startEnforcer(t, writePlane(t, planeYAML("", "")))
	check := checkClient(p.dial())
	ans := check(t, "GET", "/v1/read", map[string]string{"x-tenant": "whale", "x-api-key": "k1", "x-quota-units": "1001"}, nil)
	if ans.status != 429 || ans.headers["X-Quota-Level"] != "global" {
		t.Fatalf("1,001 units against a global limit of 1,000: %+v", ans)
	}
	ans = check(t, "GET", "/v1/read", map[string]string{"x-tenant": "acme", "x-api-key": "k-small", "x-quota-units": "4"}, nil)
	if ans.status != 429 || ans.headers["X-Quota-Level"] != "key" {
		t.Fatalf("4 units against a key limit of 3: %+v", ans)
	}
	ans = check(t, "GET", "/v1/read", map[string]string{"x-tenant": "acme", "x-api-key": "k1", "x-quota-units": "101"}, nil)
	if ans.status != 429 || ans.headers["X-Quota-Level"] != "tenant" {
		t.Fatalf("101 units against a tenant limit of 100: %+v", ans)
	}
}

// TestGracefulShutdown: SIGTERM stops the enforcer with exit status 0,
// and its gRPC listener is gone.
func TestGracefulShutdown(t *testing.T) {
	p := startEnforcer(t, writePlane(t, planeYAML("", "")))
	conn := p.dial()
	p.waitServing(conn)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the enforcer did not stop within 20 s of SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit status %d:\n%s", code, p.output())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatal("gRPC answered after the enforcer stopped")
	}
}

// TestSIGTERMDrains: on SIGTERM the enforcer fails readiness at once and
// keeps deciding for the drain (-drain), then exits 0. It used to exit
// 10–23 ms after SIGTERM with /readyz still 200, so clients behind a
// Service got refused connections.
func TestSIGTERMDrains(t *testing.T) {
	const drain = 1500 * time.Millisecond
	p := startEnforcer(t, writePlane(t, planeYAML("", "")), "-drain", drain.String())
	get := func(url string, headers map[string]string, method string) int {
		req, _ := http.NewRequest(method, url, nil)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	sent := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitFor("/readyz to answer 503", func() bool { return get("http://"+p.adminAddr+"/readyz", nil, "GET") == http.StatusServiceUnavailable })
	if failed := time.Since(sent); failed > drain/2 {
		t.Errorf("readiness failed %s after SIGTERM; want at once", failed)
	}
	if code := get("http://"+p.apiAddr+"/api/read", map[string]string{"X-Tenant": "acme", "X-Api-Key": "k1"}, "POST"); code != http.StatusOK {
		t.Errorf("a decision during the drain: status %d; want 200", code)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the enforcer did not stop within 20 s of SIGTERM")
	}
	if took := time.Since(sent); took < drain || p.cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("exited %s after SIGTERM with status %d; want after the %s drain, status 0", took, p.cmd.ProcessState.ExitCode(), drain)
	}
}

// TestGRPCDisabled: -grpc-listen "" serves no gRPC; the API still decides.
func TestGRPCDisabled(t *testing.T) {
	p := startEnforcer(t, writePlane(t, planeYAML("", "")), "-grpc-listen", "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(p.dial()).Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("gRPC with -grpc-listen \"\": got %v, want no server", err)
	}
	if code, body := apiCall(t, &http.Client{Timeout: 10 * time.Second}, "http://"+p.apiAddr, ""); code != 200 {
		t.Fatalf("the API: %d %s", code, body)
	}
}
