package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/client"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/middleware"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/server"
)

// sampleEngine is an engine on the sample plane whose clock stands still,
// so the examples' output does not depend on when they run.
func sampleEngine() *enforcer.Engine {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e, err := enforcer.New(p, enforcer.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	return e
}

// A service guards its tools, as seed 001's tool guard does: each route is
// an endpoint of the plane, the tenant and key come from the caller's
// credentials (here headers an authenticating proxy set).
func ExampleHTTP() {
	engine := sampleEngine()
	defer engine.Close()

	identify := func(r *http.Request) (enforcer.Request, error) {
		tenant := r.Header.Get("X-Tenant")
		if tenant == "" {
			return enforcer.Request{}, errors.New("no tenant: authenticate first")
		}
		// The route's tool is the endpoint: /tools/export → export.
		return enforcer.Request{Tenant: tenant, APIKey: r.Header.Get("X-Api-Key"), Endpoint: r.PathValue("tool")}, nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tools/{tool}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ran %s\n", r.PathValue("tool"))
	})
	guarded := middleware.HTTP(middleware.Local(engine), identify)
	mux.Handle("POST /guarded/tools/{tool}", http.StripPrefix("/guarded", guarded(mux)))

	for range 3 {
		r := httptest.NewRequest(http.MethodPost, "/guarded/tools/export", nil)
		r.Header.Set("X-Tenant", "free-trial")
		r.Header.Set("X-Api-Key", "k1")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Print(w.Code, " ", w.Header().Get("RateLimit"), " ", w.Body)
		if w.Code == http.StatusTooManyRequests {
			fmt.Println("Retry-After:", w.Header().Get("Retry-After"))
			fmt.Println("X-Quota-Level:", w.Header().Get("X-Quota-Level"))
			fmt.Println("X-Quota-Reason:", w.Header().Get("X-Quota-Reason"))
		}
	}
	// Output:
	// 200 "tenant";r=50;t=1 ran export
	// 200 "tenant";r=0;t=2 ran export
	// 429 "tenant";r=0;t=1 {"allowed":false,"tenant":"free-trial","endpoint":"export","cost":50,"remaining":0,"level":"tenant","reason":"tenant limit of 50 per 1s (burst 100) is used up","retryAfterSeconds":1}
	// Retry-After: 1
	// X-Quota-Level: tenant
	// X-Quota-Reason: tenant limit of 50 per 1s (burst 100) is used up
}

// The same guard with the decisions of a remote enforcer, through its
// decision API: a fleet of services shares one plane.
func ExampleHTTP_remoteEnforcer() {
	engine := sampleEngine()
	defer engine.Close()
	enforcerAPI := httptest.NewServer(server.NewAPI(engine, nil)) // cmd/enforcer, elsewhere
	defer enforcerAPI.Close()

	decider, err := client.New(enforcerAPI.URL) // client.WithBearerToken, client.WithTLSConfig as it needs
	if err != nil {
		panic(err)
	}
	identify := func(r *http.Request) (enforcer.Request, error) {
		return enforcer.Request{Tenant: r.Header.Get("X-Tenant"), APIKey: "k1", Endpoint: strings.TrimPrefix(r.URL.Path, "/")}, nil
	}
	service := middleware.HTTP(decider, identify)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "exported")
	}))
	for range 3 {
		r := httptest.NewRequest(http.MethodPost, "/export", nil)
		r.Header.Set("X-Tenant", "free-trial")
		w := httptest.NewRecorder()
		service.ServeHTTP(w, r)
		line := fmt.Sprint(w.Code, " ", w.Header().Get("RateLimit"))
		if w.Code == http.StatusTooManyRequests {
			line += fmt.Sprintf(", level %s, Retry-After %s", w.Header().Get("X-Quota-Level"), w.Header().Get("Retry-After"))
		}
		fmt.Println(line)
	}
	// Output:
	// 200 "tenant";r=50;t=1
	// 200 "tenant";r=0;t=2
	// 429 "tenant";r=0;t=1, level tenant, Retry-After 1
}

// A gRPC service guarded per call: the method is the endpoint, the tenant
// and key come from the call's metadata.
func ExampleUnaryServerInterceptor() {
	engine := sampleEngine()
	defer engine.Close()

	identify := func(_ context.Context, fullMethod string, md metadata.MD) (enforcer.Request, error) {
		tenant := md.Get("x-tenant")
		if len(tenant) != 1 {
			return enforcer.Request{}, errors.New("send x-tenant once")
		}
		endpoint := map[string]string{healthpb.Health_Check_FullMethodName: "export"}[fullMethod]
		return enforcer.Request{Tenant: tenant[0], APIKey: "k1", Endpoint: endpoint}, nil
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(middleware.UnaryServerInterceptor(middleware.Local(engine), identify)),
		grpc.StreamInterceptor(middleware.StreamServerInterceptor(middleware.Local(engine), identify)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis := bufconn.Listen(1 << 20) // a net.Listener on loopback, in a real service
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-tenant", "free-trial")
	for range 3 {
		var header metadata.MD
		_, err := health.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		st := status.Convert(err)
		fmt.Println(st.Code(), header.Get("ratelimit"))
		if err == nil {
			continue
		}
		fmt.Println(st.Message())
		fmt.Println("retry-after:", header.Get("retry-after"), "x-quota-level:", header.Get("x-quota-level"))
		for _, detail := range st.Details() {
			if retry, ok := detail.(*errdetails.RetryInfo); ok {
				fmt.Println("RetryInfo:", retry.GetRetryDelay().AsDuration())
			}
		}
	}
	// Output:
	// OK ["tenant";r=50;t=1]
	// OK ["tenant";r=0;t=2]
	// ResourceExhausted ["tenant";r=0;t=1]
	// quota exceeded at level tenant: tenant limit of 50 per 1s (burst 100) is used up; retry after 1s
	// retry-after: [1] x-quota-level: [tenant]
	// RetryInfo: 1s
}
