package enforcer

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// benchMemoryPlane is the sample-like plane of the memory benchmarks: a tenant
// limit, an endpoint limit on one of three endpoints (export, free tier)
// and a key limit.
const benchMemoryPlane = planeHeader + `
  global: {rate: 100000000, burst: 100000000}
  tiers:
    - {name: standard, weight: 4, tenant: {rate: 180000, burst: 3000, period: 1h}, key: {rate: 72000, burst: 1200, period: 1h}}
    - {name: free, weight: 1, tenant: {rate: 3600, burst: 60, period: 1h}, key: {rate: 3600, burst: 60, period: 1h}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: write}
spec: {endpoint: write, cost: 5}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export}
spec: {endpoint: export, cost: 50, tiers: [{tier: free, limit: {rate: 100, burst: 100, period: 5m}}]}
`

// BenchmarkTenantMemory measures the engine's heap per tenant state: n
// tenants the policy does not name (100,000, or QUOTAPLANE_MEMORY_TENANTS)
// decide once each on benchMemoryPlane, with no api key and with one key
// each; the heap is read after a GC. B/tenant is the state of one tenant
// (and its key), what a bound on tenant states multiplies; rss-MB is the
// process's resident memory after (Linux), the whole test binary's.
//
//	go test -run '^$' -bench TenantMemory -benchtime 1x ./pkg/enforcer/
//	QUOTAPLANE_MEMORY_TENANTS=1000000 go test -run '^$' -bench TenantMemory/one-key -benchtime 1x ./pkg/enforcer/
func BenchmarkTenantMemory(b *testing.B) {
	p := policytest.Compile(b, benchMemoryPlane)
	n := memoryTenants(b)
	names, keys := make([]string, n), make([]string, n)
	for i := range n {
		names[i], keys[i] = sprintf("tenant-%07d", i), sprintf("key-%07d", i)
	}
	for _, withKey := range []bool{false, true} {
		b.Run(map[bool]string{false: "no-key", true: "one-key"}[withKey], func(b *testing.B) {
			b.ReportAllocs()
			var perTenant, rss float64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				e := newEngine(b, p, WithMaxTenants(2*n), WithMaxKeys(2*n))
				for i := range n {
					r := Request{Tenant: names[i], Endpoint: "read"}
					if withKey {
						r.APIKey = keys[i]
					}
					if _, err := e.DecideAt(epoch.Add(time.Duration(i)*time.Microsecond), r); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perTenant = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
				rss = residentMB(b)
				runtime.KeepAlive(e)
				e.Close()
			}
			b.ReportMetric(perTenant, "B/tenant")
			b.ReportMetric(rss, "rss-MB")
		})
	}
}

// memoryTenants is how many tenants the memory and scale benchmarks make:
// QUOTAPLANE_MEMORY_TENANTS, 100,000 by default.
func memoryTenants(b *testing.B) int {
	v := os.Getenv("QUOTAPLANE_MEMORY_TENANTS")
	if v == "" {
		return 100_000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("QUOTAPLANE_MEMORY_TENANTS=%q: want a number of tenants", v)
	}
	return n
}

// residentMB is the process's resident set in MB (VmRSS), 0 where
// /proc/self/status does not say.
func residentMB(b *testing.B) float64 {
	mb, err := procStatusMB("VmRSS")
	if err != nil {
		b.Fatal(err)
	}
	return mb
}

// procStatusMB is field of /proc/self/status (a size in kB) in MB; 0
// where the file or the field is missing.
func procStatusMB(field string) (float64, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, nil
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				return 0, fmt.Errorf("%s %q: %w", field, v, err)
			}
			return kb / 1024, nil
		}
	}
	return 0, nil
}

// BenchmarkRedisMemory measures what the distributed modes keep in Redis
// per tenant: 4,000 tenants the policy does not name, each with one api
// key, export once on the plane of BenchmarkTenantMemory (a tenant limit,
// a key limit, an export limit for the free tier: every level holds a
// bucket that takes a minute or more to fill again, so Redis keeps it) on
// one node; in
// local-reconciled the node then reconciles once (4,000 is within the
// buckets a reconcile pushes). Redis's used_memory and key count after,
// less before, per tenant.
//
//	go test -run '^$' -bench RedisMemory -benchtime 1x ./pkg/enforcer/
func BenchmarkRedisMemory(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	c := srv.Client()
	used := func() int64 {
		info := c.Info(ctx, "memory").Val()
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		b.Fatal("no used_memory in INFO memory")
		return 0
	}
	const n = 4_000
	for _, mode := range []string{"central", "local-reconciled"} {
		b.Run(mode, func(b *testing.B) {
			p := policytest.Compile(b, withMode(benchMemoryPlane, mode))
			var perTenant, keysPerTenant float64
			for range b.N {
				if err := c.FlushAll(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				e := newEngine(b, p, WithRedis(c), WithNodeID("mem"), WithMaxTenants(2*n), WithMaxKeys(2*n), slowMachine)
				before, beforeKeys := used(), c.DBSize(ctx).Val()
				for i := range n {
					r := Request{Tenant: sprintf("tenant-%07d", i), Endpoint: "export", APIKey: sprintf("key-%07d", i)}
					if _, err := e.DecideAt(epoch.Add(time.Duration(i)*time.Microsecond), r); err != nil {
						b.Fatal(err)
					}
				}
				if e.reconciler != nil {
					e.reconciler.reconcile()
				}
				perTenant = float64(used()-before) / n
				keysPerTenant = float64(c.DBSize(ctx).Val()-beforeKeys) / n
				e.Close()
			}
			b.ReportMetric(perTenant, "redis-B/tenant")
			b.ReportMetric(keysPerTenant, "keys/tenant")
		})
	}
}

// BenchmarkReconcileBytes measures a local-reconciled node's traffic to
// Redis per reconcile against its active tenants: n tenants (one api key
// each) decide between two reconciles; the second reconcile's bytes in
// and out of Redis (INFO stats total_net_input_bytes and
// total_net_output_bytes) are the node's per interval, and the CPU Redis
// spent on its commands (INFO commandstats, usec) the fleet's cost of it.
//
//	go test -run '^$' -bench ReconcileBytes -benchtime 1x ./pkg/enforcer/
func BenchmarkReconcileBytes(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	c := srv.Client()
	stat := func(name string) int64 {
		for line := range strings.SplitSeq(c.Info(ctx, "stats").Val(), "\r\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		b.Fatalf("no %s in INFO stats", name)
		return 0
	}
	cpu := func() int64 { // µs Redis spent in commands so far
		var sum int64
		for line := range strings.SplitSeq(c.Info(ctx, "commandstats").Val(), "\r\n") {
			if _, rest, ok := strings.Cut(line, ",usec="); ok && strings.HasPrefix(line, "cmdstat_") && !strings.HasPrefix(line, "cmdstat_info:") {
				v, _, _ := strings.Cut(rest, ",")
				n, _ := strconv.ParseInt(v, 10, 64)
				sum += n
			}
		}
		return sum
	}
	p := policytest.Compile(b, withMode(benchMemoryPlane, "local-reconciled", "reconcileInterval: 1h"))
	for _, n := range []int{0, 100, 1_000, 4_000} {
		b.Run(sprintf("tenants=%d", n), func(b *testing.B) {
			var in, out, us int64
			for range b.N {
				if err := c.FlushAll(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				e := newEngine(b, p, WithRedis(c), WithNodeID("rec"), WithMaxTenants(2*n+1), WithMaxKeys(2*n+1))
				decide := func(from time.Duration) {
					for i := range n {
						r := Request{Tenant: sprintf("tenant-%07d", i), Endpoint: "export", APIKey: sprintf("key-%07d", i)}
						if _, err := e.DecideAt(epoch.Add(from+time.Duration(i)*time.Microsecond), r); err != nil {
							b.Fatal(err)
						}
					}
				}
				decide(0)
				e.reconciler.reconcile()
				decide(time.Second)
				in0, out0, us0 := stat("total_net_input_bytes"), stat("total_net_output_bytes"), cpu()
				e.reconciler.reconcile()
				in, out, us = stat("total_net_input_bytes")-in0, stat("total_net_output_bytes")-out0, cpu()-us0
				e.Close()
			}
			b.ReportMetric(float64(in), "bytes-to-redis")
			b.ReportMetric(float64(out), "bytes-from-redis")
			b.ReportMetric(float64(us), "redis-µs")
		})
	}
}

// BenchmarkFairnessTick is one fairness tick (demand measured, capacity
// shared, a sixteenth of the states looked over for pruning; none is idle
// long enough) over n tenants that each decided once on
// benchMemoryPlane: what every enforcer spends every fairness interval
// (100 ms) off the requests' path. QUOTAPLANE_MEMORY_TENANTS sets n for
// the large case (default 100,000 and 10,000).
//
//	go test -run '^$' -bench FairnessTick ./pkg/enforcer/
func BenchmarkFairnessTick(b *testing.B) {
	p := policytest.Compile(b, benchMemoryPlane)
	large := memoryTenants(b)
	for _, n := range []int{10_000, large} {
		b.Run(sprintf("tenants=%d", n), func(b *testing.B) {
			e := newEngine(b, p, WithMaxTenants(2*n), withFairnessInterval(time.Hour), WithIdleTTL(1000*time.Hour))
			for i := range n {
				if _, err := e.DecideAt(epoch.Add(time.Duration(i)*time.Microsecond), Request{Tenant: sprintf("tenant-%07d", i), Endpoint: "read"}); err != nil {
					b.Fatal(err)
				}
			}
			now := epoch.Add(time.Second).UnixMicro()
			e.tick(now) // the first tick only reads the weights
			b.ResetTimer()
			for b.Loop() {
				now += 100_000 // the default interval
				e.tick(now)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/tenant")
		})
	}
}

// BenchmarkSwapTenants is a policy swap (a new version of the same plane)
// with n tenants' states, each of which decided once with a key: every
// state moves to the new policy before SetPolicyAt returns.
// QUOTAPLANE_MEMORY_TENANTS sets n for the large case.
//
//	go test -run '^$' -bench SwapTenants ./pkg/enforcer/
func BenchmarkSwapTenants(b *testing.B) {
	p := policytest.Compile(b, benchMemoryPlane)
	large := memoryTenants(b)
	for _, n := range []int{10_000, large} {
		b.Run(sprintf("tenants=%d", n), func(b *testing.B) {
			e := newEngine(b, p, WithMaxTenants(2*n), WithMaxKeys(2*n), WithIdleTTL(1000*time.Hour))
			now := epoch
			for i := range n {
				now = now.Add(time.Microsecond)
				if _, err := e.DecideAt(now, Request{Tenant: sprintf("tenant-%07d", i), Endpoint: "export", APIKey: sprintf("key-%07d", i)}); err != nil {
					b.Fatal(err)
				}
			}
			version := p.Version()
			for b.Loop() {
				version++
				now = now.Add(time.Millisecond)
				if err := e.SetPolicyAt(now, p.WithVersion(version)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/tenant")
		})
	}
}
