package reload

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// BenchmarkPropagation measures a policy's way from the manager's publish
// to two enforcers: publish (one atomic script in Redis), the store's
// notice, each enforcer's read, decode (the hash checked, the content
// validated again) and swap, on a plane of n TenantQuota objects. ms/version
// is from the publish's call to both engines running the version.
//
//	go test -run '^$' -bench Propagation -benchtime 10x ./pkg/reload/
func BenchmarkPropagation(b *testing.B) {
	for _, n := range []int{100, 10_000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			srv := redistest.Start(b)
			ctx, cancel := context.WithCancel(context.Background())
			b.Cleanup(cancel)
			compile := func(globalRate int) *policy.Policy {
				var sb strings.Builder
				fmt.Fprintf(&sb, `apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: scale, namespace: prod}
spec:
  global: {rate: %d, burst: 1000000}
  tiers:
    - {name: gold, weight: 8, tenant: {rate: 2000, burst: 4000}, key: {rate: 500, burst: 1000}}
    - {name: free, weight: 1, tenant: {rate: 50, burst: 100}, key: {rate: 50, burst: 100}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read, namespace: prod}
spec: {endpoint: read, cost: 1}
`, globalRate)
				for i := range n {
					fmt.Fprintf(&sb, "---\napiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: t%06d, namespace: prod}\nspec: {tenant: tenant-%06d, tier: %s, keys: [{key: k-%06d, limit: {rate: 100, burst: 100}}]}\n",
						i, i, []string{"gold", "free"}[i%2], i)
				}
				return policytest.Compile(b, sb.String())
			}
			first := compile(1_000_000)
			s, err := store.New(srv.Client(), first.ID())
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := s.Publish(ctx, first); err != nil {
				b.Fatal(err)
			}
			var engines []*enforcer.Engine
			for range 2 {
				current, err := s.Current(ctx)
				if err != nil {
					b.Fatal(err)
				}
				e, err := enforcer.New(current)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { e.Close() })
				l := New(e, policy.Overrides{}, newLoads(), quiet, current)
				go func() { _ = l.WatchStore(ctx, s) }()
				engines = append(engines, e)
			}
			// The versions to publish, compiled before the clock runs.
			versions := make([]*policy.Policy, b.N)
			for i := range versions {
				versions[i] = compile(2_000_000 + i)
			}
			b.ResetTimer()
			var total time.Duration
			for i := range b.N {
				start := time.Now()
				v, _, err := s.Publish(ctx, versions[i])
				if err != nil {
					b.Fatal(err)
				}
				for _, e := range engines {
					poll.Until(b, time.Minute, fmt.Sprintf("both enforcers to run version %d", v), func() bool { return e.Policy().Version() == v })
				}
				total += time.Since(start)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/version")
		})
	}
}
