// Command manager runs quotaplane's controllers: it compiles the quota
// objects of every namespace into a versioned policy in Redis, reports on
// each object whether it is in force, and scales the enforcer fleet (see
// package controllers).
//
// It talks to the cluster of -kubeconfig (or KUBECONFIG, or the in-cluster
// config) and to the Redis of -redis-addr. The Redis password comes from the
// environment (QUOTAPLANE_REDIS_PASSWORD, in a Deployment from a Secret) or
// from -redis-password-file (a mounted Secret); it is never logged. TLS,
// client certificates and the ACL user are package redisconn's flags. With
// -policy-signing-key-file it signs every policy version it publishes
// (package store, Signatures).
//
// It logs with log/slog to stderr, as text or JSON (-log-format, -log-level;
// package logging), as the other quotaplane binary does.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quotaplane/quotaplane/controllers"
	"github.com/quotaplane/quotaplane/pkg/envflag"
	"github.com/quotaplane/quotaplane/pkg/logging"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redisconn"
	"github.com/quotaplane/quotaplane/pkg/store"
)

func main() {
	if err := run(); err != nil {
		slog.Error("manager stopped", "err", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		redisFlags  = redisconn.Register(flag.CommandLine, "Redis host:port holding the policy store")
		metricsAddr = flag.String("metrics-bind-address", envflag.String("QUOTAPLANE_METRICS_BIND_ADDRESS", ":8080"), "where /metrics listens; 0 turns it off [QUOTAPLANE_METRICS_BIND_ADDRESS]")
		probeAddr   = flag.String("health-probe-bind-address", envflag.String("QUOTAPLANE_HEALTH_PROBE_BIND_ADDRESS", ":8081"), "where /healthz and /readyz listen [QUOTAPLANE_HEALTH_PROBE_BIND_ADDRESS]")
		pprofAddr   = flag.String("pprof-bind-address", envflag.String("QUOTAPLANE_PPROF_BIND_ADDRESS", "0"), "where Go's profiles (/debug/pprof/) listen, unauthenticated: keep it on loopback; 0, the default, turns them off [QUOTAPLANE_PPROF_BIND_ADDRESS]")
		leaderElect = flag.Bool("leader-elect", envflag.Bool("QUOTAPLANE_LEADER_ELECT", false), "elect one active manager among replicas (a Lease) [QUOTAPLANE_LEADER_ELECT]")
		leaderNS    = flag.String("leader-election-namespace", envflag.String("QUOTAPLANE_LEADER_ELECTION_NAMESPACE", ""), "namespace of the leader Lease (default: the pod's own) [QUOTAPLANE_LEADER_ELECTION_NAMESPACE]")
		leaseFor    = flag.Duration("leader-lease-duration", envflag.Duration("QUOTAPLANE_LEADER_LEASE_DURATION", 15*time.Second), "how long a standby waits after the leader's last renewal before it takes over: a killed leader's edits wait this long [QUOTAPLANE_LEADER_LEASE_DURATION]")
		renewBy     = flag.Duration("leader-renew-deadline", envflag.Duration("QUOTAPLANE_LEADER_RENEW_DEADLINE", 10*time.Second), "how long the leader keeps trying to renew before it gives up leading; below the lease duration [QUOTAPLANE_LEADER_RENEW_DEADLINE]")
		retryEvery  = flag.Duration("leader-retry-period", envflag.Duration("QUOTAPLANE_LEADER_RETRY_PERIOD", 2*time.Second), "how often the leader renews and standbys try to take over [QUOTAPLANE_LEADER_RETRY_PERIOD]")
		fleetEvery  = flag.Duration("fleet-interval", envflag.Duration("QUOTAPLANE_FLEET_INTERVAL", 5*time.Second), "how often enforcer reports are read and fleets resized [QUOTAPLANE_FLEET_INTERVAL]")
		scaleDown   = flag.Duration("scale-down-delay", envflag.Duration("QUOTAPLANE_SCALE_DOWN_DELAY", 5*time.Minute), "how long a lower replica count must be wanted before a fleet shrinks [QUOTAPLANE_SCALE_DOWN_DELAY]")
		resync      = flag.Duration("resync-interval", envflag.Duration("QUOTAPLANE_RESYNC_INTERVAL", 10*time.Second), "how often every plane is compiled and published again, so that a Redis that lost its data gets it back [QUOTAPLANE_RESYNC_INTERVAL]")
		logOpts     = logging.Register(flag.CommandLine)
		signingKey  = flag.String("policy-signing-key-file", envflag.String("QUOTAPLANE_POLICY_SIGNING_KEY_FILE", ""), "Ed25519 private key (PEM, openssl genpkey -algorithm ed25519) that signs every policy version published; enforcers with its public key (-policy-public-key-file) load only signed versions [QUOTAPLANE_POLICY_SIGNING_KEY_FILE]")
		maxFleet    = flag.Int("max-enforcer-replicas", int(envflag.Int("QUOTAPLANE_MAX_ENFORCER_REPLICAS", controllers.DefaultMaxEnforcerReplicas)), "the most replicas the manager gives any plane's enforcer Deployment, whatever the plane asks [QUOTAPLANE_MAX_ENFORCER_REPLICAS]")
	)
	// controller-runtime registers -kubeconfig on the default flag set.
	flag.Parse()

	// One logger for the manager and controller-runtime (package logging).
	log, err := logOpts.Setup(os.Stderr)
	if err != nil {
		return err
	}
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))

	if *redisFlags.Addr == "" {
		return errors.New("no Redis: set -redis-addr (or QUOTAPLANE_REDIS_ADDR) to the Redis that holds the policy store")
	}
	if *maxFleet < 1 || *maxFleet > policy.MaxReplicas {
		return fmt.Errorf("-max-enforcer-replicas %d: use 1 to %d", *maxFleet, policy.MaxReplicas)
	}
	var signer *store.Signer
	if *signingKey != "" {
		if signer, err = store.LoadSigner(*signingKey); err != nil {
			return fmt.Errorf("-policy-signing-key-file: %w", err)
		}
	}
	rdb, hasPassword, err := redisFlags.Client()
	if err != nil {
		return err
	}
	defer rdb.Close()

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("no cluster to manage: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        controllers.NewScheme(),
		Metrics:                       metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:        *probeAddr,
		PprofBindAddress:              *pprofAddr,
		LeaderElection:                *leaderElect,
		LeaderElectionID:              "quotaplane-manager.quotaplane.io",
		LeaderElectionNamespace:       *leaderNS,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 leaseFor,
		RenewDeadline:                 renewBy,
		RetryPeriod:                   retryEvery,
	})
	if err != nil {
		return fmt.Errorf("create the manager: %w", err)
	}
	if err := controllers.Setup(mgr, controllers.Options{Redis: rdb, FleetInterval: *fleetEvery, ScaleDownDelay: *scaleDown, Resync: *resync, MaxEnforcerReplicas: int32(*maxFleet), PolicySigner: signer}); err != nil {
		return fmt.Errorf("set up the controllers: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	// Ready when Redis answers: without it nothing can be published.
	if err := mgr.AddReadyzCheck("redis", func(r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		return rdb.Ping(ctx).Err()
	}); err != nil {
		return err
	}
	signedBy := "unsigned"
	if signer != nil {
		signedBy = signer.ID()
	}
	log.Info("manager starting", "redis", *redisFlags.Addr, "redisTLS", redisFlags.TLS(), "redisUser", *redisFlags.Username, "redisPassword", hasPassword, "policySigningKey", signedBy,
		"leaderElect", *leaderElect, "metrics", *metricsAddr, "probes", *probeAddr, "fleetInterval", *fleetEvery, "scaleDownDelay", *scaleDown)
	return mgr.Start(ctrl.SetupSignalHandler())
}
