package enforcer

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// centralFleet is n engines in central mode on srv's Redis, each its own
// node, on the plane yaml (written with planeHeader).
func centralFleet(t *testing.T, srv *redistest.Server, yaml string, n int, opts ...Option) []*Engine {
	t.Helper()
	if err := srv.Client().FlushDB(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	p := policytest.Compile(t, withMode(yaml, "central"))
	var engines []*Engine
	for i := range n {
		engines = append(engines, centralEngine(t, p, srv.Client(), sprintf("node%d", i), append([]Option{slowMachine}, opts...)...))
	}
	return engines
}

// offerRealTime offers every tenant's Poisson stream in real time for
// warmup+measure, each request to the next engine in turn (a balancer's
// round robin), and counts what the tenants offered and were admitted of
// the requests scheduled in the measured window. Arrivals are scheduled in
// advance of the answers (an open model): a tick every millisecond sends
// those that are due, each decided in its own goroutine.
func offerRealTime(t *testing.T, engines []*Engine, tenants []fairTenant, seed uint64, warmup, measure time.Duration) scenarioResult {
	t.Helper()
	return offerRealTimeUntil(t, engines, tenants, nil, seed, warmup, measure)
}

// offerRealTimeUntil is offerRealTime with tenant i's stream ending at
// ends[i] after the start (0 or a nil ends: at the end).
func offerRealTimeUntil(t *testing.T, engines []*Engine, tenants []fairTenant, ends []time.Duration, seed uint64, warmup, measure time.Duration) scenarioResult {
	t.Helper()
	offered := make([]atomic.Int64, len(tenants))
	admitted := make([]atomic.Int64, len(tenants))
	var decisions sync.WaitGroup
	var streams sync.WaitGroup
	start := time.Now()
	from, end := start.Add(warmup), start.Add(warmup+measure)
	var failed atomic.Bool
	for i, tn := range tenants {
		end := end
		if i < len(ends) && ends[i] > 0 {
			end = start.Add(ends[i])
		}
		streams.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			gap := func() time.Duration { return time.Duration(rng.ExpFloat64() / tn.offered * float64(time.Second)) }
			r := Request{Tenant: tn.name, Endpoint: "read"}
			next, node := start.Add(gap()), i
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for now := range tick.C {
				for ; !next.After(now) && next.Before(end); next = next.Add(gap()) {
					measured := !next.Before(from)
					e := engines[node%len(engines)]
					node++
					decisions.Go(func() {
						d, err := e.Decide(context.Background(), r)
						if err != nil {
							failed.Store(true)
							return
						}
						if measured {
							offered[i].Add(1)
							if d.Allow {
								admitted[i].Add(1)
							}
						}
					})
				}
				if !next.Before(end) {
					return
				}
			}
		})
	}
	streams.Wait()
	decisions.Wait()
	if failed.Load() {
		t.Fatal("a decision failed")
	}
	for _, e := range engines {
		if n := e.central.stats.degraded.Load(); n != 0 {
			t.Fatalf("%d decisions were made without Redis", n)
		}
	}
	res := scenarioResult{offered: make([]float64, len(tenants)), admitted: make([]float64, len(tenants))}
	for i := range tenants {
		res.offered[i] = float64(offered[i].Load()) / measure.Seconds()
		res.admitted[i] = float64(admitted[i].Load()) / measure.Seconds()
	}
	return res
}

// logShares logs each tenant's offered and admitted rates and fair share.
func logShares(t *testing.T, label string, tenants []fairTenant, res scenarioResult, shares []float64) {
	t.Helper()
	var sb strings.Builder
	for i, tn := range tenants {
		sb.WriteString(sprintf("\n  %-6s offered %7.1f/s  share %7.1f/s  admitted %7.1f/s (%+.1f%%)", tn.name, res.offered[i], shares[i],
			res.admitted[i], 100*(res.admitted[i]/shares[i]-1)))
	}
	t.Logf("%s:%s", label, sb.String())
}

// TestCentralNoisyTenantGetsItsFairShare: four central engines on one
// Redis, a global limit of 1,000 tokens/s; a noisy tenant offers 1,500/s
// and four quiet ones 100 to 250/s, spread round robin over the nodes.
// Every tenant must be admitted within ±5% of its weighted max-min share
// of what they offered (the noisy one 300/s, the quiet ones all they ask),
// and the plane about its global rate. Negative control: with fairness
// none the noisy tenant takes what it grabs, and the same check fails.
func TestCentralNoisyTenantGetsItsFairShare(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: 19 s")
	}
	realTime(t)
	srv := redistest.Start(t)
	const globalRate = 1000
	tiers := []fairTier{{"std", 1, 0}}
	tenants := []fairTenant{
		{name: "noisy", weight: 1, offered: 1500},
		{name: "q1", weight: 1, offered: 100}, {name: "q2", weight: 1, offered: 150},
		{name: "q3", weight: 2, offered: 200}, {name: "q4", weight: 1, offered: 250},
	}
	run := func(fairness string, warmup, measure time.Duration) (worst float64, at int, res scenarioResult, shares []float64) {
		engines := centralFleet(t, srv, scenarioPolicy(t, fairness, "tier", globalRate, tiers, tenants), 4)
		res = offerRealTime(t, engines, tenants, 1, warmup, measure)
		shares = fairShares("tier", globalRate, tiers, tenants, res.offered)
		worst, at = worstDeviation(res, shares)
		logShares(t, fairness, tenants, res, shares)
		return worst, at, res, shares
	}

	worst, at, res, _ := run("maxmin", 4*time.Second, 8*time.Second)
	var total float64
	for _, a := range res.admitted {
		total += a
	}
	t.Logf("maxmin: admitted %.0f/s of %d/s; worst deviation %.2f%% (%s)", total, globalRate, 100*worst, tenants[at].name)
	if worst > 0.05 {
		t.Errorf("%s admitted %.2f%% off its fair share; want within 5%%", tenants[at].name, 100*worst)
	}
	if total < 0.95*globalRate || total > 1.02*globalRate {
		t.Errorf("admitted %.0f/s in all; want the global rate %d/s (−5%%, +2%%)", total, globalRate)
	}

	worst, at, _, _ = run("none", 2*time.Second, 4*time.Second) // the control need only fail the bound: half the run does
	t.Logf("none: worst deviation %.2f%% (%s)", 100*worst, tenants[at].name)
	if worst <= 0.05 {
		t.Errorf("fairness none stayed within 5%% of the fair shares (worst %.2f%%): the check cannot tell fair from unfair", 100*worst)
	}
}

// TestCentralSpikeEndDoesNotStarveItsTier: a whale offers 3,000/s against
// a global 200/s for 5 s and stops; its tier's quiet tenants (60/s in all)
// must pass as they did before once it has stopped. Regression: the
// tier's demand that its tenants' averages did not account for was claimed
// in full, and when the spike ended the tier's average of arrivals lagged
// the whale's, so for about 2 s the lag took the tier's whole share and its
// quiet tenants were paced near zero (experiment 1 in central mode: the
// victims' success after the spike 92%).
func TestCentralSpikeEndDoesNotStarveItsTier(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: 8 s")
	}
	realTime(t)
	srv := redistest.Start(t)
	tiers := []fairTier{{"std", 1, 0}}
	tenants := []fairTenant{
		{name: "whale", weight: 1, offered: 3000},
		{name: "q1", weight: 1, offered: 20}, {name: "q2", weight: 1, offered: 20}, {name: "q3", weight: 1, offered: 20},
	}
	engines := centralFleet(t, srv, scenarioPolicy(t, "maxmin", "tier", 200, tiers, tenants), 4)
	spike := 5 * time.Second
	res := offerRealTimeUntil(t, engines, tenants, []time.Duration{spike}, 4, spike, 3*time.Second)
	var offered, admitted float64
	for i := 1; i < len(tenants); i++ {
		offered, admitted = offered+res.offered[i], admitted+res.admitted[i]
	}
	t.Logf("the 3 s after the spike: quiet tenants offered %.0f/s, admitted %.0f/s", offered, admitted)
	if admitted < 0.97*offered {
		t.Errorf("quiet tenants admitted %.1f%% of what they offered after the spike; want ≥ 97%%", 100*admitted/offered)
	}
}

// TestCentralTierFloorsAreRateGuarantees: under 2.2× overload a tier of
// weight 1 with a floor of 60% keeps 60% of the global rate fleet-wide,
// where its weight alone would give it a fifth, and shares it by max-min
// (its quiet tenant all it asks, its noisy one the rest); the free tier
// (weight 4) gets the other 40%. Each tenant within ±5% of its
// hierarchical share. Negative control: with fairness none the floor is a
// reserve of the global bucket, and the tenants' rates are off their
// shares.
func TestCentralTierFloorsAreRateGuarantees(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: 19 s")
	}
	realTime(t)
	srv := redistest.Start(t)
	const globalRate = 1000
	tiers := []fairTier{{"gold", 1, 60}, {"free", 4, 0}}
	tenants := []fairTenant{
		{name: "g1", tier: 0, weight: 1, offered: 900}, {name: "g2", tier: 0, weight: 1, offered: 100},
		{name: "f1", tier: 1, weight: 1, offered: 600}, {name: "f2", tier: 1, weight: 1, offered: 600},
	}
	run := func(fairness string, warmup, measure time.Duration) (worst float64, at int, gold float64) {
		engines := centralFleet(t, srv, scenarioPolicy(t, fairness, "tier", globalRate, tiers, tenants), 4)
		res := offerRealTime(t, engines, tenants, 2, warmup, measure)
		shares := fairShares("tier", globalRate, tiers, tenants, res.offered)
		logShares(t, fairness, tenants, res, shares)
		worst, at = worstDeviation(res, shares)
		return worst, at, res.admitted[0] + res.admitted[1]
	}
	worst, at, gold := run("maxmin", 4*time.Second, 8*time.Second)
	t.Logf("maxmin: gold admitted %.0f/s (floor 600/s); worst deviation %.2f%% (%s)", gold, 100*worst, tenants[at].name)
	if gold < 0.95*600 {
		t.Errorf("gold admitted %.0f/s; want its floor, 600/s (−5%%)", gold)
	}
	if worst > 0.05 {
		t.Errorf("%s admitted %.2f%% off its share; want within 5%%", tenants[at].name, 100*worst)
	}
	worst, at, gold = run("none", 2*time.Second, 4*time.Second) // the control need only fail the bound: half the run does
	t.Logf("none: gold admitted %.0f/s; worst deviation %.2f%% (%s)", gold, 100*worst, tenants[at].name)
	if worst <= 0.05 {
		t.Errorf("fairness none stayed within 5%% of the shares (worst %.2f%%): the check cannot tell", 100*worst)
	}
}

// TestCentralFairAllocationIsDeterministic: the same reports, added in the
// order of the nodes' ids, give the same water levels bit for bit, and a
// report that does not parse is left out whole.
func TestCentralFairAllocationIsDeterministic(t *testing.T) {
	p := policytest.Compile(t, withMode(scenarioPolicy(t, "maxmin", "tier", 1000, scenarioTiers, nil), "central"))
	snap := newSnapshot(p)
	rng := rand.New(rand.NewPCG(3, 3))
	var reports []string
	for n := range 4 {
		var named, tails []fleetClaim
		for i := range 50 {
			named = append(named, fleetClaim{name: sprintf("t%03d", (i*7+n*13)%120), demand: 200 * rng.Float64(), weight: float64(1 + rng.IntN(8)),
				cap: math.Inf(1), rank: rng.IntN(3)})
		}
		for k := range 3 {
			tails = append(tails, fleetClaim{rank: k, step: int64(rng.IntN(40)) - 20, demand: 50 * rng.Float64(), weight: 10 * rng.Float64()})
		}
		reports = append(reports, string(encodeReport(nil, int64(n), named, tails)))
	}
	levels := func(reports []string) [3]uint64 {
		b := &central{e: &Engine{}}
		b.fair.startFleet()
		for _, r := range reports {
			b.fair.add(r, 3)
		}
		b.allocate(snap, 1, 1, 1)
		v := b.fair.view.Load()
		if v == nil {
			t.Fatal("4 nodes' demand of some 20,000/s against 1,000/s is not contended")
		}
		return [3]uint64{math.Float64bits(v.levels[0]), math.Float64bits(v.levels[1]), math.Float64bits(v.levels[2])}
	}
	want := levels(reports)
	for range 20 {
		if got := levels(reports); got != want {
			t.Fatalf("levels %v, then %v", want, got)
		}
	}
	bad := append([]string{reports[0][:len(reports[0])-3]}, reports[1:]...)
	if got := levels(bad); got == want {
		t.Fatal("a truncated report changed nothing: it was not left out")
	}
	if got := levels(append([]string{reports[0]}, bad...)); got != want {
		t.Fatalf("a truncated report beside a whole one: levels %v, want %v", got, want)
	}
}

// BenchmarkCentralFairness measures central mode's batched decisions, as
// BenchmarkCentral's zipf/batch=true, with fairness none and maxmin on an
// uncontended plane: what the fleet exchange and the decision path's
// check for shares in force cost when nothing is paced.
//
//	go test -run '^$' -bench 'CentralFairness' -benchmem -count 3 ./pkg/enforcer/
func BenchmarkCentralFairness(b *testing.B) {
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 256})
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	const tenants = 1000
	for _, fairness := range []string{"none", "maxmin"} {
		b.Run("fairness="+fairness, func(b *testing.B) {
			if err := client.FlushDB(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			p := policytest.Compile(b, withMode(benchPolicyYAML(tenants, 1_000_000_000, fairness), "central"))
			e := newEngine(b, p, WithRedis(client), WithNodeID("bench"), WithRedisTimeout(time.Second), withRedisConcurrency(2))
			reqs := centralBenchRequests("zipf", tenants)
			runLatencies(b, func(i int) bool {
				d, err := e.Decide(ctx, reqs[i%len(reqs)])
				return err == nil && d.Allow
			})
		})
	}
}

// TestCentralUnattributedDemand: what the tenants whose averages have not
// started offer is claimed in full (its demand per weight below any
// level), from the first measure on, per tier.
func TestCentralUnattributedDemand(t *testing.T) {
	var cf centralFair
	cf.unmeasured.offered[2] = 40 // 400 tokens/s over 0.1 s
	got := cf.unattributed(nil, 3, 0.1, 500*time.Millisecond)
	if len(got) != 1 || got[0].rank != 2 || math.Abs(got[0].demand-400) > 1e-6 || got[0].demand/got[0].weight != unattributedRatio {
		t.Fatalf("claims %+v; want one of tier 2, 400/s, at the unattributed ratio", got)
	}
	p := policytest.Compile(t, withMode(scenarioPolicy(t, "maxmin", "tier", 1000, scenarioTiers, nil), "central"))
	b := &central{e: &Engine{}}
	b.fair.startFleet()
	// Tier 2: a tenant of 2,000/s and the 400/s no tenant's average accounts
	// for; 600/s of tier 2's share goes to the named tenant, all 400 to
	// the rest.
	named := []fleetClaim{{name: "big", demand: 2000, weight: 1, cap: math.Inf(1), rank: 2}}
	b.fair.add(string(encodeReport(nil, 0, named, got)), 3)
	b.allocate(newSnapshot(p), 1, 1, 1)
	v := b.fair.view.Load()
	if v == nil || math.Abs(v.levels[2]-600) > 1e-6 {
		t.Fatalf("free level %v; want 600 (1,000 less the 400 wanted in full)", v)
	}
}

// TestCentralSharesByEitherDefinition: the fleet's allocation, from two
// nodes' reports with a tail step that stands for 100 small tenants,
// gives every tenant the share of each shareBy's reference computed
// tenant by tenant (the tail's tenants have one ratio of demand to weight,
// so they are one claimant to either definition). Negative control: the
// scenario's two references differ, so each result is off the other's.
func TestCentralSharesByEitherDefinition(t *testing.T) {
	const globalRate = 1000
	named := []fleetClaim{
		{name: "e1", demand: 300, weight: 8, cap: math.Inf(1), rank: 0},
		{name: "s1", demand: 200, weight: 4, cap: math.Inf(1), rank: 1},
		{name: "s2", demand: 200, weight: 4, cap: math.Inf(1), rank: 1},
		{name: "f1", demand: 400, weight: 1, cap: math.Inf(1), rank: 2},
	}
	tail := fleetClaim{rank: 2, step: tailStep(3), demand: 300, weight: 100} // 100 tenants of 3/s, weight 1
	var tenants []fairTenant
	var demand []float64
	for _, c := range named {
		tenants = append(tenants, fairTenant{name: c.name, tier: c.rank, weight: int64(c.weight)})
		demand = append(demand, c.demand)
	}
	for i := range 100 {
		tenants = append(tenants, fairTenant{name: sprintf("tail%03d", i), tier: 2, weight: 1})
		demand = append(demand, 3)
	}
	for _, shareBy := range []string{"tier", "tenant"} {
		p := policytest.Compile(t, withMode(scenarioPolicy(t, "maxmin", shareBy, globalRate, scenarioTiers, nil), "central"))
		b := &central{e: &Engine{}}
		b.fair.startFleet()
		b.fair.add(string(encodeReport(nil, 0, named[:2], nil)), 3)
		b.fair.add(string(encodeReport(nil, 0, named[2:], []fleetClaim{tail})), 3)
		b.allocate(newSnapshot(p), 1, 1, 1)
		v := b.fair.view.Load()
		if v == nil {
			t.Fatalf("shareBy %s: 1,400/s against 1,000/s is not contended", shareBy)
		}
		got := make([]float64, len(tenants))
		for i, tn := range tenants {
			got[i] = math.Min(v.levels[tn.tier]*float64(tn.weight), demand[i])
		}
		want := fairShares(shareBy, globalRate, scenarioTiers, tenants, demand)
		if worst, at := worstDeviation(scenarioResult{admitted: got}, want); worst > 1e-6 {
			t.Errorf("shareBy %s: %s's share %.3f/s, the reference's %.3f/s", shareBy, tenants[at].name, got[at], want[at])
		}
		other := map[string]string{"tier": "tenant", "tenant": "tier"}[shareBy]
		if worst, _ := worstDeviation(scenarioResult{admitted: got}, fairShares(other, globalRate, scenarioTiers, tenants, demand)); worst < 0.05 {
			t.Errorf("shareBy %s is within 5%% of shareBy %s's reference: the scenario cannot tell them apart", shareBy, other)
		}
	}
}
