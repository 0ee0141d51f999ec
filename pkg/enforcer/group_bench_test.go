package enforcer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// benchGroups are groups of n requests over benchRequests(tenants): the
// second request of a group is of the first's tenant (the same-tenant case
// Envoy's descriptors of one request have), the others of other tenants.
func benchGroups(tenants, n int) [][]Request {
	rs := benchRequests(tenants)
	groups := make([][]Request, tenants)
	for i := range groups {
		g := make([]Request, n)
		for j := range g {
			g[j] = rs[(i+j)%tenants]
		}
		if n > 1 {
			g[1] = rs[i]
			g[1].Endpoint = "write"
		}
		groups[i] = g
	}
	return groups
}

// BenchmarkDecideAll is DecideAllAt over 5,000 tenants with every level in
// force and the global limit far above the load (as
// BenchmarkDecideAtUncontended), for groups of 1 and 4 requests: the cost
// of a group against its requests decided alone.
func BenchmarkDecideAll(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			e := newEngine(b, benchPolicy(b, 5000, 1_000_000_000, "maxmin"))
			groups := benchGroups(5000, n)
			ds := make([]Decision, n)
			now := epoch
			for _, g := range groups {
				if ok, err := e.DecideAllAt(now, g, ds); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				now = now.Add(time.Microsecond)
				if ok, _ := e.DecideAllAt(now, groups[i%len(groups)], ds); !ok {
					b.Fatal("denied")
				}
			}
		})
	}
}

func BenchmarkDecideAllParallel(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			e := newEngine(b, benchPolicy(b, 5000, 1_000_000_000, "maxmin"))
			groups := benchGroups(5000, n)
			var next, clock atomic.Int64
			clock.Store(epoch.UnixMicro())
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ds := make([]Decision, n)
				i := int(next.Add(997))
				for pb.Next() {
					i++
					if ok, _ := e.DecideAllAt(time.UnixMicro(clock.Add(1)), groups[i%len(groups)], ds); !ok {
						b.Fatal("denied")
					}
				}
			})
		})
	}
}

// boundBenchPolicy is benchPolicy on a plane that binds keys: tenant ti's
// key is ki.
func boundBenchPolicy(b testing.TB, n int) *policy.Policy {
	yaml := strings.Replace(benchPolicyYAML(n, 1_000_000_000, "maxmin"), "spec:\n", "spec:\n  keyBinding: bound\n", 1)
	for i := range n {
		tenant := fmt.Sprintf("spec: {tenant: t%d, tier: ", i)
		yaml = strings.Replace(yaml, tenant, fmt.Sprintf("spec: {keyHashes: [%q], tenant: t%d, tier: ", policy.HashKey(fmt.Sprintf("k%d", i)), i), 1)
	}
	return policytest.Compile(b, yaml)
}

// BenchmarkDecideAtBound is BenchmarkDecideAtUncontended on a plane that
// binds keys to tenants: every decision hashes its key (SHA-256) and looks
// it up among the tenant's.
func BenchmarkDecideAtBound(b *testing.B) {
	e := newEngine(b, boundBenchPolicy(b, 5000))
	rs := benchRequests(5000)
	now := epoch
	for i := range rs {
		mustDecide(b, e, now, rs[i])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		if d, err := e.DecideAt(now, rs[i%len(rs)]); err != nil || !d.Allow {
			b.Fatal(d, err)
		}
	}
}

func BenchmarkDecideAtBoundParallel(b *testing.B) {
	e := newEngine(b, boundBenchPolicy(b, 5000))
	rs := benchRequests(5000)
	var next, clock atomic.Int64
	clock.Store(epoch.UnixMicro())
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(997))
		for pb.Next() {
			i++
			if d, err := e.DecideAt(time.UnixMicro(clock.Add(1)), rs[i%len(rs)]); err != nil || !d.Allow {
				b.Fatal(d, err)
			}
		}
	})
}

// BenchmarkDecideAtBoundRefused is a stolen key's refusal: what a flood of
// them costs (it creates no state).
func BenchmarkDecideAtBoundRefused(b *testing.B) {
	e := newEngine(b, boundBenchPolicy(b, 5000))
	r := Request{Tenant: "t1", Endpoint: "read", APIKey: "k2"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.DecideAt(epoch, r); err == nil {
			b.Fatal("admitted")
		}
	}
}

// BenchmarkCentralDecideAll is DecideAll through Redis (Redis TIME,
// batched) from many goroutines: groups of 1 and 4 requests over 1,000
// tenants, every level and the burst pool in force.
//
//	make bench PKGS=./pkg/enforcer BENCH=CentralDecideAll
func BenchmarkCentralDecideAll(b *testing.B) {
	srv := redistest.Start(b)
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			client := srv.Client()
			if err := client.FlushDB(context.Background()).Err(); err != nil {
				b.Fatal(err)
			}
			e := newEngine(b, centralBenchPolicy(b, 1000), WithRedis(client), WithNodeID("bench"), WithRedisTimeout(time.Second))
			groups := benchGroups(1000, n)
			decisions := sync.Pool{New: func() any { return new([4]Decision) }}
			runLatencies(b, func(i int) bool {
				ds := decisions.Get().(*[4]Decision)
				defer decisions.Put(ds)
				ok, err := e.DecideAll(context.Background(), groups[i%len(groups)], ds[:n])
				return err == nil && ok
			})
			if s := e.BackendStatus(); s.ScriptCalls > 0 {
				b.ReportMetric(float64(s.Decisions)/float64(s.ScriptCalls), "decisions/call")
			}
		})
	}
}
