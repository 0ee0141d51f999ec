package gateway

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
)

// Bounds on what one connection may ask of the server.
const (
	// MaxRecvMsgBytes bounds one request message. A CheckRequest carries the
	// original request's headers (Envoy's default limit on them is 60 KiB);
	// a RateLimitRequest of MaxDescriptors descriptors of a few entries each
	// is a few KiB. gRPC refuses a larger message with ResourceExhausted
	// before it is decoded.
	MaxRecvMsgBytes = 128 << 10
	// MaxConcurrentStreams bounds the calls in flight on one connection;
	// Envoy opens more connections when it needs more.
	MaxConcurrentStreams = 1024
)

// Service names, as health and reflection know them.
const (
	RateLimitServiceName     = "envoy.service.ratelimit.v3.RateLimitService"
	AuthorizationServiceName = "envoy.service.auth.v3.Authorization"
)

// Server is the enforcer's gRPC server: Envoy's rate limit service and
// external authorization, deciding on one engine, with gRPC health and
// reflection. Until SetEngine it answers every decision with Unavailable
// and health with NOT_SERVING, as an enforcer does before its first policy.
type Server struct {
	grpc     *grpc.Server
	health   *health.Server
	engine   atomic.Pointer[enforcer.Engine]
	observer atomic.Pointer[Observer]
}

// Observer is told of every decision the server makes (a descriptor of a
// ShouldRateLimit, a Check): server.Metrics.Observe, so that the enforcer's
// metrics and the decision rate it reports for fleet scaling count the
// gRPC surfaces as they count the HTTP API.
type Observer func(r *enforcer.Request, d *enforcer.Decision, took time.Duration)

// NewServer returns a server with opts (authn's, say) added to its own
// bounds. Serve it with Serve; stop it with Shutdown.
func NewServer(opts ...grpc.ServerOption) *Server {
	s := &Server{health: health.NewServer()}
	s.grpc = grpc.NewServer(append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgBytes),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.ConnectionTimeout(10 * time.Second),
	}, opts...)...)
	rlsv3.RegisterRateLimitServiceServer(s.grpc, &rateLimitService{engine: s.currentEngine, observe: s.observe})
	authv3.RegisterAuthorizationServer(s.grpc, &authorizationService{engine: s.currentEngine, observe: s.observe})
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.setHealth(healthpb.HealthCheckResponse_NOT_SERVING)
	return s
}

// SetEngine makes e decide every call from now on, observed by observe
// (may be nil), and health SERVING.
func (s *Server) SetEngine(e *enforcer.Engine, observe Observer) {
	if observe != nil {
		s.observer.Store(&observe)
	}
	s.engine.Store(e)
	s.setHealth(healthpb.HealthCheckResponse_SERVING)
}

func (s *Server) observe(r *enforcer.Request, d *enforcer.Decision, took time.Duration) {
	if o := s.observer.Load(); o != nil {
		(*o)(r, d, took)
	}
}

func (s *Server) setHealth(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range []string{"", RateLimitServiceName, AuthorizationServiceName} {
		s.health.SetServingStatus(name, st)
	}
}

// errNoEngine is the answer before the first policy.
var errNoEngine = status.Error(codes.Unavailable, "no policy loaded yet: the enforcer is waiting for its plane's first policy")

func (s *Server) currentEngine() (*enforcer.Engine, error) {
	if e := s.engine.Load(); e != nil {
		return e, nil
	}
	return nil, errNoEngine
}

// Serve serves calls on l until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve(l net.Listener) error {
	if err := s.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Shutdown says NOT_SERVING (watchers, and Envoy's health checks, move
// away), stops accepting calls and waits for those in flight until ctx
// ends; then it cuts the rest.
func (s *Server) Shutdown(ctx context.Context) {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
	}
}
