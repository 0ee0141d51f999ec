package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/server"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestServerLifecycle: before SetEngine every decision is Unavailable and
// health NOT_SERVING; after it SERVING and decisions; Shutdown turns
// health to NOT_SERVING and returns by its deadline even with a stream
// still open.
func TestServerLifecycle(t *testing.T) {
	s := NewServer()
	conn := serve(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rls, authz, health := rlsv3.NewRateLimitServiceClient(conn), authv3.NewAuthorizationClient(conn), healthpb.NewHealthClient(conn)
	rlReq := &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("tenant=acme")}}

	healthOf := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health of %q: %v", service, err)
		}
		return resp.Status
	}
	if _, err := rls.ShouldRateLimit(ctx, rlReq); status.Code(err) != codes.Unavailable {
		t.Fatalf("ShouldRateLimit before the engine: got %v, want Unavailable", err)
	}
	if _, err := authz.Check(ctx, &authv3.CheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Check before the engine: got %v, want Unavailable", err)
	}
	for _, name := range []string{"", RateLimitServiceName, AuthorizationServiceName} {
		if got := healthOf(name); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health of %q before the engine: %v", name, got)
		}
	}

	e := newEngine(t, policytest.Compile(t, testPlane("")).WithVersion(1))
	metrics := server.NewMetrics(e, nil)
	s.SetEngine(e, metrics.Observe)
	for _, name := range []string{"", RateLimitServiceName, AuthorizationServiceName} {
		if got := healthOf(name); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %q after the engine: %v", name, got)
		}
	}
	resp, err := rls.ShouldRateLimit(ctx, rlReq)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
	}
	two := &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: []*ratelimitv3.RateLimitDescriptor{descriptor("tenant=acme"), descriptor("tenant=beta")}}
	if _, err := rls.ShouldRateLimit(ctx, two); err != nil {
		t.Fatal(err)
	}
	if _, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "other"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("another domain: %v", err)
	}
	check := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
		Method: "GET", Path: "/v1/read", Headers: map[string]string{"x-tenant": "acme", "x-api-key": "k1"},
	}}}}
	if resp, err := authz.Check(ctx, check); err != nil || resp.GetOkResponse() == nil {
		t.Fatalf("Check: %v, %v", resp, err)
	}
	if got := metrics.Decisions(); got != 4 {
		t.Fatalf("observed decisions: %d, want 4 (1 + 2 descriptors + 1 Check; the refused call is none)", got)
	}

	watch, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if first, err := watch.Recv(); err != nil || first.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v, %v", first, err)
	}
	stopped := make(chan struct{})
	go func() {
		shutdown, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		s.Shutdown(shutdown)
		close(stopped)
	}()
	if next, err := watch.Recv(); err != nil || next.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after Shutdown: %v, %v; want NOT_SERVING", next, err)
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("Shutdown did not return after its deadline with a stream open")
	}
	if _, err := rls.ShouldRateLimit(ctx, rlReq); err == nil {
		t.Fatal("served after Shutdown")
	}
}
