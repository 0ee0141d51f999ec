package enforcer

import (
	"runtime"
	"testing"
	"time"
)

// BenchmarkTenantMemory measures the engine's heap per tenant state: 100,000
// tenants the policy does not name decide once each on the sample-like
// plane below (a tenant limit, an endpoint limit on one of three
// endpoints, a key limit), with no api key and with one key each; the
// heap is read after a GC. B/tenant is the state of one tenant (and its
// key), what a bound on tenant states multiplies.
//
//	go test -run '^$' -bench TenantMemory -benchtime 1x ./pkg/enforcer/
func BenchmarkTenantMemory(b *testing.B) {
	p := compileYAML(b, planeHeader+`
  global: {rate: 100000000, burst: 100000000}
  tiers:
    - {name: standard, weight: 4, tenant: {rate: 50, burst: 50}, key: {rate: 20, burst: 20}}
    - {name: free, weight: 1, tenant: {rate: 5, burst: 5}, key: {rate: 5, burst: 5}}
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
spec: {endpoint: export, cost: 50, tiers: [{tier: free, limit: {rate: 2, burst: 2, period: 5m}}]}
`)
	const n = 100_000
	names, keys := make([]string, n), make([]string, n)
	for i := range n {
		names[i], keys[i] = sprintf("tenant-%07d", i), sprintf("key-%07d", i)
	}
	for _, withKey := range []bool{false, true} {
		b.Run(map[bool]string{false: "no-key", true: "one-key"}[withKey], func(b *testing.B) {
			b.ReportAllocs()
			var perTenant float64
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
				perTenant = float64(after.HeapAlloc-before.HeapAlloc) / n
				runtime.KeepAlive(e)
				e.Close()
			}
			b.ReportMetric(perTenant, "B/tenant")
		})
	}
}
