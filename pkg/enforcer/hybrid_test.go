package enforcer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// smallPlane is the sample plane's free-tier export limit, 2 exports per
// 5 minutes (cost 50, a sliding window of 100), in local-reconciled mode,
// with a tenant limit of 100 an hour when asked (too small to split for an
// export over 3 nodes or more, not for a read), an api key limit big enough to
// split (1000 per hour) and reads.
func smallPlane(t testing.TB, tenantLimit bool) *policy.Policy {
	doc := withMode(planeHeader, "local-reconciled", "reconcileInterval: 50ms")
	tenant := ""
	if tenantLimit {
		tenant = "tenant: {rate: 100, burst: 100, period: 1h}, "
	}
	return policytest.Compile(t, doc+`  global: {rate: 100000, burst: 100000}
  fairness: none
  tiers: [{name: free, weight: 1, `+tenant+`key: {rate: 1000, burst: 1000, period: 1h}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec:
  endpoint: export
  cost: 50
  tiers: [{tier: free, limit: {rate: 100, period: 300s, algorithm: slidingWindow}}]
`)
}

// smallFleet is n local-reconciled engines on srv, once each counts n
// live nodes.
func smallFleet(t *testing.T, srv *redistest.Server, p *policy.Policy, n int, opts ...Option) []*Engine {
	var fleet []*Engine
	for i := range n {
		fleet = append(fleet, newEngine(t, p, append([]Option{WithRedis(srv.Client()), WithNodeID(sprintf("n%d", i))}, opts...)...))
	}
	for _, e := range fleet {
		poll.Until(t, 5*time.Second, "every node to count the fleet", func() bool { return e.snap.Load().splitOver == int64(n) })
	}
	return fleet
}

// TestReconciledSmallLimitsDecidedInRedis: limits too small to split over
// 8 nodes for an export (2 exports per 5 minutes, a tenant's 100 tokens an
// hour: a node's share would be floored at one export) are decided in
// Redis, so the fleet admits exactly 2 exports however they are spread.
// Before, each node admitted one: 8, four times the limit.
func TestReconciledSmallLimitsDecidedInRedis(t *testing.T) {
	srv := redistest.Start(t)
	fleet := smallFleet(t, srv, smallPlane(t, true), 8)
	admitted := 0
	for i := range 24 {
		d, err := fleet[i%len(fleet)].Decide(context.Background(), Request{Tenant: "f", Endpoint: "export", APIKey: sprintf("k%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allow {
			admitted++
		} else if d.Level != LevelTenant && d.Level != LevelEndpoint || d.RetryAfter <= 0 || d.Reason == reasonUnknown {
			t.Errorf("denial %+v: want the tenant or endpoint level, its limit named, a retry time", d)
		}
	}
	if admitted != 2 {
		t.Errorf("the fleet admitted %d exports, want the limit's 2", admitted)
	}
	// A group of two exports of another tenant is admitted whole, a third
	// export then denied: the group's small levels are decided in Redis too.
	rs := []Request{{Tenant: "g", Endpoint: "export"}, {Tenant: "g", Endpoint: "export"}}
	ds := make([]Decision, 2)
	if ok, err := fleet[0].DecideAll(context.Background(), rs, ds); err != nil || !ok {
		t.Fatalf("a group of 2 exports within the limit: %v %v %+v", ok, err, ds)
	}
	if d, _ := fleet[1].Decide(context.Background(), Request{Tenant: "g", Endpoint: "export"}); d.Allow {
		t.Error("a third export admitted after a group of two")
	}
}

// TestReconciledSmallLimitRefunded: an export that Redis admits at its
// small limit but the node denies at a level of its own (the api key's part
// here is used up) is given back in Redis: the fleet still admits the
// limit's 2 exports elsewhere.
func TestReconciledSmallLimitRefunded(t *testing.T) {
	srv := redistest.Start(t)
	fleet := smallFleet(t, srv, smallPlane(t, false), 8)
	ctx := context.Background()
	for { // use up key k's part on node 0
		d, err := fleet[0].Decide(ctx, Request{Tenant: "f", Endpoint: "read", APIKey: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allow {
			break
		}
	}
	if d, _ := fleet[0].Decide(ctx, Request{Tenant: "f", Endpoint: "export", APIKey: "k"}); d.Allow || d.Level != LevelKey {
		t.Fatalf("export on a used-up key: %+v, want denied at the key", d)
	}
	admitted := 0
	for i := 1; i < 8; i++ {
		if d, _ := fleet[i].Decide(ctx, Request{Tenant: "f", Endpoint: "export", APIKey: "k"}); d.Allow {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("after a refunded export the fleet admitted %d, want the limit's 2", admitted)
	}
}

// TestReconciledSmallLimitsWhileDegraded: while Redis is away a small
// limit is the node's own again, at its floored share (failureMode
// degrade), and goes back to Redis when it returns.
func TestReconciledSmallLimitsWhileDegraded(t *testing.T) {
	srv := redistest.Start(t)
	fleet := smallFleet(t, srv, smallPlane(t, false), 2)
	e := fleet[0]
	srv.Stop()
	poll.Until(t, 5*time.Second, "the node to degrade", func() bool { return e.BackendStatus().Degraded && e.snap.Load().splitOver == 0 })
	// The node's share of 2 exports is one (floored at one export).
	for i, want := range []bool{true, false} {
		d, err := e.Decide(context.Background(), Request{Tenant: "f", Endpoint: "export"})
		if err != nil || d.Allow != want {
			t.Fatalf("export %d while degraded: %+v %v, want allowed %v: the node's share of the small limit", i+1, d, err, want)
		}
	}
	srv.Restart()
	poll.Until(t, 5*time.Second, "small limits to be Redis's again", func() bool { return e.snap.Load().splitOver == 2 })
	if d, _ := fleet[1].Decide(context.Background(), Request{Tenant: "h", Endpoint: "export"}); !d.Allow {
		t.Errorf("an export in Redis after the outage: %+v", d)
	}
}

// TestReconciledSmallLimitsCostNothingElse: on a plane with a small limit,
// a request that meets none — a read, cheap enough to split the tenant
// limit that is small for an export — is decided on the node alone,
// allocating nothing.
func TestReconciledSmallLimitsCostNothingElse(t *testing.T) {
	srv := redistest.Start(t)
	e := smallFleet(t, srv, smallPlane(t, true), 3)[0] // 2 exports over 3 nodes: small
	ctx := context.Background()
	read := Request{Tenant: "f", Endpoint: "read", APIKey: "k"}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = e.Decide(ctx, read) }); allocs != 0 {
		t.Errorf("a read on a plane with a small export limit allocates %v times", allocs)
	}
	snap := e.snap.Load()
	exportIdx, _ := snap.policy.EndpointIndex("export")
	readIdx, _ := snap.policy.EndpointIndex("read")
	_, f := snap.smallHolder(e.stateOf(snap, &read), &read)
	if !snap.meetsSmall(f, &Request{Tenant: "f", Endpoint: "export"}, exportIdx, 50) || snap.meetsSmall(f, &read, readIdx, 1) {
		t.Error("meetsSmall does not tell the export from the read")
	}
}

// TestReconciledSmallLimitGroupOfOneTenant: a group of three exports of
// one tenant meets its small limits three times in one decide.lua call;
// each key goes once, so the window sees the group's earlier debits and
// the group (3 exports against 2 per 5 minutes) is denied. Also: units
// that make a read too costly to split send it to Redis.
func TestReconciledSmallLimitGroupOfOneTenant(t *testing.T) {
	srv := redistest.Start(t)
	fleet := smallFleet(t, srv, smallPlane(t, true), 8)
	ctx := context.Background()
	rs := []Request{{Tenant: "g", Endpoint: "export"}, {Tenant: "g", Endpoint: "export"}, {Tenant: "g", Endpoint: "export"}}
	if ok, err := fleet[0].DecideAll(ctx, rs, make([]Decision, 3)); err != nil || ok {
		t.Errorf("a group of 3 exports against a limit of 2 admitted (%v, %v)", ok, err)
	}
	admitted := int64(0)
	for i := range 40 {
		if d, _ := fleet[i%8].Decide(ctx, Request{Tenant: "h", Endpoint: "read", Units: 50}); d.Allow {
			admitted += d.Cost
		}
	}
	if admitted > 100 {
		t.Errorf("reads of 50 units admitted %d tokens against a tenant limit of 100", admitted)
	}
}

// TestReconciledFloodIsBoundedInRedis: a flood of new tenant names, each
// with a new api key, and of new api keys of one tenant, through the small
// limits of local-reconciled (decided in Redis: a tenant's 100 tokens an
// hour, its api key's, the export's window, each too small to split for an
// export over 3 nodes) leaves at most the caps' worth of keys in Redis: a
// tenant beyond -max-tenants is decided on the overflow state's buckets,
// an api key beyond the key budget on the overflow key's, as in mode
// central (TestCentralFloodIsBoundedInRedis) and as the reconcile loop
// names them. Before, each new name wrote its own buckets: 3 per tenant.
func TestReconciledFloodIsBoundedInRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	doc := withMode(planeHeader, "local-reconciled", "reconcileInterval: 50ms")
	p := policytest.Compile(t, doc+`  global: {rate: 100000000, burst: 100000000}
  fairness: none
  tiers: [{name: free, weight: 1, tenant: {rate: 100, burst: 100, period: 1h}, key: {rate: 100, burst: 100, period: 1h}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec:
  endpoint: export
  cost: 50
  tiers: [{tier: free, limit: {rate: 100, period: 300s, algorithm: slidingWindow}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: wide}
spec:
  tenant: wide
  limit: {rate: 100000000, burst: 100000000}
  endpoints: [{endpoint: export, limit: {rate: 100000000, burst: 100000000}}]
`)
	const nodes, maxTenants, maxKeys = 3, 20, 5
	fleet := smallFleet(t, srv, p, nodes, WithMaxTenants(maxTenants), WithMaxKeysPerTenant(maxKeys))
	ctx := context.Background()
	decide := func(i int, r Request) Decision {
		t.Helper()
		d, err := fleet[i%nodes].Decide(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allow && d.Level == LevelGlobal {
			t.Fatalf("request %d denied at global: %+v; want the small levels only", i, d)
		}
		return d
	}
	dbSize := func() int64 {
		t.Helper()
		n, err := client.DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := dbSize() // the plane's own: the fleet's liveness
	const flood = 1500
	admitted := 0
	for i := range flood {
		if decide(i, Request{Tenant: fmt.Sprintf("flood-%d", i), Endpoint: "export", APIKey: fmt.Sprintf("key-%d", i)}).Allow {
			admitted++
		}
	}
	keys := dbSize() - base
	t.Logf("%d new tenants with a key each over %d nodes: %d exports admitted, %d keys in Redis", flood, nodes, admitted, keys)
	// Each node's 20 tenant states: a tenant bucket, the export's window
	// and a key bucket each; the overflow state's tenant bucket and window,
	// each node's 5 keys in it and the overflow key; the reconcile loop's
	// and fleet's own keys (a few).
	if bound := int64(nodes*maxTenants*3 + 2 + nodes*maxKeys + 1 + 10); keys > bound {
		t.Errorf("%d keys in Redis after %d new tenants; want at most %d: the tenant states' and the overflow state's", keys, flood, bound)
	}
	// The tenants with states of their own get their 2 exports' worth (one
	// each here), the rest share the overflow state's 2.
	if want := nodes*maxTenants + 2; admitted != want {
		t.Errorf("admitted %d exports; want %d: one for each tenant with a state of its own, the overflow state's 2", admitted, want)
	}

	// A tenant whose own limits let every key through: its api keys
	// beyond the budget share the overflow key's bucket (the tier's key
	// limit: 2 exports).
	before := dbSize()
	admitted = 0
	for i := range flood {
		d := decide(i, Request{Tenant: "wide", Endpoint: "export", APIKey: fmt.Sprintf("many-%d", i)})
		if d.Allow {
			admitted++
		}
	}
	keys = dbSize() - before
	t.Logf("%d api keys of one tenant: %d exports admitted, %d more keys in Redis", flood, admitted, keys)
	if bound := int64(nodes*maxKeys + 1 + 5); keys > bound {
		t.Errorf("%d more keys in Redis after %d api keys of one tenant; want at most %d: its key states' and the overflow key's", keys, flood, bound)
	}
	if want := nodes*maxKeys + 2; admitted != want {
		t.Errorf("admitted %d exports of one tenant; want %d: one for each key with a state of its own (each asked once), the overflow key's 2", admitted, want)
	}
}
