// Command enforcer decides requests against a quota plane.
//
//	enforcer [flags]        serve POST /api/{endpoint} on the policy
//	enforcer check DIR...   compile the quota objects in each DIR and print every problem
//
// Without -policy it enforces the embedded sample plane (config/samples) in
// mode local: no cluster, no Redis.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/reload"
	"github.com/quotaplane/quotaplane/pkg/server"
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

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, ok := os.LookupEnv(name); ok {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		slog.Warn("ignoring an unparsable duration", "env", name, "value", v)
	}
	return def
}

func run() error {
	policyDir := flag.String("policy", env("QUOTAPLANE_POLICY", ""), "directory of quota YAML files (default: the embedded sample plane) [QUOTAPLANE_POLICY]")
	listen := flag.String("listen", env("QUOTAPLANE_LISTEN", ":8080"), "API listen address [QUOTAPLANE_LISTEN]")
	reloadEvery := flag.Duration("reload-interval", envDuration("QUOTAPLANE_RELOAD_INTERVAL", 2*time.Second),
		"how often -policy DIR is read again for changes [QUOTAPLANE_RELOAD_INTERVAL]")
	adminListen := flag.String("admin-listen", env("QUOTAPLANE_ADMIN_LISTEN", "127.0.0.1:9090"),
		"admin listen address: /healthz, /readyz, /metrics, /quota/debug; keep it private [QUOTAPLANE_ADMIN_LISTEN]")
	flag.Parse()

	var (
		p   *policy.Policy
		err error
	)
	source := "embedded samples"
	if *policyDir == "" {
		p, err = policy.LoadFS(samples.FS)
	} else {
		source = *policyDir
		p, err = policy.LoadDir(*policyDir)
	}
	if err != nil {
		return fmt.Errorf("load policy from %s: %w", source, err)
	}
	p = p.WithVersion(1)
	engine, err := enforcer.New(p)
	if err != nil {
		return err
	}
	defer engine.Close()
	metrics := server.NewMetrics(engine)
	metrics.PolicyLoads.WithLabelValues("ok").Inc()
	loader := reload.New(engine, metrics.PolicyLoads, slog.Default(), true) // the policy was loaded before serving
	ready := loader.Ready

	api := newServer(*listen, server.NewAPI(engine, metrics))
	admin := newServer(*adminListen, server.NewAdmin(engine, metrics, ready))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *policyDir != "" {
		go loader.WatchDir(ctx, *policyDir, *reloadEvery)
	}
	errc := make(chan error, 2)
	go func() { errc <- api.ListenAndServe() }()
	go func() { errc <- admin.ListenAndServe() }()
	slog.Info("enforcer serving", "listen", *listen, "admin", *adminListen, "policy", source, "plane", p.Plane(), "hash", p.Hash()[:12], "mode", p.Spec().Mode)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Stop accepting, let in-flight decisions finish, then close the engine
	// (deferred), which flushes what it owes Redis.
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, srv := range []*http.Server{api, admin} {
		if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	slog.Info("enforcer stopped")
	return nil
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
	code := 0
	for _, dir := range dirs {
		objs, err := policy.ReadDir(dir)
		if err != nil {
			fmt.Printf("%s: %v\n", dir, err)
			code = 1
			continue
		}
		p, problems := policy.Compile(objs)
		for _, pr := range problems {
			fmt.Printf("%s: %s\n", dir, pr)
		}
		if len(problems) > 0 || p == nil {
			code = 1
			continue
		}
		s := p.Spec()
		fmt.Printf("%s: ok: plane %s/%s, %d tiers, %d endpoints, %d tenants, burst pool: %t, hash %s\n",
			dir, s.Namespace, s.Plane, len(s.Tiers), len(s.Endpoints), len(s.Tenants), s.BurstPool != nil, p.Hash()[:12])
	}
	return code
}
