package gateway

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// benchStreams is how many calls are in flight at once, as many Envoy
// workers would keep; benchConns is how many connections carry them.
const (
	benchStreams = 64
	benchConns   = 4
)

// BenchmarkShouldRateLimit is ShouldRateLimit over loopback gRPC against
// an in-process engine on the sample plane (mode local), with benchStreams
// calls in flight, for requests of 1 and of 4 descriptors. allocs/op
// counts the client's allocations too (both ends are in this process).
// Most requests are denied (1,000 free-tier tenants at full speed): a
// denial is decided as fully as an admission.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, n := range []int{1, 4} {
		b.Run(fmt.Sprintf("descriptors=%d", n), func(b *testing.B) { benchShouldRateLimit(b, n) })
	}
}

func benchShouldRateLimit(b *testing.B, descriptors int) {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		b.Fatal(err)
	}
	s := NewServer()
	s.SetEngine(newEngine(b, p.WithVersion(1)), nil)
	first := serve(b, s)
	clients := []rlsv3.RateLimitServiceClient{rlsv3.NewRateLimitServiceClient(first)}
	for len(clients) < benchConns {
		conn, err := grpc.NewClient(first.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		clients = append(clients, rlsv3.NewRateLimitServiceClient(conn))
	}
	endpoints := []string{"read", "write", "export", "search"}
	requests := make([]*rlsv3.RateLimitRequest, 1024)
	for i := range requests {
		tenant := fmt.Sprintf("tenant-%d", i%1000)
		if i%10 == 0 {
			tenant = []string{"whale-1", "whale-2", "acme", "globex", "initech"}[i/10%5]
		}
		req := &rlsv3.RateLimitRequest{Domain: p.Plane()}
		for j := range descriptors {
			req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
				{Key: "tenant", Value: tenant},
				{Key: "endpoint", Value: endpoints[(i+j)%len(endpoints)]},
				{Key: "api_key", Value: fmt.Sprintf("key-%d", (i+j)%3)},
			}})
		}
		requests[i] = req
	}
	ctx := context.Background()
	// Warm the connections and the tenants' state.
	for i, req := range requests {
		if _, err := clients[i%len(clients)].ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}

	var (
		mu        sync.Mutex
		latencies []time.Duration
		workers   atomic.Int64
	)
	b.SetParallelism((benchStreams + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		worker := int(workers.Add(1))
		client := clients[worker%len(clients)]
		mine := make([]time.Duration, 0, 4096)
		for i := worker * 97; pb.Next(); i++ {
			start := time.Now()
			_, err := client.ShouldRateLimit(ctx, requests[i%len(requests)])
			mine = append(mine, time.Since(start))
			if err != nil {
				b.Error(err)
				return
			}
		}
		mu.Lock()
		latencies = append(latencies, mine...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(latencies) == 0 {
		return
	}
	slices.Sort(latencies)
	b.ReportMetric(float64(b.N*descriptors)/b.Elapsed().Seconds(), "decisions/s")
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds()), "p99-µs")
}
