package server

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

func sampleAPI(t testing.TB) http.Handler {
	t.Helper()
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return NewAPI(e, nil)
}

func post(h http.Handler, path string, headers map[string]string, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// TestExportsUntilTheTenantLimitFires replays the README's curl session: a
// free tenant's bucket holds two exports, the third gets a 429 that names the
// level, the reason and when to retry.
func TestExportsUntilTheTenantLimitFires(t *testing.T) {
	h := sampleAPI(t)
	headers := map[string]string{HeaderTenant: "free-trial", HeaderAPIKey: "k1"}
	for i := range 2 {
		if rec := post(h, "/api/export", headers, ""); rec.Code != http.StatusOK {
			t.Fatalf("export %d: status %d, body %s; want 200", i+1, rec.Code, rec.Body)
		}
	}
	rec := post(h, "/api/export", headers, "")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("third export: status %d; want 429", rec.Code)
	}
	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q; want 1 (whole seconds, rounded up)", got)
	}
	if got := rec.Header().Get(HeaderLevel); got != "tenant" {
		t.Errorf("%s %q; want tenant", HeaderLevel, got)
	}
	if got := rec.Header().Get(HeaderReason); !strings.Contains(got, "tenant limit of 50 per 1s (burst 100)") {
		t.Errorf("%s %q; want it to name the tenant limit", HeaderReason, got)
	}
	var body decision
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Allowed || body.Level != "tenant" || body.Cost != 50 {
		t.Errorf("429 body %s (%v); want allowed false, level tenant, cost 50", rec.Body, err)
	}
}

func TestBadRequestsSayWhatIsWrong(t *testing.T) {
	h := sampleAPI(t)
	ok := map[string]string{HeaderTenant: "acme", HeaderAPIKey: "k"}
	with := func(k, v string) map[string]string {
		m := map[string]string{HeaderTenant: "acme", HeaderAPIKey: "k"}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name    string
		method  string
		path    string
		headers map[string]string
		body    string
		status  int
		says    string
	}{
		{"no tenant", "POST", "/api/read", with(HeaderTenant, ""), "", 400, "missing X-Tenant"},
		{"no key", "POST", "/api/read", with(HeaderAPIKey, ""), "", 400, "missing X-Api-Key"},
		{"tenant with a space", "POST", "/api/read", with(HeaderTenant, "a b"), "", 400, "printable"},
		{"tenant too long", "POST", "/api/read", with(HeaderTenant, strings.Repeat("x", 257)), "", 400, "256"},
		{"units not a number", "POST", "/api/read", with(HeaderUnits, "many"), "", 400, "X-Quota-Units"},
		{"units zero", "POST", "/api/read", with(HeaderUnits, "0"), "", 400, "X-Quota-Units"},
		{"wrong method", "GET", "/api/read", ok, "", 405, "POST"},
		{"no endpoint", "POST", "/api/", ok, "", 404, "no such path"},
		{"other path", "POST", "/nope", ok, "", 404, "no such path"},
		{"body too large", "POST", "/api/read", ok, strings.Repeat("x", MaxBodyBytes+1), 413, "larger than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.says) {
				t.Errorf("status %d body %s; want %d saying %q", rec.Code, rec.Body, tc.status, tc.says)
			}
		})
	}
}

// TestRateLimitHeaders: every answer announces the limits in force, one
// item per level, and the level that bounds it.
func TestRateLimitHeaders(t *testing.T) {
	h := sampleAPI(t)
	headers := map[string]string{HeaderTenant: "free-trial", HeaderAPIKey: "k1"}
	first := post(h, "/api/export", headers, "")
	policyField := first.Header().Get(HeaderRateLimitPolicy)
	for _, want := range []string{`"global";q=10000;w=1`, `"tenant";q=50;w=1`, `"endpoint";q=100;w=300`} {
		if !strings.Contains(policyField, want) {
			t.Errorf("%s %q lacks %s", HeaderRateLimitPolicy, policyField, want)
		}
	}
	// After one export of 50, the free tier's export window (100 per
	// 300s) and its bucket (100) both hold 50: the tenant bucket, compared
	// first, bounds the answer and is full again in a second.
	if got := first.Header().Get(HeaderRateLimit); got != `"tenant";r=50;t=1` {
		t.Errorf("%s on a 200: %q", HeaderRateLimit, got)
	}
	post(h, "/api/export", headers, "")
	third := post(h, "/api/export", headers, "")
	if third.Code != http.StatusTooManyRequests {
		t.Fatalf("third export: %d", third.Code)
	}
	if got := third.Header().Get(HeaderRateLimit); got != `"tenant";r=0;t=1` {
		t.Errorf("%s on a 429: %q, want the tenant level, nothing left, retry in 1s", HeaderRateLimit, got)
	}
}

// TestFloodOfUnknownTenantsAndKeys: distinct tenants and api keys chosen
// by clients leave bounded state, no goroutines behind, and bounded metric
// labels.
func TestFloodOfUnknownTenantsAndKeys(t *testing.T) {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	const maxTenants = 100
	e, err := enforcer.New(p, enforcer.WithMaxTenants(maxTenants), enforcer.WithMaxKeys(500))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	m := NewMetrics(e, nil)
	h := NewAPI(e, m)
	goroutines := runtime.NumGoroutine()
	for i := range 20_000 {
		rec := post(h, "/api/read", map[string]string{HeaderTenant: "flood-" + strconv.Itoa(i), HeaderAPIKey: "key-" + strconv.Itoa(i)}, "")
		if rec.Code != http.StatusOK && rec.Code != http.StatusTooManyRequests {
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	named := len(p.Spec().Tenants)
	if n := e.PlaneStatusAt(time.Now()).Tenants; n > maxTenants+named+1 {
		t.Fatalf("%d tenant states after 20,000 distinct tenants, want at most %d", n, maxTenants+named+1)
	}
	if g := runtime.NumGoroutine(); g > goroutines+5 {
		t.Fatalf("goroutines grew from %d to %d", goroutines, g)
	}
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "quotaplane_enforcer_admitted_total" && len(f.GetMetric()) > named+3 {
			t.Fatalf("%d admitted series: labels came from requests", len(f.GetMetric()))
		}
	}
}

// TestWriteDecisionIsEncodingJSON: the decision body formatted by hand is
// byte for byte what encoding/json writes, for names and reasons with
// every kind of character and retries from a microsecond to an hour.
func TestWriteDecisionIsEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"a", "Z", "0", "-", "\"", "\\", "<", ">", "&", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f", "é", "€", "\u2028", "\u2029", "\ufffd", "\xff", "\xc3", "🙂", " "}
	text := func() string {
		var sb strings.Builder
		for range rng.IntN(12) {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return sb.String()
	}
	for n := range 5000 {
		d := decision{Allowed: rng.IntN(2) == 0, Tenant: text(), Endpoint: text(), Cost: rng.Int64N(1e6) - 10, Remaining: rng.Int64N(1e9) - 1e8}
		if rng.IntN(2) == 0 {
			d.Borrowed = rng.Int64N(100)
			d.Level, d.Reason = text(), text()
			d.RetryAfterSec = []float64{1e-6, 1e-7, 0.5, 1, 3.25, 3600, 1e21, 2.5e-9}[rng.IntN(8)]
		}
		var want bytes.Buffer
		_ = json.NewEncoder(&want).Encode(d)
		got := httptest.NewRecorder()
		writeDecision(got, http.StatusOK, &d)
		if got.Body.String() != want.String() {
			t.Fatalf("case %d: %+v\nwrote  %s\nencoding/json %s", n, d, got.Body.String(), want.String())
		}
		if ct := got.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("Content-Type %q", ct)
		}
	}
}
