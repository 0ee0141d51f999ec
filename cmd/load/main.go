// Command load offers a deterministic, open-model load to quotaplane and
// measures fairness, accuracy and isolation (see docs/experiments.md).
//
//	load [flags]
//
// The profile is seed 002's by default: 5,000 tenants (50 enterprise, 950
// standard, 4,000 free), Zipf s = 1.2 over tenants with 20 whales (whale-1..
// whale-20), 4 api keys each, read/write/export 90/9/1. Arrivals are Poisson
// at -rate, scheduled in advance of the answers (never closed-loop); -spike
// adds a noisy neighbour.
//
// Targets: -target inproc (default) runs a simulated fleet of -nodes engines
// on the plane in -policy, sharing the Redis at -redis-addr (or the Redis
// Cluster at -cluster-addrs, for a plane's spec.shards) in the distributed
// modes, in real time or, with -virtual, in virtual time
// (exact, deterministic, one stream); -target http sends to the enforcers at
// -urls; -target null decides nothing and admits everything, to measure the
// generator itself.
//
// Output: a summary on stdout (with an in-process target, the admitted
// tokens against the plane's global limit), a progress line every second
// on stderr, and
// with -out DIR: summary.json, tenants.csv, seconds.csv, tokens.csv (real
// time: admitted tokens per second of wall time, the clock the limits
// refill on) and PNG plots.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

// spikes is the repeatable -spike flag: tenant:rate:from:to.
type spikes []load.Spike

func (s *spikes) String() string { return fmt.Sprint(*s) }

func (s *spikes) Set(v string) error {
	parts := strings.Split(v, ":")
	if len(parts) != 4 {
		return fmt.Errorf("want tenant:rate:from:to, such as whale-1:300000:10s:20s")
	}
	rate, err := strconv.ParseFloat(parts[1], 64)
	if err != nil {
		return fmt.Errorf("rate %q: %w", parts[1], err)
	}
	from, err1 := time.ParseDuration(parts[2])
	to, err2 := time.ParseDuration(parts[3])
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	*s = append(*s, load.Spike{Tenant: parts[0], Rate: rate, From: from, To: to})
	return nil
}

func parseMix(v string) ([]load.Endpoint, error) {
	var eps []load.Endpoint
	for _, part := range strings.Split(v, ",") {
		name, share, ok := strings.Cut(part, "=")
		x, err := strconv.ParseFloat(share, 64)
		if !ok || err != nil || name == "" {
			return nil, fmt.Errorf("-mix %q: want name=share,..., such as read=0.9,write=0.09,export=0.01", v)
		}
		eps = append(eps, load.Endpoint{Name: name, Share: x})
	}
	return eps, nil
}

func run() error {
	p := load.Seed002()
	var (
		sp          spikes
		mix         = flag.String("mix", "read=0.9,write=0.09,export=0.01", "endpoints and their shares of the requests")
		policyDir   = flag.String("policy", "", "directory of the plane's quota YAML (default: the embedded sample plane)")
		target      = flag.String("target", "inproc", "inproc, http or null")
		urls        = flag.String("urls", "", "comma-separated enforcer URLs for -target http")
		conns       = flag.Int("conns", 64, "connections per enforcer URL (-target http)")
		nodes       = flag.Int("nodes", 1, "engines in the simulated fleet (-target inproc)")
		redisAddr   = flag.String("redis-addr", "", "Redis for the distributed modes (-target inproc)")
		clusterAddr = flag.String("cluster-addrs", "", "comma-separated Redis Cluster seed addresses, instead of -redis-addr (-target inproc)")
		virtual     = flag.Bool("virtual", false, "virtual time: one exact, deterministic stream (-target inproc)")
		workers     = flag.Int("workers", 0, "generator goroutines in real time (default GOMAXPROCS)")
		warmup      = flag.Duration("warmup", 0, "left out of the per-tenant counts")
		out         = flag.String("out", "", "directory for summary.json, tenants.csv, seconds.csv and the plots")
		quiet       = flag.Bool("quiet", false, "no progress line")
		oracle      = flag.Bool("oracle", false, "check every decision against load.BucketOracle, an independent model (-virtual, mode local, fairness none, no burst pool)")
		o           policy.Overrides
		reconcileMs = flag.Int64("reconcile-ms", 0, "override the plane's reconcile interval, ms")
		routing     = flag.String("routing", "round-robin", "how requests reach the nodes: "+strings.Join(load.Routings, ", "))
		upstreamArg = flag.String("upstream", "", "experiment 9: play the gateway in front of the plane's Upstream of this name (from -policy), calling a fake upstream this process serves (-upstream-timeline) for every request admitted on its endpoints and reporting each call back (-target inproc)")
		timeline    = flag.String("upstream-timeline", "", "the fake upstream's timeline, JSON (pkg/upstream/upstreamtest): [{\"at\": \"0s\", \"capacity\": 2000}, …]")
		sense       = flag.Bool("sensing", true, "with -upstream: run seed 004's leader in this process (probes, cycles, the plan in Redis); false: static tiers, nothing gated")
	)
	flag.Uint64Var(&p.Seed, "seed", p.Seed, "seed: the same seed and flags offer the same requests")
	flag.IntVar(&p.Tenants, "tenants", p.Tenants, "tenants")
	flag.IntVar(&p.Enterprise, "enterprise", p.Enterprise, "enterprise tenants")
	flag.IntVar(&p.Standard, "standard", p.Standard, "standard tenants (the rest are free)")
	flag.Float64Var(&p.ZipfS, "zipf", p.ZipfS, "Zipf exponent over tenants")
	flag.IntVar(&p.Whales, "whales", p.Whales, "tenants named whale-N (the heaviest)")
	flag.IntVar(&p.KeysPerTenant, "keys", p.KeysPerTenant, "api keys per tenant")
	flag.Float64Var(&p.Rate, "rate", p.Rate, "offered requests per second (without spikes)")
	flag.DurationVar(&p.Duration, "duration", p.Duration, "run length")
	flag.Var(&sp, "spike", "tenant:rate:from:to, a noisy neighbour's extra requests per second between two times (repeatable)")
	flag.StringVar(&o.Mode, "mode", "", "override the plane's mode: local, central or local-reconciled")
	flag.StringVar(&o.Fairness, "fairness", "", "override the plane's fairness: none, maxmin, wfq or drr")
	flag.StringVar(&o.ShareBy, "share-by", "", "override the plane's shareBy: tenant or tier")
	flag.Int64Var(&o.GlobalPerSecond, "global-rps", 0, "override the plane's global rate")
	flag.Parse()

	eps, err := parseMix(*mix)
	if err != nil {
		return err
	}
	if !slices.Contains(load.Routings, *routing) {
		return fmt.Errorf("-routing %q: use one of %s", *routing, strings.Join(load.Routings, ", "))
	}
	p.Endpoints, p.Spikes = eps, sp
	if *reconcileMs > 0 {
		o.ReconcileInterval = time.Duration(*reconcileMs) * time.Millisecond
	}
	b, err := p.Build()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var t load.Target
	var orc *load.BucketOracle
	var global *policy.Limit // the plane's, for an in-process target
	var outage *outageRun    // -upstream
	switch *target {
	case "null":
		t = load.Null{}
	case "http":
		if *urls == "" {
			return errors.New("-target http needs -urls")
		}
		if t, err = load.NewHTTPTarget(strings.Split(*urls, ","), *conns); err != nil {
			return err
		}
	case "inproc":
		pol, err := loadPolicy(*policyDir)
		if err != nil {
			return err
		}
		if pol, err = pol.Override(o); err != nil {
			return err
		}
		g := pol.Global()
		global = &g
		if *oracle {
			if orc, err = load.NewBucketOracle(pol); err != nil {
				return err
			}
		}
		var rdb redis.UniversalClient
		password := os.Getenv("QUOTAPLANE_REDIS_PASSWORD")
		switch {
		case *clusterAddr != "":
			rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(*clusterAddr, ","), Password: password, ContextTimeoutEnabled: true, PoolSize: 64})
		case *redisAddr != "":
			rdb = redis.NewClient(&redis.Options{Addr: *redisAddr, Password: password, ContextTimeoutEnabled: true, PoolSize: 64})
		}
		if rdb != nil {
			defer rdb.Close()
		}
		var opts []enforcer.Option
		if *virtual {
			opts = append(opts, enforcer.WithClock(func() time.Time { return load.Epoch }))
		}
		fleet, err := load.NewFleet(pol, *nodes, rdb, opts...)
		if err != nil {
			return err
		}
		t = fleet
		if *upstreamArg != "" {
			if rdb == nil || *virtual {
				return errors.New("-upstream needs -redis-addr (the plan is in Redis) and real time")
			}
			ex, err := startOutage(ctx, *policyDir, pol, *upstreamArg, *timeline, *sense, rdb, fleet)
			if err != nil {
				return err
			}
			defer ex.stop()
			t, outage = ex.gateway, ex
		}
	default:
		return fmt.Errorf("-target %q: use inproc, http or null", *target)
	}
	defer t.Close()

	opts := load.Options{Virtual: *virtual, Workers: *workers, Warmup: *warmup, Routing: *routing}
	if !*quiet {
		opts.Progress = os.Stderr
	}
	if orc != nil {
		opts.Oracle = orc
	} else if *oracle {
		return errors.New("-oracle needs -target inproc")
	}
	res, err := load.Run(ctx, b, t, opts)
	if err != nil {
		return err
	}
	if global != nil && global.Rate > 0 {
		res.AgainstLimit(global)
	}
	res.Print(os.Stdout)
	if orc != nil {
		fmt.Println(orc)
	}
	if *out != "" {
		if err := res.Write(*out); err != nil {
			return err
		}
		if err := res.Plot(*out); err != nil {
			return err
		}
		if outage != nil {
			if err := outage.write(*out, load.Tiers); err != nil {
				return err
			}
		}
		fmt.Printf("wrote %s\n", *out)
	}
	return nil
}

func loadPolicy(dir string) (*policy.Policy, error) {
	if dir == "" {
		return policy.LoadFS(samples.FS)
	}
	return policy.LoadDir(dir)
}
