package policy_test

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// BenchmarkCompileScale compiles a plane of n TenantQuota objects (every
// third with three api keys, every fourth with two endpoint limits, as the
// realistic plane's) on the realistic plane's endpoints, and decodes what
// it encodes, as an enforcer does when it loads the policy. It reports the
// encoded policy's size: what the manager publishes and every enforcer
// reads. docs/scale.md quotes it.
//
//	go test -run '^$' -bench CompileScale -benchmem ./pkg/policy/
func BenchmarkCompileScale(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		objs := scaleObjects(n)
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var size int
			for b.Loop() {
				p, problems := policy.Compile(objs)
				if len(problems) > 0 {
					b.Fatal(problems)
				}
				enc := p.Encode()
				size = len(enc)
				if _, err := policy.Decode(enc); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(size), "policy-bytes")
			b.ReportMetric(float64(size)/float64(n), "bytes/tenant")
		})
	}
}

func scaleObjects(n int) []runtime.Object {
	objs := realisticObjects()[:6] // the plane and its five endpoints
	tiers := []string{"gold", "silver", "bronze", ""}
	for i := range n {
		tenant := fmt.Sprintf("tenant-%06d", i)
		tq := newTenant(fmt.Sprintf("tq-%06d", i), tenant, tiers[i%len(tiers)])
		if i%3 == 0 {
			tq.Spec.Keys = []v1alpha1.KeyQuota{
				{Key: tenant + "-a", Limit: *lim(int64(20+i%50), int64(40+i%50))},
				{Key: tenant + "-m", Limit: *lim(int64(10+i%50), 0)},
				{Key: tenant + "-z", Limit: *lim(int64(5+i%50), 0)},
			}
		}
		if i%4 == 1 {
			tq.Spec.Endpoints = []v1alpha1.TenantEndpointQuota{
				{Endpoint: "write", Limit: *lim(int64(100+i%50), 0)},
				{Endpoint: "read", Limit: *lim(int64(2000+i%50), 1000)},
			}
		}
		objs = append(objs, tq)
	}
	return objs
}
