package enforcer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// redisStatusPlane is a central plane whose limits refill once an hour (so
// that nothing refills a token between a decision at Redis TIME and the
// read that follows it): tenant acme with its own tenant limit, an
// override for api key k1 and the hashes of k2 and k3 (the tier's key
// limit), a bucket endpoint and a window endpoint, and a burst pool.
func redisStatusPlane(t *testing.T) *policy.Policy {
	return policytest.Compile(t, withMode(planeHeader, "central")+`  global: {rate: 1, burst: 500, period: 1h}
  tiers: [{name: std, weight: 1, tenant: {rate: 1, burst: 100, period: 1h}, key: {rate: 1, burst: 3, period: 1h}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec: {endpoint: export, cost: 2, limit: {rate: 1, burst: 6, period: 1h}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: search}
spec: {endpoint: search, cost: 1, limit: {rate: 5, period: 5m, algorithm: slidingWindow}}
---
apiVersion: quotaplane.io/v1alpha1
kind: BurstPool
metadata: {name: pool}
spec: {size: 50, refillRate: 1, perTenantCeiling: 10}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec:
  tenant: acme
  tier: std
  limit: {rate: 1, burst: 4, period: 1h}
  keys: [{key: k1, limit: {rate: 1, burst: 5, period: 1h}}]
  keyHashes: ["`+policy.HashKey("k2")+`", "`+policy.HashKey("k3")+`"]
`)
}

// redisKeys is every level of the plane in Redis (global, pool, tenant,
// allowance, endpoint and key buckets and windows) with its raw value and
// expiry; what background loops write (the heartbeats' node set) is left
// out.
func redisKeys(t *testing.T, c *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "qp:{*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		_, level, _ := strings.Cut(k, "}:")
		if level != "g" && level != "pool" && !strings.HasPrefix(level, "t:") && !strings.HasPrefix(level, "e:") &&
			!strings.HasPrefix(level, "k:") && !strings.HasPrefix(level, "a:") {
			continue
		}
		switch c.Type(ctx, k).Val() {
		case "string":
			fmt.Fprintf(&sb, "%s=%q", k, c.Get(ctx, k).Val())
		case "list":
			fmt.Fprintf(&sb, "%s=%v", k, c.LRange(ctx, k, 0, -1).Val())
		default:
			continue
		}
		fmt.Fprintf(&sb, " expires %v\n", c.ExpireTime(ctx, k).Val())
	}
	return sb.String()
}

func statusLine(l LimitStatus) string {
	name := string(l.Level)
	if l.Name != "" {
		name += " " + l.Name
	}
	return fmt.Sprintf("%s %d/%d", name, l.Remaining, l.Limit.Burst)
}

// TestRedisStatusOf: in mode central the tenant's levels are read from
// Redis — global, tenant, endpoints (bucket and window), the keys the
// policy names that have state, the pool and the borrow allowance — with
// the tokens decide.lua debited, and decide.lua then admits what they say
// is left and no more. Reading writes nothing. Another node, which decided
// none of it, reads the same.
func TestRedisStatusOf(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	p := redisStatusPlane(t)
	e := centralEngine(t, p, c, "node-a")
	ctx := context.Background()
	decide := func(endpoint, key string) Decision {
		t.Helper()
		d, err := e.Decide(ctx, Request{Tenant: "acme", Endpoint: endpoint, APIKey: key})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Two exports with k1 (tenant 4 → 0), a search with k2 that borrows
	// its token from the pool.
	for _, r := range [][2]string{{"export", "k1"}, {"export", "k1"}, {"search", "k2"}} {
		if d := decide(r[0], r[1]); !d.Allow {
			t.Fatalf("%v denied: %+v", r, d)
		}
	}

	before := redisKeys(t, c)
	other := centralEngine(t, p, srv.Client(), "node-b")
	for _, node := range []*Engine{e, other} {
		st, err := node.RedisStatusOf(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		got = append(got, statusLine(st.Global))
		for _, l := range st.Limits {
			got = append(got, statusLine(l))
		}
		got = append(got, fmt.Sprintf("pool %d/%d", st.Pool.Remaining, st.Pool.Limit.Burst), fmt.Sprintf("allowance %d/%d", st.Allowance.Remaining, st.Allowance.Limit.Burst))
		want := []string{
			"global 495/500", "tenant 0/4", "endpoint export 2/6", "endpoint search 4/5",
			"key " + policy.ShortKeyHash("k1") + " 1/5", "key " + policy.ShortKeyHash("k2") + " 2/3", // k3: no state
			"pool 49/50", "allowance 9/10",
		}
		slices.Sort(want[4:6])
		if !slices.Equal(got, want) {
			t.Fatalf("%s reads\n%s\nwant\n%s", node.NodeID(), strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if st.At.IsZero() {
			t.Fatal("no Redis TIME")
		}
	}
	if after := redisKeys(t, c); after != before {
		t.Fatalf("reading changed Redis:\n%s\nwas\n%s", after, before)
	}

	// What is left is what decide.lua admits: one more export (2 of the
	// endpoint's 2, borrowed), then the endpoint denies; k2's 2 searches,
	// then its key denies.
	if d := decide("export", "k3"); !d.Allow {
		t.Fatalf("export with 2 left at its endpoint denied: %+v", d)
	}
	if d := decide("export", "k3"); d.Allow || d.Level != LevelEndpoint {
		t.Fatalf("export with 0 left at its endpoint: %+v; want denied at the endpoint", d)
	}
	for range 2 {
		if d := decide("search", "k2"); !d.Allow {
			t.Fatalf("search with k2 left denied: %+v", d)
		}
	}
	if d := decide("search", "k2"); d.Allow || d.Level != LevelKey {
		t.Fatalf("search with k2 spent: %+v; want denied at the key", d)
	}
}

// TestRedisStatusOfOutsideCentral: an engine not in mode central has no
// fleet state in Redis to read.
func TestRedisStatusOfOutsideCentral(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, sprintf(queuePlane, "maxmin")))
	if _, err := e.RedisStatusOf(context.Background(), "a"); !errors.Is(err, ErrNotCentral) {
		t.Fatalf("RedisStatusOf in mode local = %v; want ErrNotCentral", err)
	}
}
