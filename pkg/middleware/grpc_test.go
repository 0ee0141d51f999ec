package middleware_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/middleware"
)

// methodEndpoints maps the health service's methods onto the sample
// plane's endpoints: a check costs what an export does.
var methodEndpoints = map[string]string{
	healthpb.Health_Check_FullMethodName: "export",
	healthpb.Health_Watch_FullMethodName: "export",
}

// identifyCall names a call from its metadata (x-tenant, x-api-key) and
// its method.
func identifyCall(_ context.Context, fullMethod string, md metadata.MD) (enforcer.Request, error) {
	tenant := md.Get("x-tenant")
	if len(tenant) != 1 {
		return enforcer.Request{}, errors.New("send the tenant in x-tenant metadata, once")
	}
	r := enforcer.Request{Tenant: tenant[0], Endpoint: methodEndpoints[fullMethod]}
	if key := md.Get("x-api-key"); len(key) == 1 {
		r.APIKey = key[0]
	}
	return r, nil
}

// healthServer serves the real gRPC health service behind the interceptors
// on an in-memory listener and returns a client of it and the number of
// calls that reached the service.
func healthServer(t *testing.T, d middleware.Decider, opts ...middleware.Option) (healthpb.HealthClient, *atomic.Int64) {
	t.Helper()
	var reached atomic.Int64
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(middleware.UnaryServerInterceptor(d, identifyCall, opts...),
			func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				reached.Add(1)
				return handler(ctx, req)
			}),
		grpc.ChainStreamInterceptor(middleware.StreamServerInterceptor(d, identifyCall, opts...),
			func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
				reached.Add(1)
				return handler(srv, ss)
			}),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn), &reached
}

func withIdentity(tenant, key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), "x-tenant", tenant, "x-api-key", key)
}

// wantDenial checks a denied call's status and header metadata.
func wantDenial(t *testing.T, err error, header metadata.MD) {
	t.Helper()
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "level tenant") ||
		!strings.Contains(st.Message(), "tenant limit of 50 per 1s (burst 100) is used up") {
		t.Fatalf("status %v; want ResourceExhausted naming the level and the reason", st)
	}
	want := map[string]string{
		"retry-after":      "1",
		"x-quota-level":    "tenant",
		"x-quota-reason":   "tenant limit of 50 per 1s (burst 100) is used up",
		"ratelimit":        `"tenant";r=0;t=1`,
		"ratelimit-policy": `"global";q=10000;w=1, "tenant";q=50;w=1, "endpoint";q=100;w=300, "key";q=50;w=1`,
	}
	for k, v := range want {
		if got := header.Get(k); len(got) != 1 || got[0] != v {
			t.Errorf("header metadata %s = %q; want %q", k, got, v)
		}
	}
	var retry *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() != time.Second {
		t.Errorf("RetryInfo %v; want a delay of 1s (50 tokens at 50/s)", retry)
	}
	if quota == nil || len(quota.Violations) != 1 || quota.Violations[0].Subject != "tenant" {
		t.Errorf("QuotaFailure %v; want one violation at level tenant", quota)
	}
}

// TestUnaryServerInterceptor: two checks by a free tenant pass with the
// RateLimit fields as header metadata, the third is ResourceExhausted with
// every field and a RetryInfo, and the service never sees it; through a
// local engine and through a remote enforcer alike.
func TestUnaryServerInterceptor(t *testing.T) {
	for _, dc := range deciderCases {
		t.Run(dc.name, func(t *testing.T) {
			hc, reached := healthServer(t, dc.make(t, newEngine(t, samples.FS)))
			ctx := withIdentity("free-trial", "k1")
			for i := range 2 {
				var header metadata.MD
				resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
				if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("check %d: %v, %v; want SERVING", i+1, resp, err)
				}
				if len(header.Get("ratelimit")) != 1 || len(header.Get("ratelimit-policy")) != 1 || len(header.Get("retry-after")) != 0 {
					t.Errorf("check %d: header metadata %v; want ratelimit and ratelimit-policy only", i+1, header)
				}
			}
			var header metadata.MD
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
			wantDenial(t, err, header)
			if n := reached.Load(); n != 2 {
				t.Errorf("%d calls reached the service; want 2", n)
			}
		})
	}
}

// TestStreamServerInterceptor: a stream is decided when it opens.
func TestStreamServerInterceptor(t *testing.T) {
	for _, dc := range deciderCases {
		t.Run(dc.name, func(t *testing.T) {
			hc, reached := healthServer(t, dc.make(t, newEngine(t, samples.FS)))
			for i := range 3 {
				ctx, cancel := context.WithCancel(withIdentity("free-trial", "k1"))
				stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
				if err != nil {
					cancel()
					t.Fatal(err)
				}
				resp, err := stream.Recv()
				header, headerErr := stream.Header()
				cancel()
				if i < 2 {
					if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
						t.Fatalf("watch %d: %v, %v; want SERVING", i+1, resp, err)
					}
					if headerErr != nil || len(header.Get("ratelimit")) != 1 {
						t.Errorf("watch %d: header metadata %v (%v); want ratelimit", i+1, header, headerErr)
					}
					continue
				}
				wantDenial(t, err, header)
			}
			if n := reached.Load(); n != 2 {
				t.Errorf("%d streams reached the service; want 2", n)
			}
		})
	}
}

// TestInterceptorRefusalsAndFailures: identify's errors are
// InvalidArgument, the plane's refusals PermissionDenied (also failing
// open), a decider that fails Unavailable or, failing open, the service.
func TestInterceptorRefusalsAndFailures(t *testing.T) {
	check := func(hc healthpb.HealthClient, ctx context.Context) codes.Code {
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err)
	}
	for _, dc := range deciderCases {
		t.Run(dc.name, func(t *testing.T) {
			hc, reached := healthServer(t, dc.make(t, newEngine(t, strictSamples(t))), middleware.WithFailureMode(middleware.FailOpen))
			if got := check(hc, context.Background()); got != codes.InvalidArgument {
				t.Errorf("no identity: %v; want InvalidArgument", got)
			}
			var header metadata.MD
			_, err := hc.Check(withIdentity("stranger", "k"), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `"stranger" is not a tenant`) ||
				!slices.Equal(header.Get("x-quota-level"), []string{"tenant"}) || len(header.Get("x-quota-reason")) != 1 {
				t.Errorf("unknown tenant: %v, header metadata %v; want PermissionDenied with x-quota-level tenant and x-quota-reason", err, header)
			}
			bound, reachedBound := healthServer(t, dc.make(t, newEngine(t, boundPlane(t))), middleware.WithFailureMode(middleware.FailOpen))
			if got := check(bound, withIdentity("acme", "not-acmes")); got != codes.PermissionDenied {
				t.Errorf("a key that is not the tenant's: %v; want PermissionDenied", got)
			}
			if got := check(bound, withIdentity("acme", boundKey)); got != codes.OK {
				t.Errorf("the tenant's own key: %v; want OK", got)
			}
			if n, m := reached.Load(), reachedBound.Load(); n != 0 || m != 1 {
				t.Errorf("%d and %d calls reached the services; want none and the tenant's own", n, m)
			}

			e := newEngine(t, samples.FS)
			closed, reachedClosed := healthServer(t, dc.make(t, e))
			open, reachedOpen := healthServer(t, dc.make(t, e), middleware.WithFailureMode(middleware.FailOpen))
			e.Close()
			if got := check(closed, withIdentity("acme", "k")); got != codes.Unavailable || reachedClosed.Load() != 0 {
				t.Errorf("fail closed: %v, %d reached; want Unavailable, none", got, reachedClosed.Load())
			}
			if got := check(open, withIdentity("acme", "k")); got != codes.OK || reachedOpen.Load() != 1 {
				t.Errorf("fail open: %v, %d reached; want OK from the service", got, reachedOpen.Load())
			}
		})
	}
}
