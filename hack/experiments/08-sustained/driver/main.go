// Command driver runs pkg/load against an in-process fleet like cmd/load
// -target inproc, with two additions the experiments need:
//
//   - -cluster-addrs: the fleet shares a Redis Cluster (a
//     redis.ClusterClient), so that a plane's spec.shards can be measured;
//     cmd/load only makes a single-node client (redis.NewClient).
//   - it counts the tokens the fleet admits (Decision.Cost) per second of
//     wall time, so that the overage against a global limit counted in
//     tokens can be measured with the endpoints' costs 1/5/50 (tokens.csv:
//     t, admitted_tokens, offered_tokens).
//
// It writes what cmd/load -out writes, tokens.csv, and a last line on
// stdout that scripts read:
//
//	RESULT offered_per_s=… decided_per_wall_s=… admitted_per_s=… admitted_tokens_per_s=… p50_us=… p99_us=… lag_p99_us=… errors=…
//
// hack/experiments/08-sustained/plot draws its time series.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "driver:", err)
		os.Exit(1)
	}
}

// tokenCounter counts admitted and offered tokens per wall-clock second
// since start, one row of counters per node (a node's decisions come from
// the workers that picked it, so rows spread the atomic adds).
type tokenCounter struct {
	load.Target
	start    time.Time
	admitted [][]atomic.Int64 // [node][second]
	offered  [][]atomic.Int64
}

func newTokenCounter(t load.Target, seconds int) *tokenCounter {
	c := &tokenCounter{Target: t}
	for range t.Nodes() {
		c.admitted = append(c.admitted, make([]atomic.Int64, seconds))
		c.offered = append(c.offered, make([]atomic.Int64, seconds))
	}
	return c
}

func (c *tokenCounter) Decide(ctx context.Context, node int, now time.Time, r *enforcer.Request) (enforcer.Decision, error) {
	d, err := c.Target.Decide(ctx, node, now, r)
	if err != nil {
		return d, err
	}
	sec := int(time.Since(c.start) / time.Second)
	if sec >= len(c.admitted[node]) {
		sec = len(c.admitted[node]) - 1
	}
	c.offered[node][sec].Add(d.Cost)
	if d.Allow {
		c.admitted[node][sec].Add(d.Cost)
	}
	return d, nil
}

// perSecond sums the nodes' rows.
func perSecond(rows [][]atomic.Int64) []int64 {
	out := make([]int64, len(rows[0]))
	for _, row := range rows {
		for s := range row {
			out[s] += row[s].Load()
		}
	}
	return out
}

func run() error {
	p := load.Seed002()
	var (
		mix          = flag.String("mix", "read=0.9,write=0.09,export=0.01", "endpoints and their shares")
		policyDir    = flag.String("policy", "", "directory of the plane's quota YAML")
		nodes        = flag.Int("nodes", 8, "engines in the fleet")
		redisAddr    = flag.String("redis-addr", "", "a single Redis")
		clusterAddrs = flag.String("cluster-addrs", "", "comma-separated Redis Cluster seed addresses")
		workers      = flag.Int("workers", 0, "generator goroutines (default GOMAXPROCS)")
		warmup       = flag.Duration("warmup", 0, "left out of the per-tenant counts")
		out          = flag.String("out", "", "directory for the results")
		reconcileMs  = flag.Int64("reconcile-ms", 0, "override the plane's reconcile interval, ms")
		quiet        = flag.Bool("quiet", false, "no progress line")
		o            policy.Overrides
	)
	flag.Uint64Var(&p.Seed, "seed", p.Seed, "seed")
	flag.IntVar(&p.Tenants, "tenants", p.Tenants, "tenants")
	flag.IntVar(&p.Enterprise, "enterprise", p.Enterprise, "enterprise tenants")
	flag.IntVar(&p.Standard, "standard", p.Standard, "standard tenants")
	flag.Float64Var(&p.ZipfS, "zipf", p.ZipfS, "Zipf exponent")
	flag.IntVar(&p.Whales, "whales", p.Whales, "whales")
	flag.IntVar(&p.KeysPerTenant, "keys", p.KeysPerTenant, "api keys per tenant")
	flag.Float64Var(&p.Rate, "rate", p.Rate, "offered requests per second")
	flag.DurationVar(&p.Duration, "duration", p.Duration, "run length")
	flag.StringVar(&o.Mode, "mode", "", "override the plane's mode")
	flag.StringVar(&o.Fairness, "fairness", "", "override the plane's fairness")
	flag.Int64Var(&o.GlobalPerSecond, "global-rps", 0, "override the plane's global rate")
	flag.Parse()

	p.Endpoints = nil // -mix replaces the profile's
	for _, part := range strings.Split(*mix, ",") {
		name, share, ok := strings.Cut(part, "=")
		x, err := strconv.ParseFloat(share, 64)
		if !ok || err != nil || name == "" {
			return fmt.Errorf("-mix %q: %w", *mix, err)
		}
		p.Endpoints = append(p.Endpoints, load.Endpoint{Name: name, Share: x})
	}
	if *reconcileMs > 0 {
		o.ReconcileInterval = time.Duration(*reconcileMs) * time.Millisecond
	}
	b, err := p.Build()
	if err != nil {
		return err
	}
	pol, err := policy.LoadDir(*policyDir)
	if err != nil {
		return err
	}
	if pol, err = pol.Override(o); err != nil {
		return err
	}
	var rdb redis.UniversalClient
	password := os.Getenv("QUOTAPLANE_REDIS_PASSWORD")
	switch {
	case *clusterAddrs != "":
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(*clusterAddrs, ","), Password: password, ContextTimeoutEnabled: true, PoolSize: 64})
	case *redisAddr != "":
		rdb = redis.NewClient(&redis.Options{Addr: *redisAddr, Password: password, ContextTimeoutEnabled: true, PoolSize: 64})
	}
	if rdb != nil {
		defer rdb.Close()
	}
	fleet, err := load.NewFleet(pol, *nodes, rdb)
	if err != nil {
		return err
	}
	defer fleet.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Room for a generator that falls behind: a run may take longer than
	// its schedule; any second past the slots is counted in the last.
	seconds := 2*int(b.Duration/time.Second) + 60
	target := newTokenCounter(fleet, seconds)
	opts := load.Options{Workers: *workers, Warmup: *warmup}
	if !*quiet {
		opts.Progress = os.Stderr
	}
	target.start = time.Now()
	res, err := load.Run(ctx, b, target, opts)
	if err != nil {
		return err
	}
	admitted, offered := perSecond(target.admitted), perSecond(target.offered)
	res.Print(os.Stdout)
	if *out != "" {
		if err := res.Write(*out); err != nil {
			return err
		}
		if err := writeTokens(filepath.Join(*out, "tokens.csv"), admitted, offered); err != nil {
			return err
		}
	}
	var tokens int64
	for _, a := range admitted {
		tokens += a
	}
	per := res.Measured
	fmt.Printf("RESULT offered_per_s=%.0f decided_per_wall_s=%.0f admitted_per_s=%.0f admitted_tokens_per_s=%.0f p50_us=%.1f p99_us=%.1f lag_p99_us=%.1f errors=%d wall_s=%.2f\n",
		float64(res.Totals.Offered)/per, res.DecisionsPerWallSec, float64(res.Totals.Admitted)/per, float64(tokens)/res.Wall,
		res.Latency.P50, res.Latency.P99, res.Lag.P99, res.Errors, res.Wall)
	return nil
}

func writeTokens(path string, admitted, offered []int64) error {
	var sb strings.Builder
	sb.WriteString("t,admitted_tokens,offered_tokens\n")
	for s := range admitted {
		fmt.Fprintf(&sb, "%d,%d,%d\n", s, admitted[s], offered[s])
	}
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}
