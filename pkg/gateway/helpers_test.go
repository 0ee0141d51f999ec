package gateway

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// testPlane is a plane whose limits do not refill during a test (rate 0,
// or a rate per hour or day), so that what a request took is still missing
// afterwards: global 1,000,000,000 tokens in total; tenants of the default
// tier 100 a day; endpoint write (cost 5) 10 per 5 minutes; tenant acme's
// key k-small 3 an hour. extraSpec is added to the QuotaPlane's spec.
func testPlane(extraSpec string) string {
	return `apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata:
  name: gw
spec:
  global: {rate: 0, burst: 1000000000}
  mode: local
  fairness: none
  defaultTier: basic
  tiers:
    - name: basic
      weight: 1
      tenant: {rate: 100, burst: 100, period: 24h}
      key: {rate: 50, burst: 50, period: 1h}
` + extraSpec + `
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata:
  name: read
spec:
  endpoint: read
  match:
    - path: {type: PathPrefix, value: /v1/read}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata:
  name: write
spec:
  endpoint: write
  cost: 5
  limit: {rate: 10, burst: 10, period: 5m}
  match:
    - path: {type: Exact, value: /v1/items}
      methods: [POST]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata:
  name: acme
spec:
  tenant: acme
  tier: basic
  keys:
    - key: k-small
      limit: {rate: 3, burst: 3, period: 1h}
`
}

func newEngine(t testing.TB, p *policy.Policy) *enforcer.Engine {
	t.Helper()
	e, err := enforcer.New(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// globalRemaining is what is left of the plane's global limit: every
// decision that debits anything debits it.
func globalRemaining(e *enforcer.Engine) int64 {
	return e.PlaneStatusAt(time.Now()).Global.Remaining
}

// serve serves s on a loopback port until the test ends and returns a
// client connection to it.
func serve(t testing.TB, s *Server) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// descriptor builds a descriptor from key=value pairs.
func descriptor(pairs ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			panic(fmt.Sprintf("descriptor entry %q is not key=value", p))
		}
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}
