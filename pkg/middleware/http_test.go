package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/client"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/middleware"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// answer is what a caller of the service saw.
type answer struct {
	status int
	fields map[string]string // the quota header fields present
	body   string
}

// send sends a request through a real app server over loopback.
func send(t *testing.T, url, tenant, key string, header map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, fields: map[string]string{}, body: string(body)}
	for _, name := range quotaFields {
		if v := resp.Header.Get(name); v != "" {
			a.fields[name] = v
		}
	}
	return a
}

type deciderCase struct {
	name string
	// make returns a decider over engine e.
	make func(t *testing.T, e *enforcer.Engine) middleware.Decider
}

var deciderCases = []deciderCase{
	{"local", func(t *testing.T, e *enforcer.Engine) middleware.Decider { return middleware.Local(e) }},
	{"remote", func(t *testing.T, e *enforcer.Engine) middleware.Decider { c, _ := remote(t, e); return c }},
}

// TestHTTPAllowsThenDenies replays the README's session through the
// middleware in front of a service: two exports by a free tenant are served
// with the RateLimit fields, the third is a 429 with every field and a JSON
// body, and the service never sees it. A remote enforcer gives the caller
// exactly what a local engine does.
func TestHTTPAllowsThenDenies(t *testing.T) {
	seen := map[string][]answer{}
	for _, dc := range deciderCases {
		t.Run(dc.name, func(t *testing.T) {
			var a app
			srv := httptest.NewServer(middleware.HTTP(dc.make(t, newEngine(t, samples.FS)), identifyByHeaders)(&a))
			defer srv.Close()
			var answers []answer
			for i := range 3 {
				got := send(t, srv.URL+"/v1/export", "free-trial", "k1", nil)
				answers = append(answers, got)
				if i < 2 {
					if got.status != http.StatusOK || got.body != "served\n" {
						t.Fatalf("export %d: %d %q; want 200 from the service", i+1, got.status, got.body)
					}
					if got.fields["RateLimit-Policy"] == "" || got.fields["RateLimit"] == "" || got.fields["Retry-After"] != "" {
						t.Errorf("export %d: fields %v; want RateLimit-Policy and RateLimit only", i+1, got.fields)
					}
				}
			}
			denied := answers[2]
			if denied.status != http.StatusTooManyRequests {
				t.Fatalf("third export: %d %q; want 429", denied.status, denied.body)
			}
			want := map[string]string{
				"Retry-After":      "1",
				"X-Quota-Level":    "tenant",
				"X-Quota-Reason":   "tenant limit of 50 per 1s (burst 100) is used up",
				"RateLimit":        `"tenant";r=0;t=1`,
				"RateLimit-Policy": `"global";q=10000;w=1, "tenant";q=50;w=1, "endpoint";q=100;w=300, "key";q=50;w=1`,
			}
			if !reflect.DeepEqual(denied.fields, want) {
				t.Errorf("429 fields\n got %v\nwant %v", denied.fields, want)
			}
			var body struct {
				Allowed    bool    `json:"allowed"`
				Tenant     string  `json:"tenant"`
				Endpoint   string  `json:"endpoint"`
				Cost       int64   `json:"cost"`
				Level      string  `json:"level"`
				Reason     string  `json:"reason"`
				RetryAfter float64 `json:"retryAfterSeconds"`
			}
			if err := json.Unmarshal([]byte(denied.body), &body); err != nil {
				t.Fatalf("429 body %q: %v", denied.body, err)
			}
			if body.Allowed || body.Tenant != "free-trial" || body.Endpoint != "export" || body.Cost != 50 ||
				body.Level != "tenant" || body.Reason != want["X-Quota-Reason"] || body.RetryAfter <= 0 || body.RetryAfter > 1 {
				t.Errorf("429 body %+v", body)
			}
			if n := a.served.Load(); n != 2 {
				t.Errorf("the service served %d requests; want 2", n)
			}
			seen[dc.name] = answers
		})
	}
	if !reflect.DeepEqual(seen["local"], seen["remote"]) {
		t.Errorf("a remote enforcer's answers differ from a local engine's:\n local %v\nremote %v", seen["local"], seen["remote"])
	}
}

func TestHTTPIdentifyError(t *testing.T) {
	var a app
	h := middleware.HTTP(middleware.Local(newEngine(t, samples.FS)), identifyByHeaders)(&a)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request("/v1/read", "", "k"))
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "no X-Tenant: say which tenant") {
		t.Errorf("%d %q; want 400 with identify's message", rec.Code, rec.Body)
	}
	if a.served.Load() != 0 || rec.Header().Get("RateLimit") != "" {
		t.Errorf("served %d, header %v; want neither", a.served.Load(), rec.Header())
	}
}

// TestHTTPRefusals: the plane's refusals are 403 with the level they name
// and requests it cannot decide 400, also when failing open: they are
// answers, not failures.
func TestHTTPRefusals(t *testing.T) {
	withUnits := func(r *http.Request, units string) *http.Request {
		r.Header.Set("X-Quota-Units", units)
		return r
	}
	for _, dc := range deciderCases {
		t.Run(dc.name, func(t *testing.T) {
			var failures int
			var a app
			opts := []middleware.Option{
				middleware.WithFailureMode(middleware.FailOpen),
				middleware.WithOnFailure(func(context.Context, error) { failures++ }),
			}
			strict := middleware.HTTP(dc.make(t, newEngine(t, strictSamples(t))), identifyByHeaders, opts...)(&a)
			bound := middleware.HTTP(dc.make(t, newEngine(t, boundPlane(t))), identifyByHeaders, opts...)(&a)
			for _, tc := range []struct {
				name    string
				h       http.Handler
				r       *http.Request
				status  int
				level   string
				message string
			}{
				{"unknown tenant", strict, request("/v1/read", "stranger", "k"), http.StatusForbidden, "tenant", `"stranger" is not a tenant`},
				{"unknown endpoint", strict, request("/v1/purge", "acme", "k"), http.StatusForbidden, "endpoint", `"purge" is not an endpoint`},
				{"key not bound", bound, request("/v1/read", "acme", "someone-elses-key"), http.StatusForbidden, "key", `is not a key of tenant "acme"`},
				{"no key", bound, request("/v1/read", "acme", ""), http.StatusForbidden, "key", `without an api key`},
				{"units", strict, withUnits(request("/v1/read", "acme", "k"), "2000000"), http.StatusBadRequest, "", "units"},
				{"endpoint name", strict, request("/v1/a%20b", "acme", "k"), http.StatusBadRequest, "", "endpoint"},
			} {
				if dc.name == "remote" && tc.name == "no key" {
					// The decision API wants X-Api-Key before it asks the engine.
					tc.status, tc.level, tc.message = http.StatusBadRequest, "", "X-Api-Key"
				}
				rec := httptest.NewRecorder()
				tc.h.ServeHTTP(rec, tc.r)
				var body struct{ Error string }
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != tc.status ||
					!strings.Contains(strings.ToLower(body.Error), strings.ToLower(tc.message)) {
					t.Errorf("%s: %d %s; want %d with {\"error\": ...%s...}", tc.name, rec.Code, rec.Body, tc.status, tc.message)
				}
				if strings.Contains(body.Error, "deciding") || strings.Contains(body.Error, "someone-elses-key") {
					t.Errorf("%s: message %q; want the plane's own words, never the api key", tc.name, body.Error)
				}
				if got := rec.Header().Get("X-Quota-Level"); got != tc.level {
					t.Errorf("%s: X-Quota-Level %q; want %q", tc.name, got, tc.level)
				}
				if tc.status == http.StatusForbidden && (rec.Header().Get("X-Quota-Reason") != body.Error || rec.Header().Get("Retry-After") != "") {
					t.Errorf("%s: X-Quota-Reason %q, Retry-After %q; want the message and no Retry-After", tc.name, rec.Header().Get("X-Quota-Reason"), rec.Header().Get("Retry-After"))
				}
			}
			if rec := httptest.NewRecorder(); true {
				bound.ServeHTTP(rec, request("/v1/read", "acme", boundKey))
				if rec.Code != http.StatusOK {
					t.Errorf("acme with its own key: %d %s; want 200", rec.Code, rec.Body)
				}
			}
			if a.served.Load() != 1 || failures != 0 {
				t.Errorf("served %d and %d failures; want only acme's own key served, no failure", a.served.Load(), failures)
			}
		})
	}
}

// TestHTTPFailureModes: a decider that cannot decide (an engine closed, an
// enforcer shutting down or gone) is refused with a 503 by default and
// served when failing open; WithOnFailure sees the error either way.
func TestHTTPFailureModes(t *testing.T) {
	for _, tc := range []struct {
		name string
		// broken returns a decider that fails and what its error matches.
		broken func(t *testing.T) (middleware.Decider, error)
	}{
		{"closed engine", func(t *testing.T) (middleware.Decider, error) {
			e := newEngine(t, samples.FS)
			e.Close()
			return middleware.Local(e), enforcer.ErrClosed
		}},
		{"enforcer shutting down", func(t *testing.T) (middleware.Decider, error) {
			e := newEngine(t, samples.FS)
			c, _ := remote(t, e)
			e.Close()
			return c, client.ErrUnavailable
		}},
		{"enforcer gone", func(t *testing.T) (middleware.Decider, error) {
			c, srv := remote(t, newEngine(t, samples.FS))
			srv.Close()
			return c, nil
		}},
	} {
		for _, mode := range []middleware.FailureMode{middleware.FailClosed, middleware.FailOpen} {
			t.Run(tc.name+"/fail "+mode.String(), func(t *testing.T) {
				d, match := tc.broken(t)
				var failures []error
				var a app
				opts := []middleware.Option{middleware.WithOnFailure(func(_ context.Context, err error) { failures = append(failures, err) })}
				if mode == middleware.FailOpen {
					opts = append(opts, middleware.WithFailureMode(mode))
				}
				rec := httptest.NewRecorder()
				middleware.HTTP(d, identifyByHeaders, opts...)(&a).ServeHTTP(rec, request("/v1/read", "acme", "k"))
				if len(failures) != 1 || (match != nil && !errors.Is(failures[0], match)) {
					t.Fatalf("failures %v; want one matching %v", failures, match)
				}
				if rec.Header().Get("RateLimit") != "" {
					t.Errorf("header %v; want no quota fields without a decision", rec.Header())
				}
				switch mode {
				case middleware.FailClosed:
					if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" ||
						!strings.Contains(rec.Body.String(), "quota check failed") || a.served.Load() != 0 {
						t.Errorf("%d %v %s, served %d; want 503 with Retry-After 1 and a body that says so, not served", rec.Code, rec.Header(), rec.Body, a.served.Load())
					}
				case middleware.FailOpen:
					if rec.Code != http.StatusOK || a.served.Load() != 1 {
						t.Errorf("%d %s, served %d; want the service's 200", rec.Code, rec.Body, a.served.Load())
					}
				}
			})
		}
	}
}

// benchWriter is a ResponseWriter that keeps nothing, so the benchmarks
// measure the middleware and the engine rather than a recorder.
type benchWriter struct {
	header http.Header
	status int
}

func (w *benchWriter) Header() http.Header         { return w.header }
func (w *benchWriter) WriteHeader(status int)      { w.status = status }
func (w *benchWriter) Write(b []byte) (int, error) { return len(b), nil }

// benchHandler is the middleware with a local engine on a plane whose
// limits never deny, in front of a service that writes nothing: a request's
// cost is the identity, the decision at all four levels and the two quota
// header fields.
func benchHandler(b testing.TB) http.Handler {
	p, err := policy.LoadFS(os.DirFS("testdata/bench"))
	if err != nil {
		b.Fatal(err)
	}
	e, err := enforcer.New(p) // its real, coarse clock
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	identify := func(r *http.Request) (enforcer.Request, error) {
		return enforcer.Request{Tenant: r.Header.Get("X-Tenant"), APIKey: r.Header.Get("X-Api-Key"), Endpoint: "read"}, nil
	}
	return middleware.HTTP(middleware.Local(e), identify)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
}

func BenchmarkHTTPLocal(b *testing.B) {
	h := benchHandler(b)
	r := request("/v1/read", "bench-tenant", "k")
	w := &benchWriter{header: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.header)
		h.ServeHTTP(w, r)
		if w.status != http.StatusNoContent {
			b.Fatalf("status %d", w.status)
		}
	}
}

// BenchmarkHTTPLocalParallel: each goroutine a tenant of its own, as a
// service's concurrent requests mostly are.
func BenchmarkHTTPLocalParallel(b *testing.B) {
	h := benchHandler(b)
	var goroutines atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := request("/v1/read", "bench-tenant-"+strconv.FormatInt(goroutines.Add(1), 10), "k")
		w := &benchWriter{header: http.Header{}}
		for pb.Next() {
			clear(w.header)
			h.ServeHTTP(w, r)
			if w.status != http.StatusNoContent {
				b.Errorf("status %d", w.status)
				return
			}
		}
	})
}

// TestHTTPAllowedAllocs pins the allowed path's allocations: the two
// header values (RateLimit-Policy, RateLimit) and their slices.
func TestHTTPAllowedAllocs(t *testing.T) {
	h := benchHandler(t)
	r := request("/v1/read", "bench-tenant", "k")
	w := &benchWriter{header: http.Header{}}
	allocs := testing.AllocsPerRun(1000, func() {
		clear(w.header)
		h.ServeHTTP(w, r)
	})
	if w.status != http.StatusNoContent {
		t.Fatalf("status %d; want the service's 204", w.status)
	}
	if allocs > 4 {
		t.Errorf("%.1f allocations per allowed request; want at most 4", allocs)
	}
}
