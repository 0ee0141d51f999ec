package enforcer

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// reconciledPlane is a plane in local-reconciled mode with the given global
// rate (burst one second of it) and reconcile interval.
func reconciledPlane(t testing.TB, rate int, interval time.Duration) *policy.Policy {
	return policytest.Compile(t, withMode(planeHeader, "local-reconciled", "reconcileInterval: "+interval.String())+
		sprintf("  global: {rate: %d, burst: %d}\n  fairness: none\n  tiers: [{name: t, weight: 1}]\n", rate, rate))
}

// offer sends requests to the nodes at perSecond in all for d (an open
// loop: arrivals do not wait for answers, and a node that falls behind, or
// whose ticker a busy machine slowed, catches up on the arrivals that were
// due) and returns how many were offered and admitted.
func offer(t testing.TB, nodes []*Engine, perSecond int, d time.Duration) (offered, admitted int64) {
	perNode := float64(perSecond) / float64(len(nodes))
	var ok, all atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i, e := range nodes {
		wg.Go(func() {
			ticker := time.NewTicker(time.Millisecond)
			defer ticker.Stop()
			for sent := 0; ; <-ticker.C {
				elapsed := time.Since(start)
				if elapsed >= d {
					return
				}
				for due := int(elapsed.Seconds() * perNode); sent < due; sent++ {
					d, err := e.Decide(context.Background(), Request{Tenant: sprintf("t%d", (sent*len(nodes)+i)%64), Endpoint: "x"})
					if err != nil {
						t.Error(err)
						return
					}
					all.Add(1)
					if d.Allow {
						ok.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	return all.Load(), ok.Load()
}

// TestReconciledOverage: 8 nodes offered twice the global limit admit at
// most 5% over it at a 200ms reconcile interval, over the whole run from a
// cold start (the limit then includes the burst); the steady state after a
// warm-up of three intervals is reported too, and 50ms and 1s are measured
// for the curve.
func TestReconciledOverage(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of real time")
	}
	realTime(t)
	srv := redistest.Start(t)
	const rate, nodes = 4000, 8
	const d = 4 * time.Second
	for _, interval := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, time.Second} {
		if err := srv.Client().FlushDB(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		p := reconciledPlane(t, rate, interval)
		var fleet []*Engine
		for i := range nodes {
			fleet = append(fleet, newEngine(t, p, WithRedis(srv.Client()), WithNodeID(sprintf("n%d", i))))
		}
		warmUp := max(3*interval, time.Second)
		start := time.Now()
		_, warm := offer(t, fleet, 2*rate, warmUp)
		steadyStart := time.Now()
		offered, admitted := offer(t, fleet, 2*rate, d)
		end := time.Now()
		for _, e := range fleet {
			e.Close()
		}
		whole := float64(warm+admitted)/(rate*end.Sub(start).Seconds()+rate) - 1 // the refill plus the burst
		steady := float64(admitted)/(rate*end.Sub(steadyStart).Seconds()) - 1
		t.Logf("reconcileInterval %s: overage %+.2f%% from a cold start (%s), %+.2f%% in the steady state (%s, offered %d, admitted %d)",
			interval, 100*whole, end.Sub(start).Round(time.Millisecond), 100*steady, end.Sub(steadyStart).Round(time.Millisecond), offered, admitted)
		if offered < int64(1.5*rate*d.Seconds()) {
			t.Fatalf("offered only %d: the load did not exceed the limit", offered)
		}
		// The bound is on the whole run: a window of the steady state
		// also sees the fleet spend or refill the bucket's reserve, which
		// moves it by a few percent either way (logged). At 1s the debt's
		// pay-back overshoots: measured and reported, not bounded here.
		if interval == 200*time.Millisecond && whole > 0.05 {
			t.Errorf("overage at 200ms %.2f%%, over 5%%", 100*whole)
		}
		if interval <= 200*time.Millisecond && whole < -0.10 {
			t.Errorf("admitted %.2f%% below the limit: capacity left unused", -100*whole)
		}
	}
}

// TestReconciledNodeLoss: when a node stops reconciling (it crashed), the
// others take its share within the liveness ttl and the hold of a smaller
// count.
func TestReconciledNodeLoss(t *testing.T) {
	srv := redistest.Start(t)
	const interval = 50 * time.Millisecond
	p := reconciledPlane(t, 1000, interval)
	var fleet []*Engine
	var clients []*redis.Client
	for i := range 4 {
		c := srv.Client()
		clients = append(clients, c)
		fleet = append(fleet, newEngine(t, p, WithRedis(c), WithNodeID(sprintf("n%d", i))))
	}
	poll.Until(t, 5*time.Second, "four nodes", func() bool { return fleet[0].BackendStatus().Nodes == 4 })
	clients[3].Close() // node 3 can no longer reach Redis: to the fleet it is dead
	lost := time.Now()
	poll.Until(t, 5*time.Second, "three nodes, each enforcing a third of the rate (1000/3, rounded)", func() bool {
		for _, e := range fleet[:3] {
			if e.BackendStatus().Nodes != 3 || e.snap.Load().global.Rate != 333 {
				return false
			}
		}
		return true
	})
	seen := time.Since(lost)
	t.Logf("node loss seen after %s (ttl %s)", seen.Round(time.Millisecond), 3*interval)
	// The ttl, then two intervals before a smaller count is believed
	// (fleet.count), then a reconcile.
	if want := 3*interval + 2*interval + 2*interval; seen > want {
		t.Errorf("the loss took %s to see; want the ttl, the hold and a reconcile, %s", seen, want)
	}
}

// TestReconciledFairnessAcrossNodes: a whale whose traffic all arrives at
// one node, and small tenants spread over both, at global overload with
// fairness maxmin. Node shares follow the fleet's fair shares, not raw
// demand: the node without the whale gets what its small tenants need,
// and every small tenant is served as on one node.
func TestReconciledFairnessAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of real time")
	}
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(planeHeader, "local-reconciled", "reconcileInterval: 100ms")+`  global: {rate: 1000, burst: 1000}
  fairness: maxmin
  tiers: [{name: t, weight: 1, tenant: {rate: 100000, burst: 100000}}]
`)
	nodes := []*Engine{
		newEngine(t, p, WithRedis(srv.Client()), WithNodeID("whale-node")),
		newEngine(t, p, WithRedis(srv.Client()), WithNodeID("other")),
	}
	const warmUp, run = 3 * time.Second, 3 * time.Second
	var smallOK, smallAll [2]atomic.Int64
	var whaleOK atomic.Int64
	var measuring atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for i, e := range nodes {
		wg.Go(func() {
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for n := 0; time.Since(start) < warmUp+run; n++ {
				<-tick.C
				measuring.Store(time.Since(start) > warmUp)
				if i == 0 { // the whale: 2,000/s, all here
					for range 2 {
						if d, err := e.Decide(context.Background(), Request{Tenant: "whale", Endpoint: "x"}); err == nil && d.Allow && measuring.Load() {
							whaleOK.Add(1)
						}
					}
				}
				if n%7 == 0 { // ten small tenants, about 14/s each per node
					d, err := e.Decide(context.Background(), Request{Tenant: sprintf("s%d", (n/7)%10), Endpoint: "x"})
					if err != nil {
						t.Error(err)
						return
					}
					if measuring.Load() {
						smallAll[i].Add(1)
						if d.Allow {
							smallOK[i].Add(1)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	whaleRate := float64(whaleOK.Load()) / run.Seconds()
	smallRate := float64(smallOK[0].Load()+smallOK[1].Load()) / run.Seconds()
	t.Logf("whale %.0f/s, small tenants %.0f/s; shares %.3f and %.3f", whaleRate, smallRate,
		nodes[0].reconciler.fraction(), nodes[1].reconciler.fraction())
	for i := range nodes {
		served := float64(smallOK[i].Load()) / float64(smallAll[i].Load())
		t.Logf("%s: small tenants served %.1f%%", nodes[i].nodeID, 100*served)
		if served < 0.95 {
			t.Errorf("%s serves its small tenants %.1f%%, want at least 95%%", nodes[i].nodeID, 100*served)
		}
	}
	if whaleRate+smallRate > 1000*1.05 {
		t.Errorf("the fleet admitted %.0f/s, over the global 1000/s", whaleRate+smallRate)
	}
}

// TestReconciledNodeLeavesNoFields: a node that closes takes its fields out
// of the plane's reconcile hash, its claim curves too: nodes come and go
// under a name each (pods), and a field left behind by each would grow
// the hash for as long as the plane lives.
func TestReconciledNodeLeavesNoFields(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(planeHeader, "local-reconciled", "reconcileInterval: 50ms")+`  global: {rate: 1000, burst: 1000}
  fairness: maxmin
  tiers: [{name: t, weight: 1}]
`)
	e, err := New(p, WithRedis(srv.Client()), WithNodeID("n1"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	rc := keyspace.PlanePrefix(p.ID()).Reconcile()
	poll.Until(t, 10*time.Second, "the node's claim curves pushed", func() bool {
		if _, err := e.Decide(ctx, Request{Tenant: "a"}); err != nil {
			t.Fatal(err)
		}
		n, _ := srv.Client().HExists(ctx, rc, "c:n1").Result()
		return n
	})
	e.Close()
	fields, err := srv.Client().HKeys(ctx, rc).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fields {
		if strings.HasSuffix(f, ":n1") {
			t.Errorf("the reconcile hash keeps %s after the node left: %v", f, fields)
		}
	}
}
