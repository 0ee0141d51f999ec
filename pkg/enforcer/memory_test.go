package enforcer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

const memoryPlane = planeHeader + `
  global: {rate: 1000000, burst: 1000000}
  tiers:
    - name: free
      tenant: {rate: 0, burst: 5}
      key: {rate: 1000, burst: 1000}
`

// TestFloodOfUnknownTenantsIsBounded sends one request from each of 100,000
// distinct unknown tenants: the engine keeps at most WithMaxTenants states
// (the rest share one), every request is still decided, and the heap does
// not grow with the flood.
func TestFloodOfUnknownTenantsIsBounded(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, memoryPlane), WithMaxTenants(1000))
	var before, after runtime.MemStats
	for i := range 1000 { // fill the engine up to the bound
		mustDecide(t, e, at(0), Request{Tenant: fmt.Sprintf("warm-%d", i), Endpoint: "read", APIKey: "k"})
	}
	runtime.GC()
	runtime.ReadMemStats(&before)
	denied := 0
	for i := range 100_000 {
		d := mustDecide(t, e, at(time.Duration(i)*time.Microsecond), Request{Tenant: fmt.Sprintf("flood-%d", i), Endpoint: "read", APIKey: fmt.Sprintf("key-%d", i)})
		if !d.Allow {
			denied++
			if d.Level != LevelTenant {
				t.Fatalf("flood request %d denied at %q; want tenant (the shared overflow state)", i, d.Level)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if n := e.PlaneStatusAt(at(time.Second)).Tenants; n > 1001 {
		t.Errorf("engine keeps %d tenant states after the flood; want at most 1,000 + the overflow state", n)
	}
	// The overflow state holds 5 tokens with no refill: the flood shares them.
	if denied != 100_000-5 {
		t.Errorf("denied %d of the flood; want all but the 5 tokens of the shared overflow state", denied)
	}
	if growth := int64(after.HeapAlloc) - int64(before.HeapAlloc); growth > 4<<20 {
		t.Errorf("heap grew by %d bytes during a flood of unknown tenants; want it bounded (< 4 MiB)", growth)
	}
}

// TestFloodOfApiKeysIsBounded sends requests with 20,000 distinct api keys for
// one tenant: at most WithMaxKeysPerTenant keys get their own state.
func TestFloodOfApiKeysIsBounded(t *testing.T) {
	e := newEngine(t, policytest.Compile(t, memoryPlane), WithMaxKeysPerTenant(100))
	for i := range 20_000 {
		if _, err := e.DecideAt(at(0), Request{Tenant: "one", Endpoint: "read", APIKey: fmt.Sprintf("key-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	s, ok := e.TenantStatusAt(at(0), "one")
	if !ok {
		t.Fatal("no state for tenant one")
	}
	keys := 0
	for _, l := range s.Limits {
		if l.Level == LevelKey {
			keys++
		}
	}
	if keys > 101 {
		t.Errorf("tenant has %d key states; want at most 100 + one shared by the rest", keys)
	}
}

// TestIdleStateIsPrunedOnlyWhenLossless leaves 1,000 unknown tenants idle:
// those whose buckets refilled are forgotten after the idle TTL, while one
// that still owes tokens (its limit never refills) is kept, so forgetting
// never changes a decision.
func TestIdleStateIsPrunedOnlyWhenLossless(t *testing.T) {
	p := policytest.Compile(t, planeHeader+`
  global: {rate: 1000000, burst: 1000000}
  defaultTier: free
  tiers:
    - name: free
      tenant: {rate: 1000, burst: 5}
    - name: frozen
      tenant: {rate: 0, burst: 5}
`)
	e := newEngine(t, p, WithIdleTTL(time.Minute))
	for i := range 1000 {
		mustDecide(t, e, at(0), Request{Tenant: fmt.Sprintf("idle-%d", i), Endpoint: "read"})
	}
	mustDecide(t, e, at(0), Request{Tenant: "owes", Tier: "frozen", Endpoint: "read"})
	if n := e.PlaneStatusAt(at(0)).Tenants; n != 1001 {
		t.Fatalf("%d tenant states before idling; want 1001", n)
	}
	// Ticks after the TTL sweep one registry shard each.
	for i := range 2 * registryShards {
		mustDecide(t, e, at(2*time.Minute+time.Duration(i)*200*time.Millisecond), Request{Tenant: "active", Endpoint: "read"})
	}
	if n := e.PlaneStatusAt(at(3 * time.Minute)).Tenants; n != 2 {
		t.Errorf("%d tenant states after the idle TTL; want 2 (active, and owes, which still owes tokens)", n)
	}
	s, ok := e.TenantStatusAt(at(3*time.Minute), "owes")
	if !ok || s.Limits[0].Remaining != 4 {
		t.Errorf("tenant owes: ok=%v status %+v; want its state kept with 4 tokens left", ok, s.Limits)
	}
}

// TestStateBoundsFitTheMemory: the caps StateBounds gives a memory budget
// keep the states it allows, at the measured bytes of a tenant and a key,
// within half of it; and a tiny budget still keeps 1,000 tenants.
func TestStateBoundsFitTheMemory(t *testing.T) {
	for _, mib := range []int64{64, 256, 1024, 4096} {
		limit := mib << 20
		tenants, keys := StateBounds(limit)
		if used := int64(tenants)*TenantStateBytes + int64(keys)*KeyStateBytes; used > limit/2 || used < limit/2*9/10 {
			t.Errorf("%d MiB: %d tenants and %d keys take %d MiB; want just under half", mib, tenants, keys, used>>20)
		}
	}
	if tenants, keys := StateBounds(256 << 10); tenants != 1000 || keys != 2000 {
		t.Errorf("256 KiB: %d tenants, %d keys; want the floor of 1,000 and 2,000", tenants, keys)
	}
	if tenants, _ := StateBounds(256 << 20); tenants != 335_544 {
		t.Errorf("256 MiB: %d tenants; the doc says 335,000", tenants)
	}
}

// TestCentralFloodIsBoundedInRedis: mode central keeps what a flood of new
// names leaves in Redis to the engine's bounds, as mode local keeps its
// memory. 3,000 distinct unknown tenants, each with an api key of its own,
// past WithMaxTenants(100), then 2,000 api keys of one tenant past
// WithMaxKeysPerTenant(50): the tenants beyond the bound share the overflow
// state's buckets in Redis (5 tokens that never refill), the keys beyond it
// the overflow key's. Before, each name got buckets of its own: some 6,000
// keys in Redis, each until its bucket is full again.
func TestCentralFloodIsBoundedInRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	e := centralEngine(t, policytest.Compile(t, withMode(memoryPlane, "central")), client, "n1",
		WithMaxTenants(100), WithMaxKeysPerTenant(50))
	ctx := context.Background()
	decide := func(r Request) Decision {
		t.Helper()
		d, err := e.Decide(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	admitted := 0
	for i := range 3000 {
		if decide(Request{Tenant: fmt.Sprintf("flood-%d", i), Endpoint: "read", APIKey: fmt.Sprintf("key-%d", i)}).Allow {
			admitted++
		}
	}
	keys, err := client.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("3,000 new tenants: %d admitted, %d keys in Redis", admitted, keys)
	// 100 tenants with a tenant and a key bucket each, the overflow
	// state's two, and the plane's own (global, fleet).
	if keys > 2*101+10 {
		t.Errorf("%d keys in Redis after 3,000 new tenants; want at most those of 100 tenant states and the overflow state's", keys)
	}
	if admitted != 100+5 {
		t.Errorf("admitted %d; want the 100 tenants with states of their own and 5 of the rest (the overflow state's bucket)", admitted)
	}

	// A tenant whose own limit lets every key through.
	wide := strings.Replace(memoryPlane, "tenant: {rate: 0, burst: 5}", "tenant: {rate: 1000000, burst: 1000000}", 1)
	e = centralEngine(t, policytest.Compile(t, withMode(wide, "central")), client, "n2", WithMaxKeysPerTenant(50))
	before := keys
	admitted = 0
	for i := range 2000 {
		d := decide(Request{Tenant: "one", Endpoint: "read", APIKey: fmt.Sprintf("many-%d", i)})
		switch {
		case d.Allow:
			admitted++
		case d.Level != LevelKey:
			t.Fatalf("api key %d denied at %q; want only the key level (the shared overflow key)", i, d.Level)
		}
	}
	if keys, err = client.DBSize(ctx).Result(); err != nil {
		t.Fatal(err)
	}
	t.Logf("2,000 api keys of one tenant: %d admitted, %d more keys in Redis", admitted, keys-before)
	if admitted < 50+1000 {
		t.Errorf("admitted %d of 2,000; want the 50 keys with states of their own and at least the overflow key's burst of 1,000", admitted)
	}
	// Its tenant bucket, 50 key buckets and the overflow key's, and what
	// a second plane adds (its global and fleet keys).
	if keys-before > 1+50+1+10 {
		t.Errorf("%d more keys in Redis after 2,000 api keys of one tenant; want at most its 50 key states' and the overflow key's", keys-before)
	}
}

// TestTenantIndexMatchesAMap: the registry's open-addressed index (with
// backward-shift deletion) holds what a map does through random puts and
// removes, on a hash with few bits so that runs collide and wrap.
func TestTenantIndexMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	hash := func(ts *tenantState) uint64 { return uint64(ts.id % 37) }
	var idx tenantIndex
	want := map[string]*tenantState{}
	for i := range 20_000 {
		name := sprintf("t%d", rng.IntN(300))
		ts := want[name]
		switch {
		case ts == nil:
			ts = &tenantState{id: uint32(rng.Uint32()), name: name}
			idx.put(hash(ts), ts, hash)
			want[name] = ts
		case rng.IntN(2) == 0:
			if !idx.remove(hash(ts), ts, hash) {
				t.Fatalf("step %d: %s not removed", i, name)
			}
			delete(want, name)
		}
		if idx.n != len(want) {
			t.Fatalf("step %d: %d states, want %d", i, idx.n, len(want))
		}
		for name, ts := range want {
			if got := idx.get(hash(ts), name); got != ts {
				t.Fatalf("step %d: %s is %p, want %p", i, name, got, ts)
			}
		}
		if ghost := (&tenantState{id: 1, name: "absent"}); idx.get(hash(ghost), ghost.name) != nil || idx.remove(hash(ghost), ghost, hash) {
			t.Fatalf("step %d: a state never put is found", i)
		}
	}
	got := idx.appendTo(nil)
	if len(got) != len(want) || slices.ContainsFunc(got, func(ts *tenantState) bool { return want[ts.name] != ts }) {
		t.Fatalf("appendTo: %d states, want %d", len(got), len(want))
	}
}

// TestAppendAllInAddressOrder: the registry hands out every state once, in
// the order of their addresses, and its sort keeps no state alive.
func TestAppendAllInAddressOrder(t *testing.T) {
	var r registry
	r.init()
	for _, n := range []int{0, 1, 2, 5000} {
		for i := range n {
			r.getOrCreate(sprintf("t%d-%d", n, i), "", 0)
		}
		all := r.appendAll([]*tenantState{nil}) // appended after what dst holds
		if len(all) != int(r.count.Load())+1 || all[0] != nil {
			t.Fatalf("%d states: appendAll gave %d after the one given", r.count.Load(), len(all)-1)
		}
		seen := map[*tenantState]bool{}
		for i, ts := range all[1:] {
			if seen[ts] || r.get(ts.name) != ts {
				t.Fatalf("state %d (%s) twice or not the registry's", i, ts.name)
			}
			seen[ts] = true
			if i > 0 && uintptr(unsafe.Pointer(all[i])) >= uintptr(unsafe.Pointer(ts)) {
				t.Fatalf("states %d and %d are not in address order", i-1, i)
			}
		}
		for i, ts := range r.sortScratch {
			if ts != nil {
				t.Fatalf("the sort's scratch keeps state %d (%s)", i, ts.name)
			}
		}
	}
}
