package gateway

import (
	"context"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/server"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// fuzzPlane denies unknown endpoints, so that refusals are reachable too;
// its global limit does not refill, so that any debit shows.
var fuzzPlane = testPlane("  unknownEndpoints: deny\n")

// FuzzRateLimitRequest sends ShouldRateLimit groups built from the input
// and checks that nothing panics, that an answer has one status per
// descriptor, and that only an OK debits: an error (bad input), a refusal
// or an OVER_LIMIT leaves the global limit, which every debit touches,
// where it was. Descriptor i takes its fields from the input or from a
// request that passes, as the 4 bits of pattern at 4i say, so that groups
// that mix passing and failing descriptors are common.
func FuzzRateLimitRequest(f *testing.F) {
	f.Add("gw", "acme", "read", "k1", "generic_key", uint32(0), uint64(0), uint64(0), uint8(1), uint8(0))
	f.Add("gw", "acme", "write", "k1", "tenant", uint32(0), uint64(3), uint64(0x82), uint8(2), uint8(0))   // read passes, write ×3 is over
	f.Add("gw", "beta", "write", "k-small", "x", uint32(2), uint64(1), uint64(0x0f00), uint8(3), uint8(0)) // beta's key is not k-small's limit
	f.Add("gw", "acme", "nope", "k1", "endpoint", uint32(1), uint64(0), uint64(0x20), uint8(3), uint8(0))  // an unknown endpoint is refused
	f.Add("gw", "a b", "read", "", "api_key", uint32(1), uint64(1), uint64(0), uint8(1), uint8(3))         // invalid, negative, no tenant
	f.Add("main", "acme", "read", "k1", "x", uint32(1), uint64(0), uint64(0), uint8(200), uint8(0))        // another domain, too many
	f.Add("gw", "beta", "write", "k", "", uint32(1_000_000), uint64(1_000_001), uint64(0x8888), uint8(64), uint8(0))
	f.Fuzz(func(t *testing.T, domain, tenant, endpoint, key, extraKey string, hits uint32, descHits, pattern uint64, n, flags uint8) {
		e := fuzzEngine(t)
		s := &rateLimitService{engine: func() (*enforcer.Engine, error) { return e, nil }, observe: server.NewMetrics(e, nil).Observe}
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
		for i := range int(n) {
			bits := pattern >> (i % 16 * 4)
			d := &ratelimitv3.RateLimitDescriptor{IsNegativeHits: flags&1 != 0 && i == 0}
			name, ep, k := tenant, endpoint, key
			if bits&1 != 0 {
				name = "acme"
			}
			if bits&2 != 0 {
				ep = "read"
			}
			if bits&4 != 0 {
				k = "k1"
			}
			if !(flags&2 != 0 && i == int(n)-1) {
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "tenant", Value: name})
			}
			d.Entries = append(d.Entries,
				&ratelimitv3.RateLimitDescriptor_Entry{Key: "endpoint", Value: ep},
				&ratelimitv3.RateLimitDescriptor_Entry{Key: "api_key", Value: k},
				&ratelimitv3.RateLimitDescriptor_Entry{Key: extraKey, Value: tenant})
			if bits&8 != 0 {
				d.HitsAddend = wrapperspb.UInt64(descHits)
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		before := globalRemaining(e)
		resp, err := s.ShouldRateLimit(context.Background(), req)
		after := globalRemaining(e)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.ResourceExhausted {
				t.Fatalf("error %v: only InvalidArgument and ResourceExhausted are the request's fault", err)
			}
			if after != before {
				t.Fatalf("an invalid request (%v) debited %d tokens", err, before-after)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		switch resp.OverallCode {
		case rlsv3.RateLimitResponse_OK:
			if after >= before {
				t.Fatalf("an admitted group debited nothing (global %d → %d)", before, after)
			}
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			if after != before {
				t.Fatalf("a refused group debited %d tokens", before-after)
			}
		default:
			t.Fatalf("overall code %v", resp.OverallCode)
		}
	})
}

// FuzzCheckRequest sends Check requests built from the input and checks
// that nothing panics, that every answer is an OK or a denial with a
// status quotaplane gives (never a gRPC error for the request's own
// fault), and that only an OK debits.
func FuzzCheckRequest(f *testing.F) {
	f.Add("POST", "/v1/items", "acme", "k1", "", "", false, false, false)
	f.Add("GET", "/v1/read/7?q=1", "acme", "k-small", "3", "", false, true, false)
	f.Add("GET", "/x/../v1/items", "beta", "k", "", "write", true, false, false)
	f.Add("PUT", "v1", "a b", "", "0", "nope", true, true, true)
	f.Add("GET", "/%2e%2e/v1/read", "acme", "k1", "1000001", "", false, false, true)
	f.Fuzz(func(t *testing.T, method, path, tenant, key, units, extension string, useExtension, rawHeaders, dupTenant bool) {
		e := fuzzEngine(t)
		s := &authorizationService{engine: func() (*enforcer.Engine, error) { return e, nil }, observe: server.NewMetrics(e, nil).Observe}
		h := &authv3.AttributeContext_HttpRequest{Method: method, Path: path}
		pairs := []string{"x-tenant", tenant, "x-api-key", key}
		if units != "" {
			pairs = append(pairs, "x-quota-units", units)
		}
		if dupTenant {
			pairs = append(pairs, "X-Tenant", "acme")
		}
		if rawHeaders {
			h.HeaderMap = &corev3.HeaderMap{}
			for i := 0; i < len(pairs); i += 2 {
				h.HeaderMap.Headers = append(h.HeaderMap.Headers, &corev3.HeaderValue{Key: pairs[i], RawValue: []byte(pairs[i+1])})
			}
		} else {
			h.Headers = map[string]string{}
			for i := 0; i < len(pairs); i += 2 {
				h.Headers[pairs[i]] = pairs[i+1]
			}
		}
		req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: h}}}
		if useExtension {
			req.Attributes.ContextExtensions = map[string]string{EndpointExtension: extension}
		}
		before := globalRemaining(e)
		resp, err := s.Check(context.Background(), req)
		after := globalRemaining(e)
		if err != nil {
			t.Fatalf("a gRPC error (%v): Envoy's failure mode would decide; a bad request must be a 400", err)
		}
		if ok := resp.GetOkResponse(); ok != nil {
			if resp.GetStatus().GetCode() != int32(codes.OK) || after >= before {
				t.Fatalf("allowed with status %v, global %d → %d", resp.GetStatus(), before, after)
			}
			return
		}
		denied := resp.GetDeniedResponse()
		if denied == nil || resp.GetStatus().GetCode() == int32(codes.OK) {
			t.Fatalf("neither allowed nor denied: %v", resp)
		}
		switch denied.GetStatus().GetCode() {
		case typev3.StatusCode_BadRequest, typev3.StatusCode_Forbidden, typev3.StatusCode_TooManyRequests:
		default:
			t.Fatalf("denied with %v", denied.GetStatus().GetCode())
		}
		if after != before {
			t.Fatalf("a denial (%v: %s) debited %d tokens", denied.GetStatus().GetCode(), denied.GetBody(), before-after)
		}
	})
}

// fuzzEngineInUse is the fuzz process's engine: a new one per input would
// spend the run compiling the plane. Fuzz inputs run one at a time.
var fuzzEngineInUse *enforcer.Engine

// fuzzEngine returns the engine, a new one once the global limit runs low
// so that groups keep being admitted.
func fuzzEngine(t *testing.T) *enforcer.Engine {
	if e := fuzzEngineInUse; e != nil && globalRemaining(e) > 100_000_000 {
		return e
	}
	if fuzzEngineInUse != nil {
		fuzzEngineInUse.Close()
	}
	e, err := enforcer.New(policytest.Compile(t, fuzzPlane).WithVersion(1))
	if err != nil {
		t.Fatal(err)
	}
	fuzzEngineInUse = e
	return e
}
