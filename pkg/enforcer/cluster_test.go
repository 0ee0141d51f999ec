package enforcer

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestCluster runs central mode on a 3-master Redis Cluster: one shard is
// one slot and exact; three shards spread the plane, and a split whale,
// over the cluster within its limits; the shards' parts follow demand.
func TestCluster(t *testing.T) {
	realTime(t)
	cluster := redistest.StartCluster(t, 3)
	clients := func(n int) []redis.UniversalClient {
		var cs []redis.UniversalClient
		for range n {
			cs = append(cs, cluster.Client(t))
		}
		return cs
	}
	flush := func() {
		c := cluster.Client(t)
		if err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
			return m.FlushDB(ctx).Err()
		}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("one shard is exact", func(t *testing.T) {
		flush()
		admitted := decideConcurrently(t, exactPlane(t, 1000, ""), clients(2), 2000, func(g int) Request {
			return Request{Tenant: sprintf("t%d", g%26), Endpoint: "read"}
		})
		if admitted != 1000 {
			t.Fatalf("admitted %d of 2000; want exactly 1000", admitted)
		}
	})

	t.Run("three shards stay within the limit", func(t *testing.T) {
		flush()
		p := policytest.Compile(t, withMode(planeHeader, "central", "shards: 3")+`  global: {rate: 0, burst: 999}
  tiers: [{name: t, weight: 1}]
`)
		admitted := decideConcurrently(t, p, clients(2), 2000, func(g int) Request {
			return Request{Tenant: sprintf("t%d", g%60), Endpoint: "read"}
		})
		// Each shard holds a third: 333. Tenants spread over all three
		// and every shard is offered more than its part.
		if admitted != 999 {
			t.Fatalf("admitted %d of 2000; want the three parts of 333", admitted)
		}
	})

	t.Run("a split whale stays within its limit", func(t *testing.T) {
		flush()
		p := policytest.Compile(t, withMode(planeHeader, "central", "shards: 3")+`  global: {rate: 0, burst: 1000000}
  tiers: [{name: t, weight: 1}]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: whale}
spec: {tenant: whale, shards: 3, limit: {rate: 0, burst: 300}}
`)
		admitted := decideConcurrently(t, p, clients(2), 1200, func(g int) Request {
			return Request{Tenant: "whale", Endpoint: "read", APIKey: sprintf("k%d", g%30)}
		})
		if admitted != 300 {
			t.Fatalf("admitted %d of 1200; want the three parts of 100", admitted)
		}
		// The whale's parts are in three slots.
		c := cluster.Client(t)
		var parts int
		for s := range 3 {
			n, err := c.Exists(context.Background(), sprintf("qp:{default/test/%d}:t:5:whale", s)).Result()
			if err != nil {
				t.Fatal(err)
			}
			parts += int(n)
		}
		if parts != 3 {
			t.Fatalf("the whale's tenant bucket is in %d shards, want 3", parts)
		}
	})

	t.Run("a group across shards is all or nothing", func(t *testing.T) {
		flush()
		yaml := withMode(planeHeader, "central", "shards: 3") + `  global: {rate: 0, burst: 1000000}
  tiers: [{name: t, weight: 1, hard: true, tenant: {rate: 0, burst: 600}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: write}
spec: {endpoint: write, cost: 7}
`
		e := centralEngine(t, policytest.Compile(t, yaml), cluster.Client(t), "n0", slowMachine)
		// Two tenants in different shards: the group's parts are two calls.
		shard := func(name string) int { s, _ := e.central.shards.shardOf(3, name, &policy.Tenant{}, ""); return s }
		x, y := "t0", "t1"
		for i := 1; shard(y) == shard(x); i++ {
			y = sprintf("t%d", i)
		}
		now := time.Now()
		rs := []Request{{Tenant: x, Endpoint: "read", Units: 10}, {Tenant: y, Endpoint: "read", Units: 700}}
		ds := make([]Decision, 2)
		if allowed, err := e.DecideAllAt(now, rs, ds); err != nil || allowed || !ds[0].Allow || ds[1].Allow {
			t.Fatalf("%t, %v, %+v; want the second denied", allowed, err, ds)
		}
		if got := remainingIn(t, e, LevelTenant, x); got != 600 {
			t.Fatalf("%s has %d left after its group was denied in another shard, want its 600", x, got)
		}
		if n := e.central.stats.refunds.Load(); n != 1 || e.central.stats.refundFailures.Load() != 0 {
			t.Fatalf("%d refund calls, %d failed; want one", n, e.central.stats.refundFailures.Load())
		}
		// Groups and single decisions race over the shards: every tenant's
		// bucket ends exactly at what was admitted through it.
		flush()
		e = centralEngine(t, policytest.Compile(t, yaml), cluster.Client(t), "n1", slowMachine)
		if err := concurrentGroups(t, e, false, 0); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d refund calls", e.central.stats.refunds.Load())
		if e.central.stats.refunds.Load() == 0 {
			t.Fatal("no group was split and refunded: the race exercises too little")
		}
	})

	t.Run("parts follow demand", func(t *testing.T) {
		flush()
		p := policytest.Compile(t, withMode(planeHeader, "central", "shards: 3")+`  global: {rate: 3000, burst: 300}
  tiers: [{name: t, weight: 1}]
`)
		e := centralEngine(t, p, cluster.Client(t), "n0")
		home, _ := e.central.shards.shardOf(3, "hot", &policy.Tenant{}, "")
		deadline := time.Now().Add(10 * time.Second)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for e.central.shards.weight(home, 3) < 0.8 {
			if time.Now().After(deadline) {
				t.Fatalf("the hot shard's part is %.2f after 10s, want above 0.8", e.central.shards.weight(home, 3))
			}
			<-tick.C
			if _, err := e.Decide(context.Background(), Request{Tenant: "hot", Endpoint: "read"}); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("the hot shard's part is %.3f", e.central.shards.weight(home, 3))
	})
}
