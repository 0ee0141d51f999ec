package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/planestatus"
	"github.com/quotaplane/quotaplane/pkg/redisconn"
	"github.com/quotaplane/quotaplane/pkg/report"
	"github.com/quotaplane/quotaplane/pkg/store"
)

func runStatus(ctx context.Context, e *env, args []string) error {
	fs := e.flags()
	redisFlags := redisconn.Register(fs, "Redis host:port holding the planes' policies and the enforcers' reports")
	planes := fs.String("plane", "", "comma-separated planes to show, namespace/name (default: every plane in Redis, and with --kubernetes every QuotaPlane)")
	kube := fs.Bool("kubernetes", false, "also read the QuotaPlanes' status from the Kubernetes API (the kubeconfig of --kubeconfig, KUBECONFIG or ~/.kube/config, as kubectl)")
	kubeconfig := fs.String("kubeconfig", "", "the kubeconfig file for --kubernetes")
	kubeContext := fs.String("context", "", "the kubeconfig context for --kubernetes (default: the current one)")
	namespace := fs.String("namespace", "", "with --kubernetes, read the QuotaPlanes of this namespace only")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for Redis and the API server")
	exitCode := fs.Bool("exit-code", false, "exit 1 when a plane is not healthy: nothing published, a rollout in progress, a degraded enforcer, a QuotaPlane not Ready, or a read that failed")
	format := fs.String("o", "table", "output format: table, json or markdown")
	operands, err := parse(fs, args)
	if err != nil {
		return err
	}
	var only []string
	if *planes != "" {
		only = strings.Split(*planes, ",")
	}
	switch {
	case len(operands) > 0:
		return usageError("unexpected operand %q: name planes with --plane namespace/name", operands[0])
	case *redisFlags.Addr == "" && !*kube:
		return usageError("name a source: --redis-addr host:port (the policy store) and/or --kubernetes (the QuotaPlanes)")
	case *timeout <= 0:
		return usageError("--timeout %s: want more than 0", *timeout)
	}
	for _, p := range only {
		if err := store.ValidatePlane(p); err != nil || !strings.Contains(p, "/") {
			return usageError("--plane %q: want namespace/name", p)
		}
	}
	if err := report.CheckFormat(*format); err != nil {
		return usageError("%v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	st := &planestatus.Status{Planes: []planestatus.Plane{}}
	if *redisFlags.Addr != "" {
		rdb, _, err := redisFlags.Client()
		if err != nil {
			return err
		}
		defer rdb.Close()
		if st, err = planestatus.FromRedis(ctx, rdb, only); err != nil {
			return fmt.Errorf("redis %s: %w", *redisFlags.Addr, err)
		}
	}
	if *kube {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = *kubeconfig
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: *kubeContext}).ClientConfig()
		if err != nil {
			return fmt.Errorf("--kubernetes: load the kubeconfig: %w", err)
		}
		scheme := runtime.NewScheme()
		if err := v1alpha1.AddToScheme(scheme); err != nil {
			return err
		}
		c, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return fmt.Errorf("--kubernetes: %w", err)
		}
		if err := st.AddKubernetes(ctx, c, *namespace, only); err != nil {
			return fmt.Errorf("--kubernetes (%s): %w", cfg.Host, err)
		}
	}
	if err := report.Write(e.stdout, *format, st); err != nil {
		return err
	}
	if *exitCode && st.Unhealthy() {
		return errFound
	}
	return nil
}
