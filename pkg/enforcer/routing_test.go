package enforcer

import (
	"context"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// A routing sends arrival k of tenant i to one of n nodes.
type routing struct {
	name  string
	route func(i, k, n int) int
}

var routings = []routing{
	{"round-robin", func(i, k, n int) int { return (i + k) % n }},
	{"pinned", func(i, k, n int) int { return i % n }},
	// 90% to the tenant's node, 10% to the next.
	{"skewed", func(i, k, n int) int {
		if k%10 == 9 {
			return (i + 1) % n
		}
		return i % n
	}},
}

// levelPlane is a plane in mode whose only binding limit, at rate/s with
// a burst of one second, is at level: the tenant's, its endpoint's or its
// api key's; the global limit is far above the load.
func levelPlane(t testing.TB, plane, mode string, level Level, rate int, interval time.Duration) *policy.Policy {
	lim := sprintf("{rate: %d, burst: %d}", rate, rate)
	tier := "{name: t, weight: 1}"
	endpoint := "spec: {endpoint: x, cost: 1}"
	switch level {
	case LevelTenant:
		tier = "{name: t, weight: 1, tenant: " + lim + "}"
	case LevelKey:
		tier = "{name: t, weight: 1, key: " + lim + "}"
	case LevelEndpoint:
		endpoint = "spec: {endpoint: x, cost: 1, limit: " + lim + "}"
	}
	doc := withMode(planeHeader, mode, "reconcileInterval: "+interval.String())
	doc = sprintf("%s  global: {rate: 1000000, burst: 1000000}\n  fairness: none\n  tiers: [%s]\n", doc, tier)
	doc += "---\napiVersion: quotaplane.io/v1alpha1\nkind: EndpointQuota\nmetadata: {name: x}\n" + endpoint + "\n"
	return policytest.Compile(t, strings.ReplaceAll(doc, "name: test}", "name: "+plane+"}"))
}

// routedAdmission offers each of tenants tenants perTenant requests a
// second for warm+d through nodes, routed by route, and returns each
// tenant's admitted rate after the warm-up.
func routedAdmission(t testing.TB, nodes []*Engine, tenants, perTenant int, route func(i, k, n int) int, warm, d time.Duration) (rates []float64, lag time.Duration) {
	admitted := make([]int64, tenants)
	var maxLag atomic.Int64 // how late a request went out at worst, ns
	var wg sync.WaitGroup
	start := time.Now()
	steady := start.Add(warm)
	for i := range tenants {
		wg.Go(func() {
			ticker := time.NewTicker(2 * time.Millisecond)
			defer ticker.Stop()
			for k := 0; ; <-ticker.C {
				elapsed := time.Since(start)
				if elapsed >= warm+d {
					return
				}
				for due := int(elapsed.Seconds() * float64(perTenant)); k < due; k++ {
					// Counted by when it was sent, not answered: on a loaded
					// machine answers lag, and a window of answer times
					// would also count tokens of the warm-up.
					counted := time.Now().After(steady)
					if late := time.Since(start) - time.Duration(k)*time.Second/time.Duration(perTenant); late > time.Duration(maxLag.Load()) {
						maxLag.Store(int64(late)) // a race between tenants only underestimates
					}
					e := nodes[route(i, k, len(nodes))]
					dec, err := e.Decide(context.Background(), Request{Tenant: sprintf("t%d", i), Endpoint: "x", APIKey: sprintf("key-%d", i)})
					if err != nil {
						t.Error(err)
						return
					}
					if dec.Allow && counted {
						admitted[i]++
					}
				}
			}
		})
	}
	wg.Wait()
	rates = make([]float64, tenants)
	for i, a := range admitted {
		rates[i] = float64(a) / d.Seconds()
	}
	return rates, time.Duration(maxLag.Load())
}

// TestReconciledLevelsFollowRouting: four nodes, tenants each offered
// twice their limit, routed round-robin, pinned to one node each (a
// balancer hashing by tenant), or 90/10 over two nodes; at each of the
// tenant, endpoint and key levels the tenants are admitted their limit
// within 5% on average over the fleet: in local-reconciled at a 200ms
// reconcile interval (16 tenants, 50/s), and in central (8 tenants, 20/s:
// Redis decides every request, under the race detector too). Before every
// level was reconciled, a pinned tenant got a quarter of its limit in
// local-reconciled. A cell whose requests went out more than half a
// reconcile interval late (a machine loaded by other packages' tests) is
// logged, not judged; if such a cell is off its limits, the test skips.
func TestReconciledLevelsFollowRouting(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of real time")
	}
	srv := redistest.Start(t)
	const nodes = 4
	const interval = 200 * time.Millisecond
	var loaded []string // cells too loaded to judge
	type cell struct {
		mode          string
		level         Level
		route         routing
		rate, tenants int
	}
	for _, m := range []struct {
		mode          string
		rate, tenants int
	}{{"local-reconciled", 50, 16}, {"central", 20, 8}} {
		var cells []cell
		for _, l := range []Level{LevelTenant, LevelEndpoint, LevelKey} {
			for _, r := range routings {
				cells = append(cells, cell{m.mode, l, r, m.rate, m.tenants})
			}
		}
		results := make([][]float64, len(cells))
		lags := make([]time.Duration, len(cells))
		var wg sync.WaitGroup
		for c, cl := range cells { // the cells of a mode run at once, each its own plane
			wg.Go(func() {
				p := levelPlane(t, sprintf("routing-%s-%d", cl.mode, c), cl.mode, cl.level, cl.rate, interval)
				var fleet []*Engine
				for n := range nodes {
					// A deadline of a second: the test measures the levels under
					// routing, not the failure mode, which 36 engines under the
					// race detector beside other packages' tests would otherwise
					// set off with the default 50 ms.
					fleet = append(fleet, newEngine(t, p, WithRedis(srv.Client()), WithNodeID(sprintf("%s-c%d-n%d", cl.mode, c, n)), WithRedisTimeout(time.Second)))
				}
				results[c], lags[c] = routedAdmission(t, fleet, cl.tenants, 2*cl.rate, cl.route.route, 1500*time.Millisecond, 3*time.Second)
			})
		}
		wg.Wait()
		for c, cl := range cells {
			var sum, worst float64
			for _, r := range results[c] {
				sum += r
				worst = max(worst, math.Abs(r/float64(cl.rate)-1))
			}
			mean := sum / float64(cl.tenants) / float64(cl.rate)
			t.Logf("%-16s %-8s %-11s admitted %+.1f%% of the limit per tenant on average, worst tenant %.1f%% off (requests up to %s late)", cl.mode, cl.level, cl.route.name, 100*(mean-1), 100*worst, lags[c].Round(time.Millisecond))
			switch {
			case math.Abs(mean-1) <= 0.05:
			case lags[c] > interval/2:
				// Requests went out more than half a reconcile interval
				// late: the machine was too loaded for this cell to
				// measure the levels (other packages' tests run beside
				// it); its result is logged, not judged.
				loaded = append(loaded, sprintf("%s/%s/%s", cl.mode, cl.level, cl.route.name))
			default:
				t.Errorf("%s, %s level, %s routing: tenants admitted %+.1f%% of their limit on average, not within 5%%", cl.mode, cl.level, cl.route.name, 100*(mean-1))
			}
		}
	}
	if len(loaded) > 0 && !t.Failed() {
		t.Skipf("cells %v were off their limits while their requests went out up to half a reconcile interval late or more: too loaded to measure", loaded)
	}
}
