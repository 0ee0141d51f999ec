package enforcer_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// The scale simulation of issue 15 §3 (docs/scale.md, "Simulation"): a
// fleet of local-reconciled engines in one process, each its own node, on
// one real Redis, offered a Zipf load over many tenants in virtual time.
// Decisions are DecideAt at the arrivals' instants (pkg/load's virtual
// run); each node reconciles every reconcileInterval of the same virtual
// time, node i at i/N of the interval (nodes are independent processes,
// not in step), before any decision dated after it (steppedFleet). What it
// measures: the fleet's admitted tokens against the global limit, each
// tenant's admitted rate against its weighted max-min fair share of the
// reference (pkg/load's CompareFairShares, pkg/fairref), and what the
// reconciles cost Redis (INFO commandstats and stats around the run).
//
// TestScaleSim runs a small fleet in `go test` and bounds the overage and
// the fairness error, with a negative control; QUOTAPLANE_SIM=1 runs the
// large one (hack/experiments/scale-sim/run.sh).

// simPlane is the simulated plane: a contended global limit shared by
// seed 002's three tiers under weighted max-min fairness (experiment 5's
// plane, in local-reconciled mode). Every tenant is unknown to the policy
// and takes its tier's defaults, the tier the load generator gives it.
// No limit may be too small to split over the nodes (hybrid.go decides
// those in Redis, at Redis TIME, which virtual time cannot drive): every
// tenant burst holds at least one request per node.
func simPlane(t testing.TB, globalPerSec, nodes int, interval time.Duration, fairness string) *policy.Policy {
	return policytest.Compile(t, fmt.Sprintf(`
apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: scale}
spec:
  mode: local-reconciled
  reconcileInterval: %s
  global: {rate: %d, burst: %d}
  fairness: %s
  defaultTier: free
  unknownTenants: default
  unknownEndpoints: default
  tiers:
    - {name: enterprise, weight: 8, floorPercent: 40, tenant: {rate: 5000, burst: %d}}
    - {name: standard, weight: 4, floorPercent: 25, tenant: {rate: 500, burst: %d}}
    - {name: free, weight: 1, floorPercent: 5, hard: true, tenant: {rate: 50, burst: %d}}
`, interval, globalPerSec, globalPerSec, fairness, max(5000, nodes), max(500, nodes), max(50, nodes)))
}

// simConfig is one simulated run.
type simConfig struct {
	Nodes, Tenants int
	// GlobalPerSec is the plane's global limit, tokens/s; OfferedPerSec
	// the offered requests/s (reads of cost 1: tokens).
	GlobalPerSec     int
	OfferedPerSec    float64
	Duration, Warmup time.Duration
	Interval         time.Duration
	Routing          string // load.Routings
	// Fairness is the plane's: maxmin, or none (a negative control).
	Fairness string
	// Frozen is a negative control: no reconcile after each node's first
	// (in New), so that node k keeps the share it took when it joined a
	// fleet of k+1.
	Frozen bool
}

func (c simConfig) String() string {
	s := fmt.Sprintf("%d nodes, %d tenants, %s virtual (warmup %s), %s, reconcile %s, global %d/s, offered %.0f/s, fairness %s",
		c.Nodes, c.Tenants, c.Duration, c.Warmup, c.Routing, c.Interval, c.GlobalPerSec, c.OfferedPerSec, c.Fairness)
	if c.Frozen {
		s += ", frozen (no reconcile after the first)"
	}
	return s
}

// simResult is what a run measured.
type simResult struct {
	Wall, ReconcileWall time.Duration
	PeakRSSMB           float64
	Decisions           int64
	// Overage is every admitted token against rate × duration + burst
	// (load.Result.AgainstLimit); WorstSecond the highest second's
	// admitted tokens against the rate, after the warmup; Steady the
	// admitted tokens after the warmup against the rate over that time.
	Overage, WorstSecond, Steady float64
	// CappedDemand is the tenants' demand, each capped by its own limit,
	// against the global rate: above 1 the global level is contended.
	CappedDemand float64
	Fairness     *load.FairnessReport
	TierAdmitted map[string]float64 // tokens/s after the warmup
	// What Redis did during the run (the reconciles; decisions are local).
	Reconciles                    int64
	RedisScripts, RedisUsec       int64 // script calls, and the µs Redis spent in them
	RedisCalls, RedisInnerUsec    int64 // the commands the scripts called, and their µs (part of RedisUsec)
	BytesToRedis, BytesFromRedis  int64
	RedisKeys, RedisUsedMemoryMB  int64
	ActiveTenants, NodeTenantsMax int
	// Reshares counts the new shares the nodes installed (each moves
	// every tenant's state on the node): churn a fleet pays for claims
	// that jitter.
	Reshares int64
}

// steppedFleet is the simulated fleet as a load.Target: before a decision
// at now it runs every reconcile due up to now, in order, at its own
// virtual instant (the engines' clock), node step%N at step/N intervals.
type steppedFleet struct {
	*load.Fleet
	clock    *atomic.Int64 // µs since the epoch: every engine's clock
	start    time.Time
	interval time.Duration
	frozen   bool
	step     int64         // the next reconcile's number
	wall     time.Duration // real time spent in reconciles
}

func (f *steppedFleet) Decide(ctx context.Context, node int, now time.Time, r *enforcer.Request) (enforcer.Decision, error) {
	n := int64(len(f.Engines))
	for !f.frozen {
		at := f.start.Add(time.Duration(f.step) * f.interval / time.Duration(n))
		if at.After(now) {
			break
		}
		f.clock.Store(at.UnixMicro())
		began := time.Now()
		f.Engines[f.step%n].StepReconcile()
		f.wall += time.Since(began)
		f.step++
	}
	f.clock.Store(now.UnixMicro())
	return f.Fleet.Decide(ctx, node, now, r)
}

// runSim runs c on a fresh Redis.
func runSim(t testing.TB, c simConfig) *simResult {
	t.Helper()
	srv := redistest.Start(t)
	client := srv.Client()
	p := simPlane(t, c.GlobalPerSec, c.Nodes, c.Interval, c.Fairness)
	built, err := load.Profile{
		Seed: 1, Tenants: c.Tenants, Enterprise: c.Tenants / 100, Standard: c.Tenants * 19 / 100, // seed 002's 1/19/80%
		ZipfS: 1.2, Whales: 20, KeysPerTenant: 1, Endpoints: []load.Endpoint{{Name: "read", Share: 1}},
		Rate: c.OfferedPerSec, Duration: c.Duration,
	}.Build()
	if err != nil {
		t.Fatal(err)
	}
	clock := &atomic.Int64{}
	clock.Store(load.Epoch.UnixMicro())
	fleet, err := load.NewFleet(p, c.Nodes, client,
		enforcer.WithClock(func() time.Time { return time.UnixMicro(clock.Load()) }), enforcer.WithSteppedReconcile(),
		enforcer.WithMaxTenants(c.Tenants), enforcer.WithRedisTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	// Each node's first reconcile (in New) counted only the nodes made
	// before it: one round at the start, so that every node counts them
	// all, as a fleet that has run a while does.
	if !c.Frozen {
		for _, e := range fleet.Engines {
			e.StepReconcile()
		}
		if s := fleet.Engines[0].BackendStatus(); s.Nodes != int64(c.Nodes) {
			t.Fatalf("node 0 counts %d nodes, want %d", s.Nodes, c.Nodes)
		}
	}
	target := &steppedFleet{Fleet: fleet, clock: clock, start: load.Epoch, interval: c.Interval, frozen: c.Frozen, step: int64(c.Nodes)}
	before := redisCounters(t, client)
	began := time.Now()
	res, err := load.Run(context.Background(), built, target, load.Options{Virtual: true, Warmup: c.Warmup, Routing: c.Routing})
	if err != nil {
		t.Fatal(err)
	}
	out := &simResult{Wall: time.Since(began), ReconcileWall: target.wall, Reconciles: target.step - int64(c.Nodes), PeakRSSMB: peakRSSMB()}
	after := redisCounters(t, client)
	out.RedisScripts, out.RedisUsec = after.scripts-before.scripts, after.usec-before.usec
	out.RedisCalls, out.RedisInnerUsec = after.calls-before.calls, after.innerUsec-before.innerUsec
	out.BytesToRedis, out.BytesFromRedis = after.in-before.in, after.out-before.out
	out.RedisKeys, out.RedisUsedMemoryMB = after.keys, after.usedMemory>>20

	global := p.Global()
	res.AgainstLimit(&global)
	out.Overage = res.GlobalOverage
	for _, s := range res.Seconds {
		out.Decisions += s.Offered
	}
	globalPerSec := float64(global.Rate) / global.Period.Seconds()
	var steady int64
	for _, s := range res.Seconds[int(c.Warmup.Seconds()):] {
		steady += s.AdmittedTokens
		out.WorstSecond = max(out.WorstSecond, float64(s.AdmittedTokens)/globalPerSec-1)
	}
	out.Steady = float64(steady)/(globalPerSec*res.Measured) - 1
	if out.Fairness, err = load.CompareFairShares(p, load.RowsFromResult(res), 1, 101); err != nil {
		t.Fatal(err)
	}
	var capped float64
	for _, tr := range out.Fairness.Tiers {
		capped += tr.DemandPerSec
	}
	out.CappedDemand = capped / globalPerSec
	out.TierAdmitted = map[string]float64{}
	for name, tc := range res.Tiers {
		out.TierAdmitted[name] = float64(tc.AdmittedTokens) / res.Measured
	}
	for _, tr := range res.Tenants {
		if tr.Offered > 0 {
			out.ActiveTenants++
		}
	}
	for _, e := range fleet.Engines {
		out.NodeTenantsMax = max(out.NodeTenantsMax, e.PlaneStatusAt(load.Epoch.Add(c.Duration)).Tenants)
		out.Reshares += e.Reshares()
	}
	return out
}

// log writes r as the lines run.sh collects (prefix "sim:").
func (r *simResult) log(t testing.TB, c simConfig) {
	t.Helper()
	perReconcile := func(x int64) float64 { return float64(x) / float64(max(r.Reconciles, 1)) }
	f := r.Fairness
	lines := []string{
		c.String(),
		fmt.Sprintf("wall %s (reconciles %s), peak RSS %.0f MB, %d decisions, %d tenants active after the warmup (of %d), at most %d tenant states on a node, %d new shares installed in %d reconciles",
			r.Wall.Round(time.Millisecond), r.ReconcileWall.Round(time.Millisecond), r.PeakRSSMB, r.Decisions, r.ActiveTenants, c.Tenants, r.NodeTenantsMax, r.Reshares, r.Reconciles),
		fmt.Sprintf("capped demand %.2f× the global limit; overage %+.2f%% whole run, %+.2f%% after the warmup, worst second %+.2f%%",
			r.CappedDemand, 100*r.Overage, 100*r.Steady, 100*r.WorstSecond),
		fmt.Sprintf("fairness over %d tenants with a share ≥ 1 token/s: |admitted−fair|/fair p50 %.1f%%, p90 %.1f%%, p99 %.1f%%, within 5%% %d; worst %s (%s) %+.1f%%",
			f.Considered, 100*f.P50, 100*f.P90, 100*f.P99, f.Within5, f.Worst.Name, f.Worst.FairShare.Tier, 100*f.Worst.Deviation),
		fmt.Sprintf("tail (rank ≥ %d, %d tenants): offered %.0f, fair %.0f, admitted %.0f tokens/s", f.TailFromRank, f.TailTenants, f.TailOffered, f.TailSharePerSec, f.TailAdmitted),
	}
	for _, tr := range f.Tiers {
		lines = append(lines, fmt.Sprintf("tier %s: capped demand %.0f, fair %.0f, admitted %.0f tokens/s (%+.1f%%)",
			tr.Name, tr.DemandPerSec, tr.SharePerSec, r.TierAdmitted[tr.Name], 100*(r.TierAdmitted[tr.Name]/tr.SharePerSec-1)))
	}
	lines = append(lines, fmt.Sprintf("redis: %d reconciles (%d script calls); per reconcile %.0f µs in the script (%.0f µs in its %.0f commands), %.0f bytes to Redis, %.0f bytes back; %.2f s of Redis CPU per virtual second; %d keys, %d MB at the end",
		r.Reconciles, r.RedisScripts, perReconcile(r.RedisUsec), perReconcile(r.RedisInnerUsec), perReconcile(r.RedisCalls),
		perReconcile(r.BytesToRedis), perReconcile(r.BytesFromRedis), float64(r.RedisUsec)/1e6/c.Duration.Seconds(), r.RedisKeys, r.RedisUsedMemoryMB))
	if c.Routing == "pinned" {
		lines = append(lines, nodeShares(f, c.Nodes))
	}
	for _, l := range lines {
		t.Log("sim: " + l)
	}
	t.Logf("row: | %d | %d | %s | %s | %.1f | %.0f | %.0f | %+.1f%% | %+.1f%% | %.1f%% / %.1f%% / %.0f%% | %.1f | %.0f | %.0f / %.0f | %.2f |",
		c.Nodes, c.Tenants, c.Routing, c.Duration, r.Wall.Seconds(), r.PeakRSSMB, float64(r.Decisions), 100*r.Overage, 100*r.Steady,
		100*f.P50, 100*f.P90, 100*f.P99, perReconcile(r.RedisCalls), perReconcile(r.RedisUsec), perReconcile(r.BytesToRedis),
		perReconcile(r.BytesFromRedis), float64(r.RedisUsec)/1e6/c.Duration.Seconds())
}

// nodeShares says how far each node of a pinned fleet admitted from the
// fair shares of its tenants (pkg/load's pinned routing: the tenant of
// rank k on node (k-1) mod nodes), summed: a fleet that gives a node more
// than its tenants' shares gives the others less, whatever each node does
// with its part.
func nodeShares(f *load.FairnessReport, nodes int) string {
	fair, admitted := make([]float64, nodes), make([]float64, nodes)
	for _, tr := range f.Tenants {
		n := (tr.Rank - 1) % nodes
		fair[n] += tr.SharePerSec
		admitted[n] += tr.AdmittedTokensPerSec
	}
	devs := make([]float64, nodes)
	worst := 0
	for n := range nodes {
		devs[n] = (admitted[n] - fair[n]) / max(fair[n], 1e-9)
		if math.Abs(devs[n]) > math.Abs(devs[worst]) {
			worst = n
		}
	}
	sorted := slices.Clone(devs)
	slices.SortFunc(sorted, func(a, b float64) int { return cmp.Compare(math.Abs(a), math.Abs(b)) })
	return fmt.Sprintf("nodes: |admitted−fair|/fair of each node's tenants p50 %.1f%%, p90 %.1f%%; worst node %d: fair %.0f, admitted %.0f tokens/s",
		100*math.Abs(sorted[nodes/2]), 100*math.Abs(sorted[nodes*9/10]), worst, fair[worst], admitted[worst])
}

// simTableHeader heads the rows simResult.log writes.
const simTableHeader = `| nodes | tenants | routing | virtual | wall s | peak RSS MB | decisions | overage (run) | overage (after warmup) | abs(admitted − fair) / fair p50 / p90 / p99 | Redis commands / reconcile | Redis µs / reconcile | bytes to / from Redis / reconcile | Redis CPU s / virtual s |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|`

// TestScaleSim: 10 nodes, 10,000 Zipf tenants, 16 s of virtual time at
// twice the global limit, by round robin. The fleet admits within
// −5%/+3% of the limit over the run, every tier gets its fair share within
// 8% (measured: within 3.9%; −30% and +22% before the engine claimed the
// tail of tenants too sparse to measure, fairness.go's tierTail), and the
// tenants with a fair share of at least 1 token/s get it within 15% at the
// median (measured: 8.5%; small shares split over ten nodes are paced by
// noisy estimates of each node's part).
//
// The same fleet with each tenant pinned to one node (a balancer that
// hashes by tenant) holds the same bounds (measured: tiers within 2.5%,
// tenants 0.0% at the median). Before the nodes claimed the plane and
// paced their tenants by the fleet's levels from their claim curves
// (claim.go) it took 12% and 25% (+7.9%, −6.4%, −5.6% and 16.6%), and
// before the fairness tick counted tenants as spread as
// the fleet reports them (fleetDemand.spread) rather than as spread over
// every node, +30.7%, −40.3%, −14.8% and 36%.
//
// The negative controls must fail those bounds: a fleet whose nodes never
// reconcile after joining (node k keeps the share it took as one of k+1:
// overage), and fairness none (lower tiers shed first: fairness).
func TestScaleSim(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds")
	}
	t.Parallel() // virtual time: deterministic, whatever else runs
	roundRobin := simConfig{Nodes: 10, Tenants: 10_000, GlobalPerSec: 2_000, OfferedPerSec: 4_000, Duration: 16 * time.Second, Warmup: 8 * time.Second,
		Interval: 200 * time.Millisecond, Routing: "round-robin", Fairness: "maxmin"}
	// The controls need only fail the bounds: half the run does.
	frozen, unfair, pinned := roundRobin, roundRobin, roundRobin
	frozen.Frozen, frozen.Duration, frozen.Warmup = true, 8*time.Second, 4*time.Second
	unfair.Fairness, unfair.Duration, unfair.Warmup = "none", 8*time.Second, 4*time.Second
	pinned.Routing = "pinned"
	for _, run := range []struct {
		c                        simConfig
		overageOK, fairnessOK    bool // want the bound to hold
		boundOverage, boundShare bool // check it
		p50, tier                float64
	}{
		{c: roundRobin, overageOK: true, fairnessOK: true, boundOverage: true, boundShare: true, p50: 0.15, tier: 0.08},
		{c: pinned, overageOK: true, fairnessOK: true, boundOverage: true, boundShare: true, p50: 0.15, tier: 0.08},
		{c: frozen, overageOK: false, boundOverage: true},
		{c: unfair, fairnessOK: false, boundShare: true, p50: 0.15, tier: 0.08},
	} {
		r := runSim(t, run.c)
		r.log(t, run.c)
		if r.CappedDemand < 1.5 {
			t.Fatalf("capped demand %.2f× the limit: the global level is not contended enough to test", r.CappedDemand)
		}
		if ok := r.Overage <= 0.03 && r.Overage >= -0.05; run.boundOverage && ok != run.overageOK {
			t.Errorf("%s: overage %+.2f%%: want the bound −5%%/+3%% to hold: %v", run.c, 100*r.Overage, run.overageOK)
		}
		worstTier := 0.0 // the tier furthest from its share, |admitted − fair| / fair
		for _, tr := range r.Fairness.Tiers {
			worstTier = max(worstTier, math.Abs(r.TierAdmitted[tr.Name]/tr.SharePerSec-1))
		}
		if ok := r.Fairness.P50 <= run.p50 && worstTier <= run.tier; run.boundShare && ok != run.fairnessOK {
			t.Errorf("%s: fairness p50 %.1f%%, worst tier %.1f%% off its share: want the bounds %.0f%% and %.0f%% to hold: %v",
				run.c, 100*r.Fairness.P50, 100*worstTier, 100*run.p50, 100*run.tier, run.fairnessOK)
		}
	}
}

// TestScaleSimLarge is the large simulation, run by
// hack/experiments/scale-sim/run.sh: QUOTAPLANE_SIM=1, and
// QUOTAPLANE_SIM_{NODES,TENANTS,GLOBAL,RATE,SECONDS,WARMUP,INTERVAL_MS,ROUTING,FAIRNESS}
// to change its defaults (100 nodes, 1,000,000 tenants, 20,000 tokens/s
// global, 40,000 requests/s offered, 60 s with 20 s of warmup, 200 ms,
// round-robin, maxmin). It only measures.
func TestScaleSimLarge(t *testing.T) {
	if os.Getenv("QUOTAPLANE_SIM") != "1" {
		t.Skip("QUOTAPLANE_SIM=1 runs it (hack/experiments/scale-sim/run.sh)")
	}
	num := func(name string, def int) int {
		v := os.Getenv("QUOTAPLANE_SIM_" + name)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("QUOTAPLANE_SIM_%s=%q: want a positive integer", name, v)
		}
		return n
	}
	c := simConfig{Nodes: num("NODES", 100), Tenants: num("TENANTS", 1_000_000), GlobalPerSec: num("GLOBAL", 20_000),
		OfferedPerSec: float64(num("RATE", 40_000)), Duration: time.Duration(num("SECONDS", 60)) * time.Second,
		Warmup: time.Duration(num("WARMUP", 20)) * time.Second, Interval: time.Duration(num("INTERVAL_MS", 200)) * time.Millisecond,
		Routing: cmp.Or(os.Getenv("QUOTAPLANE_SIM_ROUTING"), "round-robin"), Fairness: cmp.Or(os.Getenv("QUOTAPLANE_SIM_FAIRNESS"), "maxmin")}
	if !slices.Contains(load.Routings, c.Routing) {
		t.Fatalf("QUOTAPLANE_SIM_ROUTING=%q: want one of %v", c.Routing, load.Routings)
	}
	if os.Getenv("QUOTAPLANE_SIM_HEADER") == "1" {
		t.Log("row: " + strings.ReplaceAll(simTableHeader, "\n", "\nrow: "))
	}
	runSim(t, c).log(t, c)
}

// counters are Redis's totals at one moment.
type counters struct {
	// scripts and usec are the script calls and the µs Redis spent in
	// them; calls and innerUsec the commands the scripts called and the µs
	// of those (part of usec: Redis counts them both ways).
	scripts, usec, calls, innerUsec int64
	in, out, keys, usedMemory       int64
}

// redisCounters reads INFO commandstats, stats and memory, and DBSIZE.
func redisCounters(t testing.TB, c *redis.Client) counters {
	t.Helper()
	ctx := context.Background()
	info, err := c.Info(ctx, "commandstats", "stats", "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out counters
	field := func(rest, name string) int64 {
		_, v, _ := strings.Cut(rest, name+"=")
		v, _, _ = strings.Cut(v, ",")
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		name, value, _ := strings.Cut(line, ":")
		n, _ := strconv.ParseInt(value, 10, 64)
		switch {
		case name == "cmdstat_evalsha" || name == "cmdstat_eval":
			out.scripts += field(value, "calls")
			out.usec += field(value, "usec")
		case strings.HasPrefix(name, "cmdstat_") && name != "cmdstat_info":
			out.calls += field(value, "calls")
			out.innerUsec += field(value, "usec")
		case name == "total_net_input_bytes":
			out.in = n
		case name == "total_net_output_bytes":
			out.out = n
		case name == "used_memory":
			out.usedMemory = n
		}
	}
	if out.keys, err = c.DBSize(ctx).Result(); err != nil {
		t.Fatal(err)
	}
	return out
}

// peakRSSMB is the process's peak resident set (VmHWM), in MB.
func peakRSSMB() float64 {
	mb, _ := enforcer.ProcStatusMB("VmHWM")
	return mb
}

// TestSteppedReconcileVirtualTime: a stepped fleet's liveness follows the
// engines' virtual clock, not Redis's: of two nodes, the one that stops
// reconciling is counted out once three intervals of virtual time pass
// and two more confirm it (fleet.count), though only milliseconds of real
// time do.
func TestSteppedReconcileVirtualTime(t *testing.T) {
	srv := redistest.Start(t)
	clock := &atomic.Int64{}
	clock.Store(load.Epoch.UnixMicro())
	fleet, err := load.NewFleet(simPlane(t, 1000, 2, 200*time.Millisecond, "maxmin"), 2, srv.Client(),
		enforcer.WithClock(func() time.Time { return time.UnixMicro(clock.Load()) }), enforcer.WithSteppedReconcile())
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	a, b := fleet.Engines[0], fleet.Engines[1]
	a.StepReconcile()
	if n := a.BackendStatus().Nodes; n != 2 {
		t.Fatalf("node a counts %d nodes, want 2", n)
	}
	clock.Add((time.Second).Microseconds()) // b's liveness (600ms) ends
	a.StepReconcile()
	if n := a.BackendStatus().Nodes; n != 2 {
		t.Fatalf("node a counts %d nodes as soon as b's liveness ends; want 2, held for two intervals", n)
	}
	clock.Add((400 * time.Millisecond).Microseconds()) // the hold of a smaller count (two intervals)
	a.StepReconcile()
	if n := a.BackendStatus().Nodes; n != 1 {
		t.Fatalf("a second of virtual time later node a counts %d nodes, want 1 (b stopped reconciling)", n)
	}
	b.StepReconcile()
	if n := b.BackendStatus().Nodes; n != 2 {
		t.Fatalf("node b counts %d nodes once back, want 2", n)
	}
}
