// Command enforcer decides requests against a quota plane.
//
//	enforcer [flags]        serve decisions on the policy
//	enforcer check DIR...   compile the quota objects in each DIR and print every problem
//
// It serves the HTTP decision API (POST /api/{endpoint}, forward auth) on
// -listen, Envoy's rate limit service and external authorization on
// -grpc-listen (package gateway), and the admin surface on -admin-listen.
// Each decision listener may require TLS, client certificates (mTLS) or a
// bearer token (package authn; -tls-*, -client-ca-file, -token-file and
// their -grpc-* twins).
//
// Without -policy it enforces the embedded sample plane (config/samples) in
// mode local: no cluster, no Redis. With -redis-addr and -plane (and no
// -policy) it follows the plane's policy in the Redis policy store, listening
// at once and answering 503 (gRPC: Unavailable) until the first version
// arrives. It reaches Redis as the manager does (package redisconn): as
// -redis-username, with the password of -redis-password-file (a mounted
// Secret) or QUOTAPLANE_REDIS_PASSWORD, over TLS if asked (-redis-tls,
// rediss://). With -policy-public-key-file it loads only policy versions a
// manager signed (package store, Signatures); a version that does not verify
// is refused, counted (quotaplane_enforcer_policy_loads_total{result=
// "unverified"}) and logged, and the last good one stays in force.
//
// It logs with log/slog to stderr, as text or JSON (-log-format, -log-level;
// package logging), as the other quotaplane binary does.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/authn"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/envflag"
	"github.com/quotaplane/quotaplane/pkg/gateway"
	"github.com/quotaplane/quotaplane/pkg/logging"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redisconn"
	"github.com/quotaplane/quotaplane/pkg/reload"
	"github.com/quotaplane/quotaplane/pkg/server"
	"github.com/quotaplane/quotaplane/pkg/store"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(check(os.Args[2:]))
	}
	if err := run(); err != nil {
		slog.Error("enforcer stopped", "err", err)
		os.Exit(1)
	}
}

func run() error {
	policyDir := flag.String("policy", envflag.String("QUOTAPLANE_POLICY", ""), "directory of quota YAML files, watched and read again every -reload-interval (default: the embedded sample plane, unless -redis-addr) [QUOTAPLANE_POLICY]")
	redisFlags := redisconn.Register(flag.CommandLine, "Redis host:port: the distributed modes' state, and, without -policy, the policy store")
	plane := flag.String("plane", envflag.String("QUOTAPLANE_PLANE", ""), "the plane to load from the policy store, namespace/name [QUOTAPLANE_PLANE]")
	publicKey := flag.String("policy-public-key-file", envflag.String("QUOTAPLANE_POLICY_PUBLIC_KEY_FILE", ""),
		"Ed25519 public keys (PEM, one or more: a rotation) of the managers' -policy-signing-key-file: load from the policy store only versions one of them signed; without it, whatever Redis holds is trusted [QUOTAPLANE_POLICY_PUBLIC_KEY_FILE]")
	nodeID := flag.String("node-id", envflag.String("QUOTAPLANE_NODE_ID", ""), "this enforcer's id in its fleet (default: host name and a random suffix) [QUOTAPLANE_NODE_ID]")
	listen := flag.String("listen", envflag.String("QUOTAPLANE_LISTEN", ":8080"), "API listen address [QUOTAPLANE_LISTEN]")
	grpcListen := flag.String("grpc-listen", envflag.String("QUOTAPLANE_GRPC_LISTEN", ":8081"),
		"gRPC listen address: Envoy's rate limit service and external authorization, health, reflection; empty disables [QUOTAPLANE_GRPC_LISTEN]")
	var apiAuth, grpcAuth authn.Config
	authFlags(&apiAuth, "", "QUOTAPLANE_", "API")
	authFlags(&grpcAuth, "grpc-", "QUOTAPLANE_GRPC_", "gRPC")
	adminListen := flag.String("admin-listen", envflag.String("QUOTAPLANE_ADMIN_LISTEN", "127.0.0.1:9090"),
		"admin listen address: /healthz, /readyz, /metrics, /quota/debug, /quota/ui, /debug/pprof/; keep it private [QUOTAPLANE_ADMIN_LISTEN]")
	adminTokenFile := flag.String("admin-token-file", envflag.String("QUOTAPLANE_ADMIN_TOKEN_FILE", ""),
		"require on the admin listener, but for /healthz and /readyz, \"Authorization: Bearer <token>\" with a token of this file (one per line); without it, /quota/debug, /quota/ui and /debug/pprof/ answer only clients on loopback [QUOTAPLANE_ADMIN_TOKEN_FILE]")
	reloadEvery := flag.Duration("reload-interval", envflag.Duration("QUOTAPLANE_RELOAD_INTERVAL", 2*time.Second),
		"how often -policy DIR is read again besides its file watch [QUOTAPLANE_RELOAD_INTERVAL]")
	var o policy.Overrides
	flag.StringVar(&o.Mode, "mode", envflag.String("QUOTAPLANE_MODE", ""), "override the plane's mode: local, central or local-reconciled [QUOTAPLANE_MODE]")
	flag.StringVar(&o.Fairness, "fairness", envflag.String("QUOTAPLANE_FAIRNESS", ""), "override the plane's fairness: none, maxmin, wfq or drr [QUOTAPLANE_FAIRNESS]")
	flag.StringVar(&o.ShareBy, "share-by", envflag.String("QUOTAPLANE_SHARE_BY", ""), "override the plane's shareBy: tenant or tier [QUOTAPLANE_SHARE_BY]")
	reconcileMs := flag.Int64("reconcile-ms", envflag.Int("QUOTAPLANE_RECONCILE_MS", 0), "override the plane's reconcile interval, ms [QUOTAPLANE_RECONCILE_MS]")
	flag.Int64Var(&o.BurstPoolSize, "burst-pool", envflag.Int("QUOTAPLANE_BURST_POOL", 0), "override the burst pool's size, tokens [QUOTAPLANE_BURST_POOL]")
	flag.Int64Var(&o.GlobalPerSecond, "global-rps", envflag.Int("QUOTAPLANE_GLOBAL_RPS", 0), "override the global limit, tokens per second [QUOTAPLANE_GLOBAL_RPS]")
	memoryLimit := flag.Int64("memory-limit", envflag.Int("QUOTAPLANE_MEMORY_LIMIT", 0),
		"the container's memory limit, bytes (the manifests set it from limits.memory): the Go memory limit is set to 90% of it, and the state caps are sized to it (enforcer.StateBounds) [QUOTAPLANE_MEMORY_LIMIT]")
	maxTenants := flag.Int("max-tenants", int(envflag.Int("QUOTAPLANE_MAX_TENANTS", 0)),
		"tenants the policy does not name that keep a state of their own; beyond it they share one (default: sized to -memory-limit, else 1,000,000) [QUOTAPLANE_MAX_TENANTS]")
	drain := flag.Duration("drain", envflag.Duration("QUOTAPLANE_DRAIN", 5*time.Second),
		"on SIGTERM, how long /readyz answers 503 while the listeners keep serving, before they stop: time for Services and gateways to stop sending [QUOTAPLANE_DRAIN]")
	maxKeys := flag.Int("max-keys", int(envflag.Int("QUOTAPLANE_MAX_KEYS", 0)),
		"api keys that keep a state of their own across all tenants (default: sized to -memory-limit, else 1,000,000) [QUOTAPLANE_MAX_KEYS]")
	redisTimeout := flag.Duration("redis-timeout", envflag.Duration("QUOTAPLANE_REDIS_TIMEOUT", 50*time.Millisecond),
		"the deadline of one decision's trip through Redis (central, and local-reconciled's small limits); past it, the plane's failureMode decides. Above the Redis link's p99, below what a request may wait [QUOTAPLANE_REDIS_TIMEOUT]")
	logOpts := logging.Register(flag.CommandLine)
	flag.Parse()
	if _, err := logOpts.Setup(os.Stderr); err != nil {
		return err
	}
	o.ReconcileInterval = time.Duration(*reconcileMs) * time.Millisecond

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	terms := make(chan os.Signal, 1) // SIGTERM (Kubernetes stopping the pod) drains first
	signal.Notify(terms, syscall.SIGTERM)
	var draining atomic.Bool
	redisLatency := server.RedisLatency()
	if *redisTimeout <= 0 {
		return fmt.Errorf("-redis-timeout %s: it must be positive", *redisTimeout)
	}
	opts := []enforcer.Option{enforcer.WithRedisObserver(func(d time.Duration) { redisLatency.Observe(d.Seconds()) }),
		enforcer.WithRedisTimeout(*redisTimeout)}
	if *memoryLimit > 0 {
		debug.SetMemoryLimit(*memoryLimit / 10 * 9)
		tenants, keys := enforcer.StateBounds(*memoryLimit)
		*maxTenants, *maxKeys = cmp.Or(*maxTenants, tenants), cmp.Or(*maxKeys, keys)
	}
	if *maxTenants > 0 {
		opts = append(opts, enforcer.WithMaxTenants(*maxTenants))
	}
	if *maxKeys > 0 {
		opts = append(opts, enforcer.WithMaxKeys(*maxKeys))
	}
	var policies *store.Store
	if *redisFlags.Addr != "" {
		client, _, err := redisFlags.EnforcerClient() // no retries: each call has its deadline (redisconn)
		if err != nil {
			return err
		}
		defer client.Close()
		opts = append(opts, enforcer.WithRedis(client))
		if *policyDir == "" {
			if *plane == "" {
				return errors.New("-redis-addr without -policy loads the policy from the store: name the plane with -plane namespace/name")
			}
			var storeOpts []store.Option
			if *publicKey != "" {
				verifier, err := store.LoadVerifier(*publicKey)
				if err != nil {
					return fmt.Errorf("-policy-public-key-file: %w", err)
				}
				storeOpts = append(storeOpts, store.WithVerifier(verifier))
				slog.Info("loading only signed policies", "keys", strings.Join(verifier.IDs(), ","))
			}
			var err error
			if policies, err = store.New(client, *plane, storeOpts...); err != nil {
				return err
			}
		}
	}
	if *publicKey != "" && policies == nil {
		return errors.New("-policy-public-key-file checks the policy store's signatures: it needs -redis-addr and -plane, without -policy")
	}
	if *nodeID != "" {
		opts = append(opts, enforcer.WithNodeID(*nodeID))
	}

	apiTLS, apiTokens, err := httpAuth(apiAuth)
	if err != nil {
		return fmt.Errorf("the API listener (-tls-cert-file, -tls-key-file, -client-ca-file, -token-file): %w", err)
	}
	var grpcOpts []grpc.ServerOption
	if *grpcListen != "" {
		if grpcOpts, err = grpcAuth.GRPCServerOptions(); err != nil {
			return fmt.Errorf("the gRPC listener (-grpc-tls-cert-file, -grpc-tls-key-file, -grpc-client-ca-file, -grpc-token-file): %w", err)
		}
	}

	// Listen at once: until the first policy is in force, /healthz says the
	// process lives and everything else is 503 (server.Deferred), and gRPC
	// answers Unavailable with health NOT_SERVING.
	adminTokens, err := authn.Config{TokenFile: *adminTokenFile}.Tokens()
	if err != nil {
		return fmt.Errorf("-admin-token-file: %w", err)
	}
	var apiHandler, adminHandler server.Deferred
	api, admin := newServer(*listen, authn.HTTP(&apiHandler, apiTokens)), newServer(*adminListen, guardAdmin(&adminHandler, adminTokens))
	api.TLSConfig = apiTLS
	var engine *enforcer.Engine
	errc := make(chan error, 3)
	var gw *gateway.Server
	if *grpcListen != "" {
		lis, err := net.Listen("tcp", *grpcListen)
		if err != nil {
			return fmt.Errorf("-grpc-listen: %w", err)
		}
		gw = gateway.NewServer(grpcOpts...)
		go func() { errc <- gw.Serve(lis) }()
	}
	go func() {
		if apiTLS != nil {
			errc <- api.ListenAndServeTLS("", "")
			return
		}
		errc <- api.ListenAndServe()
	}()
	go func() { errc <- admin.ListenAndServe() }()
	defer func() {
		// Stop accepting, let in-flight decisions finish, then close the
		// engine, which flushes what it owes Redis.
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if gw != nil {
			gw.Shutdown(shutdown) // GracefulStop until the deadline, then Stop
		}
		for _, srv := range []*http.Server{api, admin} {
			if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
				slog.Error("shutdown", "addr", srv.Addr, "err", err)
			}
		}
		if engine != nil {
			engine.Close()
		}
		slog.Info("enforcer stopped")
	}()

	var (
		p      *policy.Policy
		source = "embedded samples"
	)
	switch {
	case *policyDir != "":
		source = *policyDir
		if p, err = policy.LoadDir(*policyDir); err == nil {
			p = p.WithVersion(1)
		}
	case policies != nil:
		source = "redis " + *plane
		p, err = firstFromStore(ctx, policies, errc)
	default:
		p, err = policy.LoadFS(samples.FS)
		if err == nil {
			p = p.WithVersion(1)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped while waiting
		}
		return fmt.Errorf("load policy from %s: %w", source, err)
	}
	inForce, err := p.Override(o)
	if err != nil {
		return err
	}
	if engine, err = enforcer.New(inForce, opts...); err != nil {
		return err
	}
	metrics := server.NewMetrics(engine, redisLatency)
	metrics.PolicyLoads.WithLabelValues("ok").Inc()
	loader := reload.New(engine, o, metrics.PolicyLoads, slog.Default(), p)
	switch {
	case *policyDir != "":
		go loader.WatchDir(ctx, *policyDir, *reloadEvery)
	case policies != nil:
		go func() { _ = loader.WatchStore(ctx, policies) }()
		go loader.Report(ctx, policies, metrics.Decisions, time.Second)
	}
	apiHandler.Set(server.NewAPI(engine, metrics))
	var adminOpts []server.AdminOption
	if policies != nil {
		adminOpts = append(adminOpts, server.WithFleet(policies)) // the fleet's reports, in /quota/debug
	}
	ready := func() bool { return !draining.Load() && loader.Ready() }
	adminHandler.Set(server.NewAdmin(engine, metrics, ready, adminOpts...))
	if gw != nil {
		gw.SetEngine(engine, metrics.Observe)
	}
	slog.Info("enforcer serving", "listen", *listen, "auth", apiAuth.Mode(), "grpc", *grpcListen, "grpc_auth", grpcAuth.Mode(),
		"admin", *adminListen, "policy", source, "plane", inForce.ID(), "version", inForce.Version(), "hash", inForce.Hash()[:12], "mode", inForce.Spec().Mode)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	select {
	case <-terms:
		// Readiness fails first; the listeners keep answering while the
		// endpoints that route here are updated; then the deferred
		// shutdown lets in-flight requests finish.
		draining.Store(true)
		slog.Info("draining: /readyz answers 503, the listeners keep serving", "for", drain.String())
		select {
		case <-time.After(*drain):
		case err := <-errc:
			return err
		}
	default: // an interrupt: stop now
	}
	return nil
}

// firstFromStore waits for the plane's first published policy, trying
// every second until ctx ends or a listener fails (errc): an enforcer
// started before the manager published has nothing to enforce yet.
func firstFromStore(ctx context.Context, s *store.Store, errc <-chan error) (*policy.Policy, error) {
	for {
		p, err := s.Current(ctx)
		if err == nil {
			return p, nil
		}
		slog.Warn("waiting for the plane's policy in Redis", "plane", s.Plane(), "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case err := <-errc:
			return nil, err
		case <-time.After(time.Second):
		}
	}
}

// authFlags defines the authentication flags of one listener: -<prefix>tls-cert-file
// and the rest, each with its environment twin.
func authFlags(c *authn.Config, prefix, envPrefix, listener string) {
	flag.StringVar(&c.CertFile, prefix+"tls-cert-file", envflag.String(envPrefix+"TLS_CERT_FILE", ""),
		fmt.Sprintf("the %s listener's TLS certificate (PEM; with -%stls-key-file serves TLS), read again when it changes [%sTLS_CERT_FILE]", listener, prefix, envPrefix))
	flag.StringVar(&c.KeyFile, prefix+"tls-key-file", envflag.String(envPrefix+"TLS_KEY_FILE", ""),
		fmt.Sprintf("the %s listener's TLS key (PEM) [%sTLS_KEY_FILE]", listener, envPrefix))
	flag.StringVar(&c.ClientCAFile, prefix+"client-ca-file", envflag.String(envPrefix+"CLIENT_CA_FILE", ""),
		fmt.Sprintf("require on the %s listener client certificates signed by a CA of this PEM bundle (mTLS; needs -%stls-cert-file) [%sCLIENT_CA_FILE]", listener, prefix, envPrefix))
	flag.StringVar(&c.TokenFile, prefix+"token-file", envflag.String(envPrefix+"TOKEN_FILE", ""),
		fmt.Sprintf("require on the %s listener \"Authorization: Bearer <token>\" with a token of this file (one per line), read again when it changes [%sTOKEN_FILE]", listener, envPrefix))
}

// httpAuth is what an HTTP listener needs of c: its TLS configuration
// (nil: plain text) and its tokens (nil: none required).
func httpAuth(c authn.Config) (*tls.Config, *authn.Tokens, error) {
	tlsConfig, err := c.ServerTLS()
	if err != nil {
		return nil, nil, err
	}
	tokens, err := c.Tokens()
	if err != nil {
		return nil, nil, err
	}
	return tlsConfig, tokens, nil
}

// guardAdmin guards the admin listener: the probes (/healthz, /readyz)
// are open to all; with tokens, everything else requires one; without,
// /metrics is open (Prometheus, which the manifests' NetworkPolicy lets
// in) and /quota/debug and /quota/ui, which show tenants' live state, and
// /debug/pprof/, whose profiles show them too (and cost CPU), answer only
// clients on loopback (a shell in the pod, kubectl port-forward).
func guardAdmin(next http.Handler, tokens *authn.Tokens) http.Handler {
	guarded := authn.HTTP(next, tokens)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz" || r.URL.Path == "/readyz":
			next.ServeHTTP(w, r)
		case tokens == nil && (strings.HasPrefix(r.URL.Path, "/quota/") || strings.HasPrefix(r.URL.Path, "/debug/")) && !fromLoopback(r):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"error":"/quota/debug, /quota/ui and /debug/pprof/ show tenants' state: they answer clients on loopback (kubectl port-forward) or, with -admin-token-file, a bearer token"}`+"\n")
		default:
			guarded.ServeHTTP(w, r)
		}
	})
}

// fromLoopback says whether r came from a loopback address.
func fromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	ip := net.ParseIP(host)
	return err == nil && ip != nil && ip.IsLoopback()
}

// newServer is an HTTP server with timeouts and a header size limit.
func newServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
}

// check compiles each directory and prints its problems; the exit code is 1
// when any directory has one.
func check(dirs []string) int {
	if len(dirs) == 0 {
		fmt.Fprintln(os.Stderr, "usage: enforcer check DIR...")
		return 2
	}
	if !policy.Check(os.Stdout, dirs...) {
		return 1
	}
	return 0
}
