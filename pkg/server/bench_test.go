package server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
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

// BenchmarkForwardAuth measures forward auth: the handler alone
// (in-process, a request and a writer reused, so what is counted is the
// handler's own work and allocations), the same from every core, and end
// to end over loopback like BenchmarkHTTP (64 concurrent requests per
// core, pooled connections). The plane is gatewayPlane's with limits no
// run reaches, so every request is classified, decided and allowed.
//
//	go test -run '^$' -bench ForwardAuth -benchmem ./pkg/server/
func BenchmarkForwardAuth(b *testing.B) {
	plane := strings.NewReplacer(
		"global: {rate: 1000, burst: 1000}", "global: {rate: 1000000000, burst: 1000000000}",
		"tenant: {rate: 10, burst: 20}", "tenant: {rate: 1000000000, burst: 1000000000}",
	).Replace(gatewayPlane("default", "default"))
	p := policytest.Compile(b, plane)
	e, err := enforcer.New(p)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	h := NewAPI(e, NewMetrics(e, nil))
	uris := []string{"/v1/models/gpt/generate", "/v1/models?page=2", "/v1/models/gpt", "/v2/other/path"}
	methods := []string{"POST", "GET", "GET", "PUT"}
	// requests are 64 forwarded requests over tenants, keys and endpoints.
	requests := func() []*http.Request {
		rs := make([]*http.Request, 64)
		for i := range rs {
			r := httptest.NewRequest(http.MethodGet, ForwardAuthPath, nil)
			r.Header.Set(HeaderForwardedMethod, methods[i%len(methods)])
			r.Header.Set(HeaderForwardedURI, uris[i%len(uris)])
			r.Header.Set(HeaderTenant, fmt.Sprintf("tenant-%d", i%5))
			r.Header.Set(HeaderAPIKey, fmt.Sprintf("k%d", i%7))
			rs[i] = r
		}
		return rs
	}
	benchHandler(b, h, requests, http.StatusOK)
	b.Run("http", func(b *testing.B) {
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
		b.ReportAllocs()
		b.SetParallelism(64)
		var mu sync.Mutex
		var all []time.Duration
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			var lat []time.Duration
			for n := 0; pb.Next(); n++ {
				req, _ := http.NewRequest(http.MethodGet, srv.URL+ForwardAuthPath, nil)
				req.Header.Set(HeaderForwardedMethod, methods[n%len(methods)])
				req.Header.Set(HeaderForwardedURI, uris[n%len(uris)])
				req.Header.Set(HeaderTenant, fmt.Sprintf("tenant-%d", n%5))
				req.Header.Set(HeaderAPIKey, fmt.Sprintf("k%d", n%97))
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
		elapsed := time.Since(start)
		if len(all) == 0 {
			return
		}
		slices.Sort(all)
		b.ReportMetric(float64(len(all))/elapsed.Seconds(), "requests/s")
		b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
	})
}

// headerWriter is a ResponseWriter that keeps the status and the header
// and drops the body: reused, it costs the handler nothing.
type headerWriter struct {
	header http.Header
	status int
}

func (w *headerWriter) Header() http.Header         { return w.header }
func (w *headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerWriter) WriteHeader(status int)      { w.status = status }

// BenchmarkDecisionHandler is the decision API's handler alone, in
// process, as BenchmarkForwardAuth's handler: the sample plane in mode
// local (its tenants' own limits answer some with 429), a request and a
// writer reused, so
// what is counted is the handler's own work and allocations (the mux, the
// parsing, the decision, the metrics, the headers and the JSON body).
//
//	go test -run '^$' -bench DecisionHandler -benchmem ./pkg/server/
func BenchmarkDecisionHandler(b *testing.B) {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		b.Fatal(err)
	}
	if p, err = p.Override(policy.Overrides{GlobalPerSecond: 1_000_000_000}); err != nil {
		b.Fatal(err)
	}
	e, err := enforcer.New(p)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	h := NewAPI(e, NewMetrics(e, nil))
	tenants := []string{"whale-1", "whale-2", "acme", "globex", "initech"}
	requests := func() []*http.Request {
		rs := make([]*http.Request, 64)
		for i := range rs {
			r := httptest.NewRequest(http.MethodPost, "/api/read", nil)
			r.Header.Set(HeaderTenant, tenants[i%len(tenants)])
			r.Header.Set(HeaderAPIKey, fmt.Sprintf("k%d", i%7))
			rs[i] = r
		}
		return rs
	}
	benchHandler(b, h, requests, http.StatusOK, http.StatusTooManyRequests)
}

// benchHandler runs the handler alone on the requests (made anew per
// goroutine), a writer reused, from one goroutine ("handler") and from
// every core ("handler-parallel"); an answer with another status than ok
// fails the benchmark.
func benchHandler(b *testing.B, h http.Handler, requests func() []*http.Request, ok ...int) {
	serve := func(b *testing.B, rs []*http.Request, w *headerWriter, i int) {
		clear(w.header)
		w.status = 0
		h.ServeHTTP(w, rs[i%len(rs)])
		if !slices.Contains(ok, w.status) {
			b.Fatalf("status %d", w.status)
		}
	}
	b.Run("handler", func(b *testing.B) {
		rs, w := requests(), &headerWriter{header: http.Header{}}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			serve(b, rs, w, i)
			i++
		}
	})
	b.Run("handler-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			rs, w := requests(), &headerWriter{header: http.Header{}}
			for i := 0; pb.Next(); i++ {
				serve(b, rs, w, i)
			}
		})
	})
}
