package gateway

import (
	"context"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// TestRLSMalformedValueIsAnAnswer: a value Envoy copied from a client
// header that ValidateRequest rejects (a space inside, too long) is an
// OVER_LIMIT answer, as a wrong key under keyBinding: bound is. It was a
// gRPC InvalidArgument error, which Envoy's ratelimit filter lets through
// unless failure_mode_deny is set (its default is false): a client turned a
// refusal into a free pass by adding a space to X-Api-Key or X-Tenant.
func TestRLSMalformedValueIsAnAnswer(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, testPlane("  keyBinding: bound\n")).WithVersion(1))
	s := &rateLimitService{engine: func() (*enforcer.Engine, error) { return e, nil }, observe: func(*enforcer.Request, *enforcer.Decision, time.Duration) {}}
	ask := func(pairs ...string) (*rlsv3.RateLimitResponse, error) {
		return s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor(pairs...)}})
	}
	if resp, err := ask("tenant=acme", "api_key=not-acmes-key"); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("wrong key: %v, %v; want an OVER_LIMIT answer", resp, err)
	}
	for name, pairs := range map[string][]string{
		"key with a space":  {"tenant=acme", "api_key=not acmes key"},
		"key of 300 bytes":  {"tenant=acme", "api_key=" + strings.Repeat("k", 300)},
		"tenant with space": {"tenant=ac me", "api_key=k-small"},
	} {
		resp, err := ask(pairs...)
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s: got %v, %v; want an OVER_LIMIT answer (an error is let through by Envoy's default failure mode)", name, resp, err)
		}
	}
}
