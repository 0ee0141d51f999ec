package server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// BenchmarkHTTP measures the decision API end to end: a real net/http
// client over loopback, pooled connections, 64 concurrent requests per
// core, on the sample plane in mode local and in mode central (one Redis).
// It reports requests per second and p50/p99 latency.
//
//	go test -run '^$' -bench HTTP -benchtime 3s ./pkg/server/
func BenchmarkHTTP(b *testing.B) {
	for _, mode := range []string{"local", "central"} {
		b.Run(mode, func(b *testing.B) {
			p, err := policy.LoadFS(samples.FS)
			if err != nil {
				b.Fatal(err)
			}
			var opts []enforcer.Option
			if mode == "central" {
				opts = append(opts, enforcer.WithRedis(redistest.Start(b).Client()))
			}
			if p, err = p.Override(policy.Overrides{Mode: mode, GlobalPerSecond: 1_000_000_000}); err != nil {
				b.Fatal(err)
			}
			e, err := enforcer.New(p, opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { e.Close() })
			srv := httptest.NewServer(NewAPI(e, NewMetrics(e, nil)))
			b.Cleanup(srv.Close)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			// Named enterprise and standard tenants over many keys: mostly admitted.
			tenants := []string{"whale-1", "whale-2", "acme", "globex", "initech"}
			b.ReportAllocs()
			b.SetParallelism(64)
			var mu sync.Mutex
			var all []time.Duration
			var ok, total int
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				var lat []time.Duration
				var n, admitted int
				for pb.Next() {
					req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/read", nil)
					req.Header.Set(HeaderTenant, tenants[n%len(tenants)])
					req.Header.Set(HeaderAPIKey, fmt.Sprintf("k%d", n%97))
					t0 := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body) // read to the end: the connection is reused
					resp.Body.Close()
					lat = append(lat, time.Since(t0))
					if resp.StatusCode == http.StatusOK {
						admitted++
					}
					n++
				}
				mu.Lock()
				all, ok, total = append(all, lat...), ok+admitted, total+len(lat)
				mu.Unlock()
			})
			elapsed := time.Since(start)
			if len(all) == 0 {
				return
			}
			slices.Sort(all)
			b.ReportMetric(float64(total)/elapsed.Seconds(), "requests/s")
			b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(ok)/float64(total), "admitted")
		})
	}
}
