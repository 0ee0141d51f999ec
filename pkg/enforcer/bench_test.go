package enforcer

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// benchPolicy is a plane of n named tenants over three endpoints with limits
// at every level and a global limit far above the load: the uncontended case.
func benchPolicy(b testing.TB, n int, globalRate int64, fairness string) *policy.Policy {
	return policytest.Compile(b, benchPolicyYAML(n, globalRate, fairness))
}

func benchPolicyYAML(n int, globalRate int64, fairness string) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, `%s
  global: {rate: %d, burst: %d}
  fairness: %s
  tiers:
    - {name: enterprise, weight: 8, floorPercent: 20, tenant: {rate: 1000000, burst: 1000000}, key: {rate: 1000000, burst: 1000000}}
    - {name: standard, weight: 4, floorPercent: 10, tenant: {rate: 1000000, burst: 1000000}, key: {rate: 1000000, burst: 1000000}}
    - {name: free, weight: 1, tenant: {rate: 1000000, burst: 1000000}, key: {rate: 1000000, burst: 1000000}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1, limit: {rate: 1000000, burst: 1000000}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: write}
spec: {endpoint: write, cost: 5, limit: {rate: 1000000, burst: 1000000}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec: {endpoint: export, cost: 50, limit: {rate: 1000000, burst: 1000000}}
`, planeHeader, globalRate, globalRate, fairness)
	tiers := []string{"enterprise", "standard", "free"}
	for i := range n {
		fmt.Fprintf(&sb, "---\napiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: t%d}\nspec: {tenant: t%d, tier: %s}\n", i, i, tiers[i%3])
	}
	return sb.String()
}

func benchRequests(n int) []Request {
	rs := make([]Request, n)
	for i := range rs {
		rs[i] = Request{Tenant: fmt.Sprintf("t%d", i), Endpoint: "read", APIKey: fmt.Sprintf("k%d", i)}
	}
	return rs
}

// BenchmarkDecideAtUncontended is the 4-level decision over 5,000 tenants
// with the time given: no level is near its limit.
func BenchmarkDecideAtUncontended(b *testing.B) {
	e := newEngine(b, benchPolicy(b, 5000, 1_000_000_000, "maxmin"))
	rs := benchRequests(5000)
	now := epoch
	for i := range rs {
		mustDecide(b, e, now, rs[i])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond) // a million decisions per virtual second
		if d, _ := e.DecideAt(now, rs[i%len(rs)]); !d.Allow {
			b.Fatal("denied")
		}
	}
}

func BenchmarkDecideAtUncontendedParallel(b *testing.B) {
	e := newEngine(b, benchPolicy(b, 5000, 1_000_000_000, "maxmin"))
	rs := benchRequests(5000)
	var next, clock atomic.Int64
	clock.Store(epoch.UnixMicro())
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(997))
		for pb.Next() {
			i++
			if d, _ := e.DecideAt(time.UnixMicro(clock.Add(1)), rs[i%len(rs)]); !d.Allow {
				b.Fatal("denied")
			}
		}
	})
}

// BenchmarkAllowN is the yardstick: one golang.org/x/time/rate limiter, time given.
func BenchmarkAllowN(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(1e12), 1<<30)
	now := epoch
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		if !l.AllowN(now, 1) {
			b.Fatal("denied")
		}
	}
}

func BenchmarkAllowNParallel(b *testing.B) {
	l := rate.NewLimiter(rate.Limit(1e12), 1<<30)
	var clock atomic.Int64 // one clock for all goroutines, as in the engine's parallel benchmarks
	clock.Store(epoch.UnixMicro())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !l.AllowN(time.UnixMicro(clock.Add(1)), 1) {
				b.Fatal("denied")
			}
		}
	})
}

// BenchmarkDecideAtUncontendedHot is the same decision over 16 tenants whose
// state stays in cache: the cost of the logic without memory misses.
func BenchmarkDecideAtUncontendedHot(b *testing.B) {
	e := newEngine(b, benchPolicy(b, 16, 1_000_000_000, "maxmin"))
	rs := benchRequests(16)
	now := epoch
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		if d, _ := e.DecideAt(now, rs[i%len(rs)]); !d.Allow {
			b.Fatal("denied")
		}
	}
}

// BenchmarkDecideAtContended is the decision over 5,000 tenants offering ten
// times a global limit shared by weighted max-min: the fairness path
// (share buckets, demand measurement, the tick's reallocation) and denials.
func BenchmarkDecideAtContended(b *testing.B) {
	e := newEngine(b, benchPolicy(b, 5000, 100_000, "maxmin"))
	rs := benchRequests(5000)
	now := epoch
	for i := range 2_000_000 { // 2 s of virtual time: contention is established
		now = now.Add(time.Microsecond)
		mustDecide(b, e, now, rs[i%len(rs)])
	}
	if !e.PlaneStatusAt(now).Contended {
		b.Fatal("not contended")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		e.DecideAt(now, rs[i%len(rs)])
	}
}

func BenchmarkDecideAtContendedParallel(b *testing.B) {
	e := newEngine(b, benchPolicy(b, 5000, 100_000, "maxmin"))
	rs := benchRequests(5000)
	now := epoch
	for i := range 2_000_000 {
		now = now.Add(time.Microsecond)
		mustDecide(b, e, now, rs[i%len(rs)])
	}
	var clock atomic.Int64
	clock.Store(now.UnixMicro())
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			e.DecideAt(time.UnixMicro(clock.Add(1)), rs[i%len(rs)])
		}
	})
}

// BenchmarkAllowNOver5000 is x/time/rate AllowN over 5,000 limiters in a map,
// the same access pattern as the engine benchmarks: one naive level.
func BenchmarkAllowNOver5000(b *testing.B) { benchAllowNOver5000(b, false) }

// BenchmarkAllowNOver5000OwnKeys is BenchmarkAllowNOver5000 with the map's
// keys its own strings, as the engine's are (the policy's names) and as a
// server's are against names parsed from each request: there a lookup
// compares the key's bytes, where BenchmarkAllowNOver5000's finds the
// request's own string and compares nothing.
func BenchmarkAllowNOver5000OwnKeys(b *testing.B) { benchAllowNOver5000(b, true) }

// benchAllowNOver5000 is the yardstick, the map's keys the requests' own
// strings or (ownKeys) copies of them.
func benchAllowNOver5000(b *testing.B, ownKeys bool) {
	limiters := make(map[string]*rate.Limiter, 5000)
	rs := benchRequests(5000)
	for _, r := range rs {
		name := r.Tenant
		if ownKeys {
			name = strings.Clone(name)
		}
		limiters[name] = rate.NewLimiter(rate.Limit(1e12), 1<<30)
	}
	now := epoch
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		if !limiters[rs[i%len(rs)].Tenant].AllowN(now, 1) {
			b.Fatal("denied")
		}
	}
}

// BenchmarkNaiveFourLevels is the naive hierarchy the engine replaces: four
// x/time/rate limiters in maps (global, tenant, endpoint, key), each asked in
// turn — and, unlike the engine, leaking the tokens of the levels before a
// denial.
func BenchmarkNaiveFourLevels(b *testing.B) {
	rs := benchRequests(5000)
	global := rate.NewLimiter(rate.Limit(1e12), 1<<30)
	tenants := map[string]*rate.Limiter{}
	endpoints := map[string]*rate.Limiter{}
	keys := map[string]*rate.Limiter{}
	for _, r := range rs {
		tenants[r.Tenant] = rate.NewLimiter(rate.Limit(1e12), 1<<30)
		endpoints[r.Tenant+"/"+r.Endpoint] = rate.NewLimiter(rate.Limit(1e12), 1<<30)
		keys[r.APIKey] = rate.NewLimiter(rate.Limit(1e12), 1<<30)
	}
	epKeys := make([]string, len(rs))
	for i, r := range rs {
		epKeys[i] = r.Tenant + "/" + r.Endpoint
	}
	now := epoch
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		r := &rs[i%len(rs)]
		if !global.AllowN(now, 1) || !tenants[r.Tenant].AllowN(now, 1) || !endpoints[epKeys[i%len(rs)]].AllowN(now, 1) || !keys[r.APIKey].AllowN(now, 1) {
			b.Fatal("denied")
		}
	}
}

// zipfSequence is n tenant indexes drawn from Zipf(s=1.2) over tenants: the
// skew of seed 002's load profile, where whales carry most traffic.
func zipfSequence(n, tenants int) []int {
	rng := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(rng, 1.2, 1, uint64(tenants-1))
	seq := make([]int, n)
	for i := range seq {
		seq[i] = int(z.Uint64())
	}
	return seq
}

// BenchmarkDecideAtUncontendedZipf is the uncontended decision over 5,000
// tenants with Zipf-skewed traffic, as in seed 002's load profile.
func BenchmarkDecideAtUncontendedZipf(b *testing.B) {
	e := newEngine(b, benchPolicy(b, 5000, 1_000_000_000, "maxmin"))
	rs := benchRequests(5000)
	seq := zipfSequence(1<<16, len(rs))
	now := epoch
	for i := range rs {
		mustDecide(b, e, now, rs[i])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		if d, _ := e.DecideAt(now, rs[seq[i&(len(seq)-1)]]); !d.Allow {
			b.Fatal("denied")
		}
	}
}

// BenchmarkAllowNOver5000Zipf is the yardstick with the same traffic.
func BenchmarkAllowNOver5000Zipf(b *testing.B) {
	limiters := make(map[string]*rate.Limiter, 5000)
	rs := benchRequests(5000)
	for _, r := range rs {
		limiters[r.Tenant] = rate.NewLimiter(rate.Limit(1e12), 1<<30)
	}
	seq := zipfSequence(1<<16, len(rs))
	now := epoch
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now = now.Add(time.Microsecond)
		if !limiters[rs[seq[i&(len(seq)-1)]].Tenant].AllowN(now, 1) {
			b.Fatal("denied")
		}
	}
}
