package enforcer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// cutLink fails every command of a go-redis client while it is set,
// without reaching Redis: a partition of that client from a Redis that
// keeps its state.
type cutLink struct{ cut *atomic.Bool }

func (l cutLink) Allow() error {
	if l.cut.Load() {
		return errors.New("partitioned from redis")
	}
	return nil
}

func (cutLink) ReportResult(error) {}

// TestReconciledOutageDoesNotStarveTenantsUnderTheirLimit: in
// local-reconciled mode, a tenant at 80 % of its limit (40 of 50 tokens/s,
// burst 100) spread over two nodes, while Redis is out of reach of both
// for 5 s (its state kept). The nodes go on at their parts, 40 tokens/s
// in all, within the limit; when Redis is back they push the 200 tokens
// they admitted meanwhile. Before the fix, the fleet's bucket had
// refilled only up to its burst (plus one interval) during the outage, so
// the push left it 90 tokens below empty, and the tenant, under its limit
// all along, was denied for about two seconds after the outage (found by
// TestToxiproxy in test/e2e: every fleet-wide fault in local-reconciled
// cost the tenants at their limit 15-17 % of it). A push now lets the
// bucket refill for the span it covers (reconcile.lua's ARGV[10]).
//
// In real time the tenant's bucket in Redis also expires during such an
// outage (it is written to expire once it would be full again, and the
// nodes push nothing meanwhile), and a missing bucket read as just full
// lost the refill as well: found by TestToxiproxy again (its tenants at
// twice their limits got nothing for 1 to 2 s after a 5 s outage). In
// virtual time keys live an hour, so the case "expired" deletes the
// bucket during the outage as real time would.
func TestReconciledOutageDoesNotStarveTenantsUnderTheirLimit(t *testing.T) {
	for _, expire := range []bool{false, true} {
		t.Run(map[bool]string{false: "kept", true: "expired"}[expire], func(t *testing.T) { reconciledOutage(t, expire) })
	}
}

func reconciledOutage(t *testing.T, expire bool) {
	srv := redistest.Start(t)
	doc := withMode(planeHeader, "local-reconciled", "reconcileInterval: 200ms", "failureMode: degrade")
	p := policytest.Compile(t, doc+"  global: {rate: 100000, burst: 100000}\n  fairness: none\n  tiers: [{name: t, weight: 1, tenant: {rate: 50, burst: 100}}]\n")
	var cut atomic.Bool
	var clock atomic.Int64
	clock.Store(epoch.UnixMicro())
	nodes := make([]*Engine, 2)
	for i := range nodes {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: srv.Password, ContextTimeoutEnabled: true, Limiter: cutLink{&cut}})
		t.Cleanup(func() { c.Close() })
		nodes[i] = newEngine(t, p, WithRedis(c), WithNodeID(sprintf("n%d", i)),
			WithClock(func() time.Time { return time.UnixMicro(clock.Load()) }), withSteppedReconcile())
	}
	for _, e := range nodes {
		e.stepReconcile() // each counts both
	}

	const (
		every             = 25 * time.Millisecond // 40 requests a second, alternating nodes
		outageFrom, until = 10 * time.Second, 15 * time.Second
		end               = 25 * time.Second
	)
	denied := map[string]int{}
	degraded := false
	for at := time.Duration(0); at < end; at += every {
		now := epoch.Add(at)
		clock.Store(now.UnixMicro())
		cut.Store(at >= outageFrom && at < until)
		if expire && at == outageFrom+time.Second {
			bucket := keyspace.PlanePrefix(p.ID()).Tenant(keyspace.Holder("a"), false)
			if n, err := srv.Client().Del(context.Background(), bucket).Result(); err != nil || n != 1 {
				t.Fatalf("delete the tenant's bucket %s: %d deleted, %v", bucket, n, err)
			}
		}
		if at%(200*time.Millisecond) == 0 {
			for _, e := range nodes {
				e.stepReconcile()
				degraded = degraded || e.BackendStatus().Degraded
			}
		}
		d, err := nodes[int(at/every)%2].DecideAt(now, Request{Tenant: "a"})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allow {
			phase := "before the outage"
			switch {
			case at >= until:
				phase = "after the outage"
			case at >= outageFrom:
				phase = "during the outage"
			}
			denied[phase]++
		}
	}
	if !degraded {
		t.Fatal("no node was degraded during the outage: the test cut nothing")
	}
	if len(denied) != 0 {
		t.Errorf("a tenant at 80 %% of its limit was denied: %v; want no denial", denied)
	}
}
