package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// BenchmarkHTTP measures the decision API end to end over loopback, 64
// concurrent requests per core, on the sample plane in mode local and in
// mode central (one Redis), with two clients:
//
//   - net/http: net/http's client, pooled connections (what a Go caller
//     pays too; most of the allocations a request are the client's);
//   - raw: one keep-alive connection per goroutine writing requests it
//     built once and reading the answers with a reused buffer, as a
//     gateway's proxy or a load tool does. It allocates nothing, so
//     allocs/op is the server's: net/http's server and the handler.
//
// It reports requests per second and p50/p99 latency.
//
//	go test -run '^$' -bench HTTP -benchtime 3s ./pkg/server/
func BenchmarkHTTP(b *testing.B) {
	for _, mode := range []string{"local", "central"} {
		for _, client := range []string{"net-http", "raw"} {
			b.Run(mode+"/"+client, func(b *testing.B) {
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
				do := netHTTPClient(srv.URL)
				if client == "raw" {
					do = rawClient(b, srv.Listener.Addr().String())
				}
				b.ReportAllocs()
				b.SetParallelism(64)
				var mu sync.Mutex
				var all []time.Duration
				var ok, total int
				var goroutines atomic.Int64
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					send := do()
					var lat []time.Duration
					// Each goroutine starts elsewhere in the tenants' keys.
					n, admitted := int(goroutines.Add(1))*31, 0
					for pb.Next() {
						t0 := time.Now()
						status, err := send(n)
						if err != nil {
							b.Error(err)
							return
						}
						lat = append(lat, time.Since(t0))
						if status == http.StatusOK {
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
}

// benchTenants are BenchmarkHTTP's named enterprise and standard tenants,
// over 97 api keys each: mostly admitted.
var benchTenants = []string{"whale-1", "whale-2", "acme", "globex", "initech"}

// netHTTPClient makes, per goroutine, a sender of request n through
// net/http's client (one pool for all).
func netHTTPClient(url string) func() func(n int) (int, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	return func() func(int) (int, error) {
		return func(n int) (int, error) {
			req, _ := http.NewRequest(http.MethodPost, url+"/api/read", nil)
			req.Header.Set(HeaderTenant, benchTenants[n%len(benchTenants)])
			req.Header.Set(HeaderAPIKey, fmt.Sprintf("k%d", n%97))
			resp, err := client.Do(req)
			if err != nil {
				return 0, err
			}
			_, _ = io.Copy(io.Discard, resp.Body) // read to the end: the connection is reused
			resp.Body.Close()
			return resp.StatusCode, nil
		}
	}
}

// rawClient makes, per goroutine, a sender of request n over a keep-alive
// connection of its own: the requests are built once, the answers read
// with a reused buffer (status line, headers up to Content-Length, body),
// so that the client allocates nothing per request.
func rawClient(b *testing.B, addr string) func() func(n int) (int, error) {
	var requests [][]byte
	for n := range len(benchTenants) * 97 {
		requests = append(requests, fmt.Appendf(nil, "POST /api/read HTTP/1.1\r\nHost: %s\r\n%s: %s\r\n%s: k%d\r\nContent-Length: 0\r\n\r\n",
			addr, HeaderTenant, benchTenants[n%len(benchTenants)], HeaderAPIKey, n%97))
	}
	return func() func(int) (int, error) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return func(int) (int, error) { return 0, err }
		}
		b.Cleanup(func() { conn.Close() })
		r := bufio.NewReaderSize(conn, 4096)
		return func(n int) (int, error) {
			if _, err := conn.Write(requests[n%len(requests)]); err != nil {
				return 0, err
			}
			return readRawResponse(r)
		}
	}
}

// readRawResponse reads one HTTP/1.1 answer from r and returns its status;
// the body (Content-Length bytes) is discarded.
func readRawResponse(r *bufio.Reader) (int, error) {
	status, length := 0, -1
	for first := true; ; first = false {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case first:
			// "HTTP/1.1 200 OK"
			if len(line) < 12 {
				return 0, fmt.Errorf("bad status line %q", line)
			}
			status, err = strconv.Atoi(string(line[9:12]))
			if err != nil {
				return 0, fmt.Errorf("bad status line %q", line)
			}
		case len(line) == 0:
			if length < 0 {
				return 0, errors.New("an answer without Content-Length")
			}
			_, err := r.Discard(length)
			return status, err
		default:
			if name, value, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(name, []byte("Content-Length")) {
				if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil {
					return 0, fmt.Errorf("bad Content-Length %q", value)
				}
			}
		}
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
