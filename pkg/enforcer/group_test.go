package enforcer

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// groupModes are the backends every group test runs in: the engine's own
// state (local; local-reconciled on one node, which enforces the whole
// plane; central while Redis is down, whose failureMode degrade decides on
// the node's share, the whole plane on one node) and the script (central).
var groupModes = []struct {
	name, mode string
	redisDown  bool
}{
	{name: "local", mode: "local"},
	{name: "local-reconciled", mode: "local-reconciled"},
	{name: "central", mode: "central"},
	{name: "central/redis-down", mode: "central", redisDown: true},
}

// inRedis reports whether the mode's buckets live in Redis.
func inRedis(mode string, redisDown bool) bool { return mode == "central" && !redisDown }

// groupEngine is an engine on plane yaml in the given mode: on srv (flushed
// first; stopped after the engine starts when redisDown), with reconciles
// out of the way (an hour apart) and a breaker that stays open.
func groupEngine(t *testing.T, srv *redistest.Server, mode string, redisDown bool, yaml string, opts ...Option) *Engine {
	t.Helper()
	p := policytest.Compile(t, withMode(yaml, mode, "reconcileInterval: 1h"))
	if mode == "local" {
		return newEngine(t, p, opts...)
	}
	srv.Restart() // empty, and up again after a mode that stopped it
	c := srv.Client()
	e := newEngine(t, p, append(replayOptions(c, "n1", redisDown), opts...)...)
	if redisDown {
		srv.Stop()
	}
	return e
}

// groupPlane has every level: a global limit, tenant limits (gold tenants
// borrow from a burst pool, iron ones are hard), key limits, a token
// bucket and a sliding window on endpoints.
func groupPlane(name string) string {
	return strings.Replace(planeHeader, "name: test", "name: "+name, 1) + `  global: {rate: 1000, burst: 100000}
  tiers:
    - {name: gold, weight: 1, tenant: {rate: 10, burst: 60}, key: {rate: 10, burst: 100}}
    - {name: iron, weight: 1, hard: true, tenant: {rate: 10, burst: 20}}
---
apiVersion: quotaplane.io/v1alpha1
kind: BurstPool
metadata: {name: pool}
spec: {size: 500, refillRate: 10, perTenantCeiling: 100}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: search}
spec: {endpoint: search, cost: 1, limit: {rate: 30, period: 1m, algorithm: slidingWindow}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec: {endpoint: export, cost: 50, limit: {rate: 1, burst: 60, period: 1h}}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: a}
spec: {tenant: a, tier: gold}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: b}
spec: {tenant: b, tier: gold}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: h}
spec: {tenant: h, tier: iron}
`
}

// stateAt is everything a decision can change, at now, as text, leaving
// out what is as a fresh state would be (a full bucket, an empty window, a
// counter at 0), which is the same to every decision as no state: in the
// engine's own state the exact level of every bucket (token·µs) and window
// (tokens left), the plane's admitted count and every tenant's counters of
// admissions; in mode central, also every key of the plane in Redis (but
// the demand counter and the node set), raw, named without the plane's
// prefix.
func stateAt(t *testing.T, e *Engine, c *redis.Client, now time.Time) string {
	t.Helper()
	nowUs := now.UnixMicro()
	var sb strings.Builder
	level := func(name string, l *limiter) string {
		switch {
		case l == nil || !l.active():
			return ""
		case l.window() != nil:
			if left := l.remainingAt(nowUs); left < l.rate() {
				return fmt.Sprintf(" %s w%d", name, left)
			}
			return ""
		}
		c := *l
		c.refill(nowUs)
		if c.full() {
			return ""
		}
		return fmt.Sprintf(" %s %d", name, c.level)
	}
	counter := func(name string, n int64) string {
		if n == 0 {
			return ""
		}
		return fmt.Sprintf(" %s %d", name, n)
	}
	pl := &e.plane
	pl.mu.Lock()
	if line := level("global", &pl.global) + level("pool", &pl.pool) + counter("admitted", pl.admitted); line != "" {
		fmt.Fprintf(&sb, "plane:%s\n", line)
	}
	pl.mu.Unlock()
	states := e.tenants.appendAll(nil)
	slices.SortFunc(states, func(a, b *tenantState) int { return strings.Compare(a.name, b.name) })
	for _, ts := range states {
		ts.mu.Lock()
		c := ts.countersLocked()
		line := counter("admitted", c.admitted) + counter("cost", c.admittedCost) + counter("borrowed", c.borrowed)
		if ts.snap != nil {
			line += level("tenant", &ts.limit) + level("allowance", ts.allowanceLocked())
			eps := ts.endpointsLocked()
			for i := range eps {
				line += level(ts.snap.endpoints[ts.rec.endpoints[i].ep].Name, &eps[i])
			}
			keys := slices.SortedFunc(ts.keys.all(), func(a, b *keyState) int { return strings.Compare(a.key, b.key) })
			for _, ks := range keys {
				line += level("key "+ks.key, &ks.limit)
			}
		}
		if line != "" {
			fmt.Fprintf(&sb, "%s:%s\n", ts.name, line)
		}
		ts.mu.Unlock()
	}
	if c == nil || e.Policy().Spec().Mode != "central" {
		return sb.String()
	}
	ctx := context.Background()
	prefix := string(keyspace.PlanePrefix(e.Policy().ID()))
	keys, err := c.Keys(ctx, prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if strings.HasSuffix(k, ":d") || strings.HasSuffix(k, ":nodes") || strings.HasPrefix(strings.TrimPrefix(k, prefix), "fd:") {
			// Not decision state: the fairness loop's report of this
			// node's demand (fd:<node>) is measured in real time, and
			// named by the node.
			continue
		}
		switch typ := c.Type(ctx, k).Val(); typ {
		case "string":
			fmt.Fprintf(&sb, "%s = %s\n", strings.TrimPrefix(k, prefix), hex.EncodeToString([]byte(c.Get(ctx, k).Val())))
		case "list":
			fmt.Fprintf(&sb, "%s = %v\n", strings.TrimPrefix(k, prefix), c.LRange(ctx, k, 0, -1).Val())
		default:
			fmt.Fprintf(&sb, "%s: %s\n", strings.TrimPrefix(k, prefix), typ)
		}
	}
	return sb.String()
}

// twinEngines are two engines in mode on groupPlane, each the only node of
// its plane: in the distributed modes on one Redis, under two planes' keys.
func twinEngines(t *testing.T, srv *redistest.Server, mode string) (*Engine, *Engine) {
	if mode == "local" {
		return groupEngine(t, srv, mode, false, groupPlane("test")), groupEngine(t, srv, mode, false, groupPlane("test"))
	}
	srv.Restart()
	var engines [2]*Engine
	for i, name := range []string{"one", "two"} {
		engines[i] = newEngine(t, policytest.Compile(t, withMode(groupPlane(name), mode, "reconcileInterval: 1h")),
			replayOptions(srv.Client(), "n"+name, false)...)
	}
	return engines[0], engines[1]
}

// upRedis is the engine's Redis client unless Redis is down.
func upRedis(e *Engine, down bool) *redis.Client {
	if down {
		return nil
	}
	return redisOf(e)
}

// redisOf is the engine's Redis client, nil without one.
func redisOf(e *Engine) *redis.Client {
	c, _ := e.redis.(*redis.Client)
	return c
}

// TestDecideAllDeniedGroupLeavesNoDebit: a group whose last request is over
// its endpoint limit leaves every bucket, window, pool and borrow allowance
// of its first requests exactly as it found them (and counts no
// admission), though they passed on their own terms: tokens at every level,
// a borrow from the pool and a sliding window's entry. In every mode.
func TestDecideAllDeniedGroupLeavesNoDebit(t *testing.T) {
	srv := redistest.Start(t)
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, groupPlane("test"))
			now := at(time.Hour)
			if d := mustDecide(t, e, now, Request{Tenant: "b", Endpoint: "export", APIKey: "kb"}); !d.Allow || d.Borrowed != 0 {
				t.Fatalf("b's first export: %+v", d)
			}
			before := stateAt(t, e, upRedis(e, m.redisDown), now)
			rs := []Request{
				{Tenant: "a", Endpoint: "export", APIKey: "ka"},            // 50 of a's 60
				{Tenant: "a", Endpoint: "search", APIKey: "ka", Units: 15}, // a window's entry; 10 own tokens and 5 borrowed
				{Tenant: "b", Endpoint: "export", APIKey: "kb"},            // 10 tokens left of b's export limit
			}
			ds := make([]Decision, len(rs))
			allowed, err := e.DecideAllAt(now, rs, ds)
			if err != nil || allowed {
				t.Fatalf("DecideAllAt: %t, %v; want denied", allowed, err)
			}
			if !ds[0].Allow || ds[0].Borrowed != 0 || !ds[1].Allow || ds[1].Borrowed != 5 {
				t.Fatalf("the first requests pass on their own terms: %+v, %+v", ds[0], ds[1])
			}
			if ds[2].Allow || ds[2].Level != LevelEndpoint || ds[2].Remaining != 10 {
				t.Fatalf("the last request: %+v; want denied at its endpoint with 10 left", ds[2])
			}
			if after := stateAt(t, e, upRedis(e, m.redisDown), now); after != before {
				t.Fatalf("a denied group changed the state:\nbefore\n%s\nafter\n%s", before, after)
			}
			// Negative control: the same requests admitted one by one change it.
			for _, r := range rs[:2] {
				if d := mustDecide(t, e, now, r); !d.Allow {
					t.Fatalf("%+v alone: %+v", r, d)
				}
			}
			if after := stateAt(t, e, upRedis(e, m.redisDown), now); after == before {
				t.Fatal("the state does not show admissions: the comparison cannot fail")
			}
		})
	}
}

// TestDecideAllAdmittedGroupIsItsRequestsInOrder: an admitted group debits
// exactly what its requests decided alone in the same order debit, in
// every mode (compared with a twin engine on a plane of its own).
func TestDecideAllAdmittedGroupIsItsRequestsInOrder(t *testing.T) {
	srv := redistest.Start(t)
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			if m.redisDown {
				t.Skip("two engines on one stopped Redis: the group's own tests cover it")
			}
			e, twin := twinEngines(t, srv, m.mode)
			now := at(time.Hour)
			rs := []Request{
				{Tenant: "a", Endpoint: "export", APIKey: "ka"},
				{Tenant: "a", Endpoint: "search", APIKey: "ka", Units: 15},
				{Tenant: "b", Endpoint: "read", APIKey: "kb", Units: 7},
				{Tenant: "unknown-1", Endpoint: "search", Tier: "iron"},
			}
			ds := make([]Decision, len(rs))
			allowed, err := e.DecideAllAt(now, rs, ds)
			if err != nil || !allowed {
				t.Fatalf("DecideAllAt: %t, %v, %+v", allowed, err, ds)
			}
			for i, r := range rs {
				if want := mustDecide(t, twin, now, r); !ds[i].Same(&want) {
					t.Errorf("request %d: group %+v, alone %+v", i, ds[i], want)
				}
			}
			got, want := stateAt(t, e, redisOf(e), now), stateAt(t, twin, redisOf(twin), now)
			if got != want {
				t.Fatalf("state after the group\n%s\nafter its requests alone\n%s", got, want)
			}
		})
	}
}

// TestDecideAllSameTenantCosts: two requests of one tenant need both costs
// at its level: each fits alone, together they do not, and the group
// leaves the tenant's bucket as it was; two that fit together take both.
func TestDecideAllSameTenantCosts(t *testing.T) {
	srv := redistest.Start(t)
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, groupPlane("test"))
			now := at(time.Hour)
			before := stateAt(t, e, upRedis(e, m.redisDown), now)
			ds := make([]Decision, 2)
			rs := []Request{{Tenant: "h", Endpoint: "read", Units: 15}, {Tenant: "h", Endpoint: "read", Units: 10}}
			allowed, err := e.DecideAllAt(now, rs, ds)
			if err != nil || allowed || !ds[0].Allow || ds[1].Allow || ds[1].Level != LevelTenant || ds[1].Remaining != 5 {
				t.Fatalf("15 then 10 of a tenant's 20: %t, %v, %+v; want the second denied at the tenant level with 5 left", allowed, err, ds)
			}
			if after := stateAt(t, e, upRedis(e, m.redisDown), now); after != before {
				t.Fatalf("state changed:\n%s\n%s", before, after)
			}
			rs[1].Units = 5
			if allowed, err := e.DecideAllAt(now, rs, ds); err != nil || !allowed || ds[1].Remaining != 0 || ds[1].Bound != LevelTenant {
				t.Fatalf("15 then 5: %t, %v, %+v", allowed, err, ds)
			}
			if d := mustDecide(t, e, now, Request{Tenant: "h", Endpoint: "read"}); d.Allow {
				t.Fatalf("the tenant's 20 are spent, yet %+v", d)
			}
		})
	}
}

// TestDecideAllOneIsDecide: a group of one decides as Decide does, request
// after request on random sequences: the same decisions, errors and state.
func TestDecideAllOneIsDecide(t *testing.T) {
	srv := redistest.Start(t)
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			if m.redisDown {
				t.Skip("two engines on one stopped Redis")
			}
			grouped, single := twinEngines(t, srv, m.mode)
			rng := rand.New(rand.NewPCG(3, 4))
			now := at(time.Hour)
			tenants := []string{"a", "b", "h", "u1", "u2"}
			endpoints := []string{"read", "search", "export", "other", "Export", "bad name"}
			for step := range 400 {
				now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
				r := Request{Tenant: tenants[rng.IntN(len(tenants))], Endpoint: endpoints[rng.IntN(len(endpoints))],
					APIKey: []string{"", "k1", "k2"}[rng.IntN(3)], Units: int64(rng.IntN(4))}
				want, werr := single.DecideAt(now, r)
				ds := make([]Decision, 1)
				allowed, gerr := grouped.DecideAllAt(now, []Request{r}, ds)
				var re *RequestError
				switch {
				case werr != nil && (!errors.As(gerr, &re) || re.Index != 0 || re.Err.Error() != werr.Error()):
					t.Fatalf("step %d %+v: Decide's error %v, the group's %v", step, r, werr, gerr)
				case werr == nil && (gerr != nil || !ds[0].Same(&want) || allowed != want.Allow):
					t.Fatalf("step %d %+v: Decide %+v, the group %t %+v %v", step, r, want, allowed, ds[0], gerr)
				}
			}
			if got, want := stateAt(t, grouped, redisOf(grouped), now), stateAt(t, single, redisOf(single), now); got != want {
				t.Fatalf("state after groups of one\n%s\nafter Decide\n%s", got, want)
			}
		})
	}
}

// TestDecideAllRequestErrors: a request that cannot be decided fails the
// group with its index before anything is decided: no decision, no state,
// no debit, whatever the requests before it.
func TestDecideAllRequestErrors(t *testing.T) {
	srv := redistest.Start(t)
	deny := strings.Replace(groupPlane("test"), "  tiers:", "  unknownTenants: deny\n  unknownEndpoints: deny\n  tiers:", 1)
	ok := Request{Tenant: "a", Endpoint: "export", APIKey: "ka"}
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, deny)
			now := at(time.Hour)
			before, tenants := stateAt(t, e, upRedis(e, m.redisDown), now), e.tenants.count.Load()
			for _, tc := range []struct {
				bad  Request
				want error
			}{
				{Request{Tenant: "a", Endpoint: "read", Units: -1}, ErrInvalidRequest},
				{Request{Tenant: "", Endpoint: "read"}, ErrInvalidRequest},
				{Request{Tenant: "a", Endpoint: "export "}, ErrInvalidRequest},
				{Request{Tenant: "stranger", Endpoint: "read"}, ErrUnknownTenant},
				{Request{Tenant: "a", Endpoint: "nosuch"}, ErrUnknownEndpoint},
			} {
				rs := []Request{ok, ok, tc.bad, ok}
				ds := make([]Decision, len(rs))
				allowed, err := e.DecideAllAt(now, rs, ds)
				var re *RequestError
				if allowed || !errors.As(err, &re) || re.Index != 2 || !errors.Is(err, tc.want) ||
					!strings.HasPrefix(err.Error(), "request 2: ") {
					t.Fatalf("%+v: %t, %v; want a *RequestError at 2 wrapping %v", tc.bad, allowed, err, tc.want)
				}
				if ds[0] != (Decision{}) {
					t.Fatalf("%+v: the first request was decided: %+v", tc.bad, ds[0])
				}
			}
			for _, n := range []int{0, MaxGroup + 1} {
				if _, err := e.DecideAllAt(now, make([]Request, n), make([]Decision, n)); !errors.Is(err, ErrInvalidRequest) {
					t.Fatalf("a group of %d: %v", n, err)
				}
			}
			if _, err := e.DecideAllAt(now, []Request{ok, ok}, make([]Decision, 1)); !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("2 requests, 1 decision: %v", err)
			}
			if after := stateAt(t, e, upRedis(e, m.redisDown), now); after != before || e.tenants.count.Load() != tenants {
				t.Fatalf("refused groups changed the state:\n%s\n%s", before, after)
			}
		})
	}
}

// TestDecideAllConcurrentExact: groups (of 2 to 4 requests over 6 tenants,
// often the same tenant twice) and single decisions race on buckets that
// never refill. Every bucket ends exactly at its burst less the cost of
// what was admitted through it (no partial debit stays, none is lost), and
// no bucket admits more than its burst. In every mode; a naive group that
// decides its requests one by one and stops at the first denial fails the
// same check (the negative control).
func TestDecideAllConcurrentExact(t *testing.T) {
	srv := redistest.Start(t)
	yaml := planeHeader + `  global: {rate: 0, burst: 3000}
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
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, yaml, WithRedisTimeout(10*time.Second))
			if err := concurrentGroups(t, e, false, 3000); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("negative-control", func(t *testing.T) {
		// With the global level binding, a group is mostly denied at its
		// first request, and a naive group may keep no partial debit at
		// all (a CI run under -race saw none): here the tenants bind, so
		// groups are cut in their middle all the time.
		e := newEngine(t, policytest.Compile(t, strings.Replace(yaml, "burst: 3000", "burst: 1000000", 1)))
		if err := concurrentGroups(t, e, true, 1000000); err == nil {
			t.Fatal("a group that keeps partial debits passes the check: it cannot fail")
		} else {
			t.Logf("the naive group fails as it should: %v", err)
		}
	})
}

// concurrentGroups runs the race of TestDecideAllConcurrentExact and
// checks the buckets against what was admitted: the tenants', of 600
// tokens each, and the global one of globalBurst tokens (0: not checked).
// naive decides groups one request at a time, keeping the debits of a
// group that fails.
func concurrentGroups(t *testing.T, e *Engine, naive bool, globalBurst int64) error {
	const goroutines, rounds = 8, 150
	const tenantBurst = 600
	tenants := []string{"t0", "t1", "t2", "t3", "t4", "t5"}
	var mu sync.Mutex
	admitted := map[string]int64{}
	var total int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			ds := make([]Decision, 4)
			for range rounds {
				n := 1 + rng.IntN(4)
				rs := make([]Request, n)
				for i := range rs {
					rs[i] = Request{Tenant: tenants[rng.IntN(len(tenants))], Endpoint: []string{"read", "write"}[rng.IntN(2)], Units: int64(rng.IntN(5))}
					if i > 0 && rng.IntN(2) == 0 {
						rs[i].Tenant = rs[0].Tenant
					}
				}
				var allowed bool
				var err error
				switch {
				case naive:
					allowed = true
					for i, r := range rs {
						if ds[i], err = e.Decide(context.Background(), r); err != nil || !ds[i].Allow {
							allowed = false
							break
						}
					}
				case n == 1:
					ds[0], err = e.Decide(context.Background(), rs[0])
					allowed = ds[0].Allow
				default:
					allowed, err = e.DecideAll(context.Background(), rs, ds[:n])
				}
				if err != nil {
					t.Error(err)
					return
				}
				if !allowed {
					continue
				}
				mu.Lock()
				for i := range rs {
					admitted[rs[i].Tenant] += ds[i].Cost
					total += ds[i].Cost
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var problems []string
	if globalBurst > 0 && total > globalBurst {
		problems = append(problems, fmt.Sprintf("admitted %d in all, more than the global burst %d", total, globalBurst))
	}
	if got := remainingIn(t, e, LevelGlobal, ""); globalBurst > 0 && got != globalBurst-total {
		problems = append(problems, fmt.Sprintf("global: %d left; admitted %d of %d", got, total, globalBurst))
	}
	for _, name := range tenants {
		if admitted[name] > tenantBurst {
			problems = append(problems, fmt.Sprintf("%s: admitted %d, more than its burst %d", name, admitted[name], tenantBurst))
		}
		if got := remainingIn(t, e, LevelTenant, name); got != tenantBurst-admitted[name] {
			problems = append(problems, fmt.Sprintf("%s: %d left; admitted %d of %d", name, got, admitted[name], tenantBurst))
		}
	}
	t.Logf("admitted %d", total)
	if total < int64(len(tenants))*tenantBurst/2 {
		problems = append(problems, fmt.Sprintf("admitted only %d: the race exercises too little", total))
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// remainingIn is the whole tokens left in a bucket that never refills (the
// global one, or a tenant's), wherever the mode keeps it.
func remainingIn(t *testing.T, e *Engine, level Level, tenant string) int64 {
	t.Helper()
	p := e.Policy()
	if p.Spec().Mode == "central" && !e.BackendStatus().Degraded {
		key := keyspace.PlanePrefix(p.ID()).Global()
		lim := p.Spec().Global
		if level == LevelTenant {
			tq, _ := p.DefaultTenant(tenant, "")
			if known, ok := p.Tenant(tenant); ok {
				tq = known
			}
			prefixes := shardPrefixes(p)
			shard, _ := e.central.shards.shardOf(len(prefixes), tenant, &tq, "")
			key, lim = prefixes[shard].Tenant(keyspace.Holder(tenant), false), *tq.Limit
		}
		v, err := e.redis.Get(context.Background(), key).Bytes()
		if err == redis.Nil {
			return lim.Burst
		}
		if err != nil || len(v) != 32 {
			t.Fatalf("%s: %q, %v", key, v, err)
		}
		return int64(binary.LittleEndian.Uint64(v[:8])) / int64(binary.LittleEndian.Uint64(v[16:24]))
	}
	now := time.Now()
	if level == LevelGlobal {
		return e.PlaneStatusAt(now).Global.Remaining
	}
	s, ok := e.TenantStatusAt(now, tenant)
	if !ok {
		return policyBurst(p, tenant)
	}
	for _, l := range s.Limits {
		if l.Level == LevelTenant {
			return l.Remaining
		}
	}
	t.Fatalf("%s has no tenant limit: %+v", tenant, s)
	return 0
}

func policyBurst(p *policy.Policy, tenant string) int64 {
	t, ok := p.Tenant(tenant)
	if !ok {
		t, _ = p.DefaultTenant(tenant, "")
	}
	return t.Limit.Burst
}

// TestCentralGroupFailureModes: while Redis is down, the plane's
// failureMode decides a whole group: allow admits every request, deny
// denies every one at the global level and says why, degrade decides the
// group on the node's share, all or nothing (a global burst of 3 admits a
// group of 2, then denies the next, debiting nothing of it).
func TestCentralGroupFailureModes(t *testing.T) {
	srv := redistest.Start(t)
	for _, mode := range []string{"allow", "deny", "degrade"} {
		t.Run(mode, func(t *testing.T) {
			p := policytest.Compile(t, withMode(planeHeader, "central", "failureMode: "+mode)+
				"  global: {rate: 0, burst: 3}\n  tiers: [{name: t, weight: 1}]\n")
			srv.Restart()
			e := centralEngine(t, p, srv.Client(), "n1")
			srv.Stop()
			rs := []Request{{Tenant: "a", Endpoint: "x"}, {Tenant: "b", Endpoint: "x"}}
			var outcomes []bool
			for range 3 {
				ds := make([]Decision, 2)
				ok, err := e.DecideAll(context.Background(), rs, ds)
				if err != nil {
					t.Fatal(err)
				}
				outcomes = append(outcomes, ok)
				for _, d := range ds {
					if mode == "deny" && (d.Allow || d.Level != LevelGlobal || d.Reason != reasonUnavailableDeny || d.RetryAfter <= 0) {
						t.Fatalf("deny: %+v", d)
					}
					if mode == "allow" && !d.Allow {
						t.Fatalf("allow: %+v", d)
					}
				}
			}
			want := map[string][]bool{"allow": {true, true, true}, "deny": {false, false, false}, "degrade": {true, false, false}}[mode]
			if !slices.Equal(outcomes, want) {
				t.Fatalf("groups %v, want %v", outcomes, want)
			}
			if mode == "degrade" {
				if left := e.PlaneStatusAt(time.Now()).Global.Remaining; left != 1 {
					t.Fatalf("the node's global bucket holds %d, want 1: the denied groups debited nothing", left)
				}
			}
			if s := e.BackendStatus(); s.Fallbacks != 6 {
				t.Fatalf("status %+v, want 6 decisions by the failure mode", s)
			}
		})
	}
}

// TestCentralGroupNoScript: after SCRIPT FLUSH a group loads the script
// again and is decided as before.
func TestCentralGroupNoScript(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	p := policytest.Compile(t, withMode(planeHeader, "central")+"  global: {rate: 0, burst: 5}\n  tiers: [{name: t, weight: 1}]\n")
	e := centralEngine(t, p, client, "n1")
	ctx := context.Background()
	for i := range 4 {
		if err := client.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		ds := make([]Decision, 2)
		ok, err := e.DecideAll(ctx, []Request{{Tenant: "a", Endpoint: "x"}, {Tenant: "a", Endpoint: "x"}}, ds)
		if err != nil || ok != (i < 2) {
			t.Fatalf("group %d after SCRIPT FLUSH: %t, %v, %+v", i, ok, err, ds)
		}
	}
	if s := e.BackendStatus(); s.Failures != 0 || s.Fallbacks != 0 {
		t.Fatalf("status %+v", s)
	}
}

// TestDecideAllConcurrentRefilling: groups and singles race in virtual
// time on a global limit that refills (1,000 a second, burst 100): what is
// admitted never exceeds the rate × the time elapsed + the burst, and
// comes close to it (the offer is far above); in every mode.
func TestDecideAllConcurrentRefilling(t *testing.T) {
	srv := redistest.Start(t)
	yaml := planeHeader + `  global: {rate: 1000, burst: 100}
  tiers: [{name: t, weight: 1}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: write}
spec: {endpoint: write, cost: 7}
`
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, yaml, WithRedisTimeout(10*time.Second))
			const goroutines, rounds, stepUs = 4, 200, 500
			start := at(time.Hour).UnixMicro()
			var clock, admitted atomic.Int64
			clock.Store(start)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 10))
					ds := make([]Decision, 3)
					for range rounds {
						rs := make([]Request, 1+rng.IntN(3))
						for i := range rs {
							rs[i] = Request{Tenant: fmt.Sprintf("t%d", rng.IntN(5)), Endpoint: []string{"read", "write"}[rng.IntN(2)]}
						}
						ok, err := e.DecideAllAt(time.UnixMicro(clock.Add(stepUs)), rs, ds[:len(rs)])
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							for _, d := range ds[:len(rs)] {
								admitted.Add(d.Cost)
							}
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Duration(clock.Load()-start) * time.Microsecond
			limit := int64(elapsed.Seconds()*1000) + 100
			t.Logf("admitted %d in %s of virtual time; the limit allows %d", admitted.Load(), elapsed, limit)
			if got := admitted.Load(); got > limit || got < limit*7/10 {
				t.Fatalf("admitted %d, want at most %d and close to it", got, limit)
			}
		})
	}
}
