package server

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// sampleServers are the decision API and the admin handler of one engine on
// the sample plane; ready is what /readyz reports.
func sampleServers(t *testing.T, ready *bool) (api, admin http.Handler) {
	t.Helper()
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(p.WithVersion(7))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	m := NewMetrics(e, nil)
	return NewAPI(e, m), NewAdmin(e, m, func() bool { return *ready })
}

func get(h http.Handler, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

func TestHealthAndReadiness(t *testing.T) {
	ready := false
	_, admin := sampleServers(t, &ready)
	if rec := get(admin, "/healthz"); rec.Code != http.StatusOK {
		t.Fatalf("/healthz: %d", rec.Code)
	}
	if rec := get(admin, "/readyz"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "no policy") {
		t.Fatalf("/readyz before a policy: %d %s", rec.Code, rec.Body)
	}
	ready = true
	if rec := get(admin, "/readyz"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"policyVersion":7`) {
		t.Fatalf("/readyz: %d %s", rec.Code, rec.Body)
	}
	if rec := get(admin, "/nosuch"); rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "/quota/debug") {
		t.Fatalf("unknown admin path: %d %s", rec.Code, rec.Body)
	}
}

// TestMetrics: decisions are counted by tenant and tier (tenants the policy
// does not name as other) and by the level that fired; the engine's state
// is read at the scrape.
func TestMetrics(t *testing.T) {
	ready := true
	api, admin := sampleServers(t, &ready)
	headers := map[string]string{HeaderTenant: "free-trial", HeaderAPIKey: "k1"}
	for range 3 { // two exports pass, the third fires the tenant level
		post(api, "/api/export", headers, "")
	}
	post(api, "/api/read", map[string]string{HeaderTenant: "someone-new-1", HeaderAPIKey: "k"}, "")
	post(api, "/api/read", map[string]string{HeaderTenant: "someone-new-2", HeaderAPIKey: "k"}, "")
	rec := get(admin, "/metrics")
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	body := rec.Body.String()
	for _, want := range []string{
		`quotaplane_enforcer_admitted_total{tenant="free-trial",tier="free"} 2`,
		`quotaplane_enforcer_admitted_total{tenant="other",tier="free"} 2`,
		`quotaplane_enforcer_denied_total{endpoint="export",level="tenant",tier="free"} 1`,
		`quotaplane_enforcer_throttled_total{tenant="free-trial",tier="free"} 1`,
		`quotaplane_enforcer_throttled_total{tenant="other",tier="free"} 0`,
		`quotaplane_enforcer_tier_fair_share_ratio{tier="free"}`,
		`quotaplane_enforcer_reconcile_overage_ratio 0`,
		"go_goroutines ",
		"process_resident_memory_bytes ",
		`quotaplane_enforcer_decision_duration_seconds_count 5`,
		`quotaplane_enforcer_policy_version{hash=`,
		`quotaplane_enforcer_backend_degraded{mode="local"} 0`,
		`quotaplane_enforcer_borrow_debt{tenant="acme"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "someone-new") {
		t.Error("a tenant label was taken from a request")
	}
}

// TestDebug: the tenant's live limits and remaining tokens per level, its
// tier, the policy version and its recent decisions with level and reason.
func TestDebug(t *testing.T) {
	ready := true
	api, admin := sampleServers(t, &ready)
	headers := map[string]string{HeaderTenant: "free-trial", HeaderAPIKey: "k1"}
	for range 3 {
		post(api, "/api/export", headers, "")
	}
	rec := get(admin, "/quota/debug?tenant=free-trial")
	if rec.Code != http.StatusOK {
		t.Fatalf("debug: %d %s", rec.Code, rec.Body)
	}
	var v DebugView
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if v.Tier != "free" || !v.Known || v.PolicyVersion != 7 || v.Backend != "local" || v.Admitted != 2 || v.Denied["tenant"] != 1 {
		t.Fatalf("debug view %+v", v)
	}
	levels := map[string]bool{}
	for _, l := range v.Limits {
		levels[l.Level] = true
	}
	if !levels["global"] || !levels["tenant"] || !levels["endpoint"] {
		t.Fatalf("limits %+v: want global, tenant and endpoint levels", v.Limits)
	}
	// The two admitted requests alike are one entry with their count.
	if len(v.Recent) != 2 || v.Recent[0].Allowed || v.Recent[0].Level != "tenant" || v.Recent[0].Reason == "" || v.Recent[0].Count != 1 ||
		!v.Recent[1].Allowed || v.Recent[1].Count != 2 {
		t.Fatalf("recent decisions, newest first: %+v", v.Recent)
	}
	for path, code := range map[string]int{
		"/quota/debug":                   http.StatusBadRequest,
		"/quota/debug?tenant=a%20b":      http.StatusBadRequest,
		"/quota/debug?tenant=never-seen": http.StatusNotFound,
	} {
		if rec := get(admin, path); rec.Code != code || !strings.Contains(rec.Body.String(), "error") {
			t.Errorf("%s: %d %s, want %d with an error", path, rec.Code, rec.Body, code)
		}
	}
}

// TestRedisLatencyMetric: the engine's Redis calls are observed into the
// histogram /metrics serves.
func TestRedisLatencyMetric(t *testing.T) {
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.Override(policy.Overrides{Mode: "central"}); err != nil {
		t.Fatal(err)
	}
	latency := RedisLatency()
	e, err := enforcer.New(p, enforcer.WithRedis(redistest.Start(t).Client()),
		enforcer.WithRedisObserver(func(d time.Duration) { latency.Observe(d.Seconds()) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	m := NewMetrics(e, latency)
	api, admin := NewAPI(e, m), NewAdmin(e, m, func() bool { return true })
	for range 3 {
		post(api, "/api/read", map[string]string{HeaderTenant: "acme", HeaderAPIKey: "k"}, "")
	}
	body := get(admin, "/metrics").Body.String()
	for _, want := range []string{"quotaplane_enforcer_redis_call_duration_seconds_count 3", `quotaplane_enforcer_backend_degraded{mode="central"} 0`, "quotaplane_enforcer_redis_script_calls_total 3"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestDeferred(t *testing.T) {
	var d Deferred
	if rec := get(&d, "/healthz"); rec.Code != http.StatusOK {
		t.Fatalf("/healthz while waiting: %d", rec.Code)
	}
	for _, path := range []string{"/readyz", "/metrics", "/api/read"} {
		if rec := get(&d, path); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "no policy") {
			t.Fatalf("%s while waiting: %d %s", path, rec.Code, rec.Body)
		}
	}
	ready := true
	_, admin := sampleServers(t, &ready)
	d.Set(admin)
	if rec := get(&d, "/readyz"); rec.Code != http.StatusOK {
		t.Fatalf("/readyz once set: %d", rec.Code)
	}
}
