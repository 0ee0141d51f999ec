package enforcer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// centralBenchParallelism is goroutines per GOMAXPROCS: a gateway's
// concurrent requests.
const centralBenchParallelism = 64

// BenchmarkCentral measures decisions per second and decision latency
// through one Redis, in one run so the ratios compare: go-redis/redis_rate
// (GCRA on one key, the yardstick), central mode with one script call per
// decision (batch size 1), and central mode batched; all four levels and
// the burst pool are in force, over 1,000 tenants Zipf-distributed (s 1.2)
// or uniform.
//
//	make bench PKGS=./pkg/enforcer BENCH=Central BENCHTIME=5s
func BenchmarkCentral(b *testing.B) {
	srv := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 256})
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()

	b.Run("redis_rate", func(b *testing.B) {
		limiter := redis_rate.NewLimiter(client)
		limit := redis_rate.PerSecond(1_000_000_000)
		runLatencies(b, func(int) bool {
			res, err := limiter.Allow(ctx, "bench", limit)
			return err == nil && res.Allowed == 1
		})
	})
	const tenants = 1000
	for _, dist := range []string{"one", "zipf", "uniform"} {
		for _, batched := range []bool{false, true} {
			name := fmt.Sprintf("central/%s/batch=%v", dist, batched)
			b.Run(name, func(b *testing.B) {
				client.ConfigResetStat(ctx)
				if err := client.FlushDB(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				cpu := srv.CPUMicros()
				opts := []Option{WithRedis(client), WithNodeID("bench"), WithRedisTimeout(time.Second)}
				if batched {
					opts = append(opts, withRedisConcurrency(2))
				} else {
					opts = append(opts, withBatchSize(1), withRedisConcurrency(64))
				}
				e := newEngine(b, centralBenchPolicy(b, tenants), opts...)
				reqs := centralBenchRequests(dist, tenants)
				runLatencies(b, func(i int) bool {
					d, err := e.Decide(ctx, reqs[i%len(reqs)])
					return err == nil && d.Allow
				})
				if s := e.BackendStatus(); s.ScriptCalls > 0 {
					b.ReportMetric(float64(s.Decisions)/float64(s.ScriptCalls), "decisions/call")
					b.ReportMetric(float64(evalshaMicros(b, client))/float64(s.Decisions), "redis-µs/decision")
					b.ReportMetric((srv.CPUMicros()-cpu)/float64(s.Decisions), "redis-cpu-µs/decision")
				}
			})
		}
	}
}

// evalshaMicros is the CPU Redis spent in EVALSHA (the scripts' own
// commands included) since the last CONFIG RESETSTAT, in µs, from INFO
// commandstats.
func evalshaMicros(b *testing.B, c *redis.Client) int64 {
	for line := range strings.SplitSeq(c.Info(context.Background(), "commandstats").Val(), "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			_, usec, _ := strings.Cut(rest, "usec=")
			usec, _, _ = strings.Cut(usec, ",")
			n, err := strconv.ParseInt(usec, 10, 64)
			if err != nil {
				b.Fatalf("commandstats %q: %v", line, err)
			}
			return n
		}
	}
	b.Fatal("no evalsha in INFO commandstats")
	return 0
}

// centralBenchPolicy is benchPolicy in central mode with a burst pool.
func centralBenchPolicy(b testing.TB, tenants int) *policy.Policy {
	return policytest.Compile(b, withMode(benchPolicyYAML(tenants, 1_000_000_000, "none"), "central")+`---
apiVersion: quotaplane.io/v1alpha1
kind: BurstPool
metadata: {name: pool}
spec: {size: 100000, refillRate: 10000, perTenantCeiling: 1000}
`)
}

func centralBenchRequests(dist string, tenants int) []Request {
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.2, 1, uint64(tenants-1))
	eps := []string{"read", "read", "read", "read", "write", "export"}
	reqs := make([]Request, 1<<14)
	for i := range reqs {
		t := rng.IntN(tenants)
		switch dist {
		case "zipf":
			t = int(zipf.Uint64())
		case "one":
			reqs[i] = Request{Tenant: "t1", Endpoint: "read", APIKey: "k1"}
			continue
		}
		reqs[i] = Request{Tenant: fmt.Sprintf("t%d", t), Endpoint: eps[rng.IntN(len(eps))], APIKey: fmt.Sprintf("k%d", rng.IntN(4))}
	}
	return reqs
}

// runLatencies runs decide b.N times from many goroutines and reports
// decisions per second, p50 and p99 latency, and the share admitted.
func runLatencies(b *testing.B, decide func(i int) bool) {
	b.ReportAllocs()
	b.SetParallelism(centralBenchParallelism)
	var mu sync.Mutex
	var all []time.Duration
	var admitted, total int
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var lat []time.Duration
		n, ok := rand.IntN(1<<14), 0
		for pb.Next() {
			t0 := time.Now()
			if decide(n) {
				ok++
			}
			lat = append(lat, time.Since(t0))
			n++
		}
		mu.Lock()
		all = append(all, lat...)
		admitted += ok
		total += len(lat)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	b.ReportMetric(float64(total)/elapsed.Seconds(), "decisions/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(admitted)/float64(total), "admitted")
}

// BenchmarkCentralCluster measures a whale's decisions through a 3-master
// Redis Cluster: its buckets in one slot (one shard), or split over three
// (the plane's and the tenant's spec.shards). The cluster shares this
// machine's cores with the benchmark, so the split shows what it costs and
// how the work spreads, not the relief of three separate machines.
//
//	make bench PKGS=./pkg/enforcer BENCH=CentralCluster BENCHTIME=5s
func BenchmarkCentralCluster(b *testing.B) {
	cluster := redistest.StartCluster(b, 3)
	client := cluster.Client(b)
	ctx := context.Background()
	for _, shards := range []int{1, 3} {
		b.Run(fmt.Sprintf("whale/shards=%d", shards), func(b *testing.B) {
			plane, whale := "", ""
			if shards > 1 {
				plane, whale = fmt.Sprintf("shards: %d", shards), fmt.Sprintf(", shards: %d", shards)
			}
			p := policytest.Compile(b, withMode(benchPolicyYAML(10, 1_000_000_000, "none"), "central", plane)+fmt.Sprintf(`---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: whale}
spec: {tenant: whale, tier: enterprise%s}
`, whale))
			e := newEngine(b, p, WithRedis(client), WithNodeID("bench"), WithRedisTimeout(time.Second))
			reqs := make([]Request, 64)
			for i := range reqs {
				reqs[i] = Request{Tenant: "whale", Endpoint: "read", APIKey: fmt.Sprintf("k%d", i)}
			}
			runLatencies(b, func(i int) bool {
				d, err := e.Decide(ctx, reqs[i%len(reqs)])
				return err == nil && d.Allow
			})
		})
	}
}
