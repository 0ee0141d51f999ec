package gateway

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

func TestRateLimitOf(t *testing.T) {
	const (
		second = rlsv3.RateLimitResponse_RateLimit_SECOND
		minute = rlsv3.RateLimitResponse_RateLimit_MINUTE
		hour   = rlsv3.RateLimitResponse_RateLimit_HOUR
		day    = rlsv3.RateLimitResponse_RateLimit_DAY
	)
	for _, tc := range []struct {
		rate       int64
		period     time.Duration
		perUnit    uint32
		unit       rlsv3.RateLimitResponse_RateLimit_Unit
		multiplier uint32 // 0: unset
	}{
		{10, time.Second, 10, second, 0},
		{100, time.Minute, 100, minute, 0},
		{7, time.Hour, 7, hour, 0},
		{5, 24 * time.Hour, 5, day, 0},
		{100, 300 * time.Second, 100, minute, 5},
		{5, 90 * time.Second, 5, second, 90},
		{7, 2 * time.Hour, 7, hour, 2},
		{1, 48 * time.Hour, 1, day, 2},
		{1, policy.MaxPeriod, 1, day, 366},
		{0, time.Second, 0, second, 0},
		// not whole seconds: scaled to a rate per second, rounded, at least 1
		{100, 100 * time.Millisecond, 1000, second, 0},
		{3, 1500 * time.Millisecond, 2, second, 0},
		{1, 1500 * time.Millisecond, 1, second, 0},
		{1, 2500 * time.Millisecond, 1, second, 0}, // 0.4 per second is still a limit that refills
		{0, 1500 * time.Millisecond, 0, second, 0},
		{policy.MaxRate, time.Millisecond, math.MaxUint32, second, 0}, // 10^12 per second does not fit
	} {
		l := policy.Limit{Rate: tc.rate, Burst: max(tc.rate, 1), Period: tc.period}
		got := rateLimitOf(enforcer.LevelTenant, &l)
		var multiplier uint32
		if got.UnitMultiplier != nil {
			multiplier = got.UnitMultiplier.Value
		}
		if got.Name != "tenant" || got.RequestsPerUnit != tc.perUnit || got.Unit != tc.unit || multiplier != tc.multiplier {
			t.Errorf("%d per %s: got %d per %v ×%d named %q, want %d per %v ×%d", tc.rate, tc.period,
				got.RequestsPerUnit, got.Unit, multiplier, got.Name, tc.perUnit, tc.unit, tc.multiplier)
		}
	}
}

func TestUntilReset(t *testing.T) {
	bucket := &policy.Limit{Rate: 10, Burst: 20, Period: time.Second}
	window := &policy.Limit{Rate: 2, Burst: 2, Period: 5 * time.Minute, Algorithm: policy.SlidingWindow}
	noRefill := &policy.Limit{Rate: 0, Burst: 5, Period: time.Second}
	for _, tc := range []struct {
		name  string
		limit *policy.Limit
		d     enforcer.Decision
		want  time.Duration
	}{
		{"denied: the wait", bucket, enforcer.Decision{RetryAfter: 1234 * time.Millisecond}, 1234 * time.Millisecond},
		{"allowed: until full", bucket, enforcer.Decision{Allow: true, Remaining: 15}, 500 * time.Millisecond},
		{"allowed, empty", bucket, enforcer.Decision{Allow: true, Remaining: 0}, 2 * time.Second},
		{"allowed, full", bucket, enforcer.Decision{Allow: true, Remaining: 20}, 0},
		{"allowed, above the burst (borrowed)", bucket, enforcer.Decision{Allow: true, Remaining: 25}, 0},
		{"sliding window: its period", window, enforcer.Decision{Allow: true, Remaining: 1}, 5 * time.Minute},
		{"no refill: its period", noRefill, enforcer.Decision{Allow: true, Remaining: 1}, time.Second},
		{"no bounding limit", nil, enforcer.Decision{Allow: true}, 0},
	} {
		if got := untilReset(tc.limit, &tc.d); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestDescriptorStatus(t *testing.T) {
	tenant := &policy.Limit{Rate: 100, Burst: 100, Period: 24 * time.Hour}
	key := &policy.Limit{Rate: 3, Burst: 3, Period: time.Hour}
	limits := [len(enforcer.Levels)]*policy.Limit{nil, tenant, nil, key}
	denied := descriptorStatus(&limits, &enforcer.Decision{Level: enforcer.LevelKey, Bound: enforcer.LevelKey, RetryAfter: 20 * time.Minute})
	if denied.Code != rlsv3.RateLimitResponse_OVER_LIMIT || denied.CurrentLimit.GetName() != "key" ||
		denied.CurrentLimit.GetRequestsPerUnit() != 3 || denied.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR ||
		denied.LimitRemaining != 0 || denied.DurationUntilReset.AsDuration() != 20*time.Minute {
		t.Fatalf("denied at key: %v", denied)
	}
	allowed := descriptorStatus(&limits, &enforcer.Decision{Allow: true, Bound: enforcer.LevelTenant, Remaining: 99})
	if allowed.Code != rlsv3.RateLimitResponse_OK || allowed.CurrentLimit.GetName() != "tenant" ||
		allowed.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY || allowed.LimitRemaining != 99 ||
		allowed.DurationUntilReset.AsDuration() != 24*time.Hour/100 {
		t.Fatalf("allowed, bound by tenant: %v", allowed)
	}
	huge := descriptorStatus(&limits, &enforcer.Decision{Allow: true, Bound: enforcer.LevelTenant, Remaining: 1 << 40})
	if huge.LimitRemaining != math.MaxUint32 {
		t.Fatalf("remaining 2^40: got %d, want the largest uint32", huge.LimitRemaining)
	}
}

func TestRateLimitRequests(t *testing.T) {
	p := policytest.Compile(t, testPlane("  descriptors:\n    tenant: [x-tenant, tenant]\n    apiKey: [key]\n")).WithVersion(1)
	request := func(hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: ds, HitsAddend: hits}
	}
	withHits := func(d *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(hits)
		return d
	}
	seventeen := descriptor("tenant=a")
	for range 16 {
		seventeen.Entries = append(seventeen.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "generic_key", Value: "x"})
	}
	negative := descriptor("tenant=a")
	negative.IsNegativeHits = true

	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string // the InvalidArgument message
	}{
		{"another domain", &rlsv3.RateLimitRequest{Domain: "envoy", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("tenant=a")}},
			`domain "envoy" is not served here: this enforcer serves domain "gw"`},
		{"no descriptors", request(0), "no descriptors"},
		{"no tenant entry", request(0, descriptor("tenant=a"), descriptor("endpoint=read", "generic_key=x")),
			`descriptor 1: no tenant entry: looked for the key "x-tenant" or "tenant" (the QuotaPlane's spec.descriptors.tenant)`},
		{"the default key is not looked for", request(0, descriptor("api_key=a", "endpoint=read")), `descriptor 0: no tenant entry`},
		{"tenant twice", request(0, descriptor("tenant=a", "tenant=b")), `descriptor 0: the entry "tenant" appears twice`},
		{"17 entries", request(0, seventeen), "descriptor 0: 17 entries; at most 16"},
		{"hits over the bound", request(0, withHits(descriptor("tenant=a"), enforcer.MaxUnits+1)), "descriptor 0: hits_addend 1000001 out of range [0, 1000000]"},
		{"request hits over the bound", request(enforcer.MaxUnits+1, descriptor("tenant=a")), "hits_addend 1000001 out of range"},
		{"negative hits", request(0, negative), "descriptor 0: is_negative_hits"},
	} {
		rs := make([]enforcer.Request, len(tc.req.Descriptors))
		err := rateLimitRequests(p, tc.req, rs)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: got %v, want InvalidArgument containing %q", tc.name, err, tc.want)
		}
	}

	req := request(7,
		descriptor("tenant=t0", "x-tenant=t1", "endpoint=write", "key=k", "api_key=ignored"), // x-tenant is listed first
		withHits(descriptor("generic_key=x", "tenant=t2"), 3),                                // its own hits win
		withHits(descriptor("tenant=t3"), 0),                                                 // 0: one unit's cost
	)
	rs := make([]enforcer.Request, 3)
	if err := rateLimitRequests(p, req, rs); err != nil {
		t.Fatal(err)
	}
	want := []enforcer.Request{
		{Tenant: "t1", Endpoint: "write", APIKey: "k", Units: 7},
		{Tenant: "t2", Units: 3},
		{Tenant: "t3", Units: 0},
	}
	for i := range want {
		if rs[i] != want[i] {
			t.Errorf("descriptor %d: got %+v, want %+v", i, rs[i], want[i])
		}
	}
}

func TestCheckRequest(t *testing.T) {
	p := policytest.Compile(t, testPlane("")).WithVersion(1)
	check := func(method, path string, headers map[string]string, extensions map[string]string) *authv3.CheckRequest {
		return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			ContextExtensions: extensions,
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: method, Path: path, Headers: headers,
			}},
		}}
	}
	raw := func(pairs ...string) *authv3.CheckRequest {
		req := check("POST", "/v1/items", nil, nil)
		m := &corev3.HeaderMap{}
		for i := 0; i < len(pairs); i += 2 {
			m.Headers = append(m.Headers, &corev3.HeaderValue{Key: pairs[i], RawValue: []byte(pairs[i+1])})
		}
		req.Attributes.Request.Http.HeaderMap = m
		return req
	}
	caller := map[string]string{"x-tenant": "acme", "x-api-key": "k1"}
	with := func(k, v string) map[string]string {
		h := map[string]string{"x-tenant": "acme", "x-api-key": "k1"}
		h[k] = v
		return h
	}
	for _, tc := range []struct {
		name    string
		req     *authv3.CheckRequest
		want    enforcer.Request
		problem string
	}{
		{"exact match with method", check("POST", "/v1/items", caller, nil), enforcer.Request{Tenant: "acme", APIKey: "k1", Endpoint: "write"}, ""},
		{"method does not match", check("GET", "/v1/items", caller, nil), enforcer.Request{Tenant: "acme", APIKey: "k1"}, ""},
		{"prefix, query cut", check("GET", "/v1/read/7?full=1", caller, nil), enforcer.Request{Tenant: "acme", APIKey: "k1", Endpoint: "read"}, ""},
		{"dot segments resolved", check("POST", "/v1/read/../items", caller, nil), enforcer.Request{Tenant: "acme", APIKey: "k1", Endpoint: "write"}, ""},
		{"no match", check("GET", "/other", caller, nil), enforcer.Request{Tenant: "acme", APIKey: "k1"}, ""},
		{"context extension names the endpoint", check("GET", "/other", caller, map[string]string{EndpointExtension: "write"}),
			enforcer.Request{Tenant: "acme", APIKey: "k1", Endpoint: "write"}, ""},
		{"context extension, path not read", check("GET", "no-slash", caller, map[string]string{EndpointExtension: "read"}),
			enforcer.Request{Tenant: "acme", APIKey: "k1", Endpoint: "read"}, ""},
		{"units", check("GET", "/v1/read", with("x-quota-units", "12"), nil), enforcer.Request{Tenant: "acme", APIKey: "k1", Endpoint: "read", Units: 12}, ""},
		{"raw headers", raw("X-Tenant", "acme", "x-api-key", "k1"), enforcer.Request{Tenant: "acme", APIKey: "k1", Endpoint: "write"}, ""},

		{"not HTTP", &authv3.CheckRequest{}, enforcer.Request{}, "no attributes.request.http"},
		{"no tenant", check("GET", "/", map[string]string{"x-api-key": "k"}, nil), enforcer.Request{}, "missing X-Tenant header"},
		{"no key", check("GET", "/", map[string]string{"x-tenant": "a"}, nil), enforcer.Request{}, "missing X-Api-Key header"},
		{"units zero", check("GET", "/", with("x-quota-units", "0"), nil), enforcer.Request{}, "X-Quota-Units must be a whole number from 1 to 1000000"},
		{"units not a number", check("GET", "/", with("x-quota-units", "1e3"), nil), enforcer.Request{}, "X-Quota-Units must be"},
		{"path without slash", check("GET", "v1", caller, nil), enforcer.Request{}, "the request's path: "},
		{"path with a space", check("GET", "/a b", caller, nil), enforcer.Request{}, "the request's path: "},
		{"tenant twice (raw)", raw("x-tenant", "a", "x-tenant", "b", "x-api-key", "k"), enforcer.Request{}, "at most once each"},
		{"tenant with a space", check("GET", "/", with("x-tenant", "a b"), nil), enforcer.Request{}, "invalid request"},
		{"endpoint extension with a space", check("GET", "/", caller, map[string]string{EndpointExtension: "a b"}), enforcer.Request{}, "invalid request"},
	} {
		got, problem := checkRequest(p, tc.req)
		switch {
		case tc.problem == "" && problem != "":
			t.Errorf("%s: problem %q", tc.name, problem)
		case tc.problem != "" && !strings.Contains(problem, tc.problem):
			t.Errorf("%s: problem %q, want one containing %q", tc.name, problem, tc.problem)
		case tc.problem == "" && got != tc.want:
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestRefusalLevel(t *testing.T) {
	for _, tc := range []struct {
		err   error
		level enforcer.Level
		ok    bool
	}{
		{enforcer.ErrUnknownTenant, enforcer.LevelTenant, true},
		{enforcer.ErrUnknownEndpoint, enforcer.LevelEndpoint, true},
		{enforcer.ErrKeyNotBound, enforcer.LevelKey, true},
		{enforcer.ErrInvalidRequest, enforcer.LevelNone, false},
		{enforcer.ErrClosed, enforcer.LevelNone, false},
		{errors.New("other"), enforcer.LevelNone, false},
	} {
		wrapped := &enforcer.RequestError{Index: 2, Err: tc.err}
		if level, ok := enforcer.RefusedAt(wrapped); level != tc.level || ok != tc.ok {
			t.Errorf("%v: got %q %t, want %q %t", tc.err, level, ok, tc.level, tc.ok)
		}
	}
}
