package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// TestUpstreamOutageOverHTTP: the sample plane with a published plan that
// has its upstream llm (under export) in phase 1: a free tenant (low) gets
// 503 with Retry-After, X-Outage-Mode and X-Tier on export and is not gated
// on read; forward auth says the same; the metrics and the debug view show
// the upstream; passive reports are taken or refused with a reason, and
// reach the leader's list in Redis.
func TestUpstreamOutageOverHTTP(t *testing.T) {
	srv, p, e := sampleEngineOnRedis(t)
	plan := &upstream.Plan{Plane: p.ID(), Interval: 30 * time.Second, Upstreams: []upstream.UpstreamPlan{{
		Name: "llm", Endpoints: []string{"export"}, Capacity: 100, Confidence: 0.55, Phase: upstream.Phase1,
		Tenants: map[string]upstream.TenantClass{"acme": {Class: upstream.Critical, Score: 0.467}},
		Tiers:   map[string]upstream.Class{"enterprise": upstream.High, "standard": upstream.Medium, "free": upstream.Low},
	}}}
	if err := upstream.PublishPlan(context.Background(), srv.Client(), plan); err != nil {
		t.Fatal(err)
	}
	api := NewAPI(e, nil)
	free := map[string]string{HeaderTenant: "free-trial", HeaderAPIKey: "k1"}
	// The enforcer reads the plan each reconcile interval.
	poll.Until(t, 5*time.Second, "the enforcer to hold the plan", func() bool { return len(e.UpstreamStatus()) > 0 })
	rec := post(api, "/api/export", free, "")
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("free tenant on export in phase 1: %d %s, want 503", rec.Code, rec.Body)
	}
	for name, want := range map[string]string{"Retry-After": "30", "X-Outage-Mode": "true", "X-Tier": "suspended", HeaderLevel: "upstream"} {
		if got := rec.Header().Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if reason := rec.Header().Get(HeaderReason); !strings.Contains(reason, "upstream llm is degraded") {
		t.Errorf("reason %q, want it to name the degraded upstream", reason)
	}
	if rec := post(api, "/api/read", free, ""); rec.Code != http.StatusOK || rec.Header().Get("X-Outage-Mode") != "" {
		t.Errorf("read (no upstream): %d, X-Outage-Mode %q; want 200 and no outage fields", rec.Code, rec.Header().Get("X-Outage-Mode"))
	}
	if rec := post(api, "/api/export", map[string]string{HeaderTenant: "acme", HeaderAPIKey: "k1"}, ""); rec.Code != http.StatusOK || rec.Header().Get("X-Tier") != "critical" {
		t.Errorf("acme (critical) on export: %d, X-Tier %q; want 200 and critical", rec.Code, rec.Header().Get("X-Tier"))
	}
	fa := httptest.NewRequest(http.MethodGet, ForwardAuthPath, nil)
	fa.Header.Set(HeaderTenant, "free-trial")
	fa.Header.Set(HeaderAPIKey, "k1")
	fa.Header.Set(HeaderForwardedMethod, "POST")
	fa.Header.Set(HeaderForwardedURI, "/v1/export/reports")
	farec := httptest.NewRecorder()
	api.ServeHTTP(farec, fa)
	if farec.Code != http.StatusServiceUnavailable || farec.Header().Get("X-Outage-Mode") != "true" {
		t.Errorf("forward auth: %d, X-Outage-Mode %q; want 503 with the outage fields", farec.Code, farec.Header().Get("X-Outage-Mode"))
	}

	m := NewMetrics(e, nil)
	admin := NewAdmin(e, m, func() bool { return true })
	mrec := httptest.NewRecorder()
	admin.ServeHTTP(mrec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, want := range []string{`quotaplane_enforcer_upstream_capacity_confidence{upstream="llm"} 0.55`, `quotaplane_enforcer_upstream_phase{upstream="llm"} 2`,
		`quotaplane_enforcer_upstream_shed_total{class="low",reason="suspended",upstream="llm"}`} {
		if !strings.Contains(mrec.Body.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	drec := httptest.NewRecorder()
	admin.ServeHTTP(drec, httptest.NewRequest(http.MethodGet, "/quota/debug?tenant=free-trial", nil))
	var view DebugView
	if err := json.Unmarshal(drec.Body.Bytes(), &view); err != nil || len(view.Upstreams) != 1 {
		t.Fatalf("debug: %v %s, want one upstream", err, drec.Body)
	}
	if u := view.Upstreams[0]; u.Class != "low" || u.Phase != "Phase1" || !strings.Contains(u.Why, "gets none of the upstream") {
		t.Errorf("debug upstream %+v, want class low in Phase1 and why it gets none", u)
	}
	drec = httptest.NewRecorder()
	admin.ServeHTTP(drec, httptest.NewRequest(http.MethodGet, "/quota/debug?tenant=acme", nil))
	view = DebugView{}
	if err := json.Unmarshal(drec.Body.Bytes(), &view); err != nil || len(view.Upstreams) != 1 {
		t.Fatalf("debug acme: %v %s, want one upstream", err, drec.Body)
	}
	if u := view.Upstreams[0]; u.Class != "critical" || !strings.Contains(u.Why, "priority score 0.47 (tier standard 0.40 + contract 0.03 + real-time 0.00 + importance 0.04 + usage 0.00)") {
		t.Errorf("debug acme %+v, want critical with its score spelled out", u)
	}

	for body, want := range map[string]int{
		`{"calls":[{"upstream":"llm","status":503,"latencyMs":900},{"upstream":"llm","status":200,"latencyMs":100,"count":3,"remaining":5,"limit":100}]}`: http.StatusAccepted,
		`{"calls":[{"upstream":"LLM!","status":200}]}`:                        http.StatusBadRequest,
		`{"calls":[{"upstream":"llm","status":700}]}`:                         http.StatusBadRequest,
		`{"calls":[{"upstream":"llm","status":200,"remaining":9,"limit":5}]}`: http.StatusBadRequest,
		`{"calls":[]}`:        http.StatusBadRequest,
		`{"calls":[{"x":1}]}`: http.StatusBadRequest,
		`not json`:            http.StatusBadRequest,
	} {
		if rec := post(api, UpstreamReportPath, nil, body); rec.Code != want {
			t.Errorf("report %s: %d %s, want %d", body, rec.Code, rec.Body, want)
		}
	}
	var raw []string
	poll.Until(t, 5*time.Second, "the report to reach Redis", func() bool {
		var err error
		raw, err = srv.Client().LRange(context.Background(), upstream.ReportsKey(p.ID(), "llm"), 0, -1).Result()
		return err == nil && len(raw) == 1
	})
	var r upstream.Report
	if err := json.Unmarshal([]byte(raw[0]), &r); err != nil {
		t.Fatal(err)
	}
	if r.N != 4 || r.Errors != 1 || len(r.LatenciesMs) != 4 || r.Remaining != 5 || r.Limit != 100 || r.Node != "n1" {
		t.Errorf("forwarded report %+v, want 4 calls, 1 error, 4 latencies, 5 of 100 remaining, node n1", r)
	}
}

// TestUpstreamReportBatch: a report of many calls to one upstream is one
// upstream, not as many as it has calls; a 17th upstream is refused.
func TestUpstreamReportBatch(t *testing.T) {
	_, _, e := sampleEngineOnRedis(t)
	calls := make([]enforcer.UpstreamCall, 1000)
	for i := range calls {
		calls[i] = enforcer.UpstreamCall{Upstream: "llm", Status: 200}
	}
	if err := e.ReportUpstream(calls); err != nil {
		t.Fatalf("1000 calls to one upstream: %v", err)
	}
	for i := range upstream.MaxUpstreams - 1 {
		if err := e.ReportUpstream([]enforcer.UpstreamCall{{Upstream: fmt.Sprintf("u%d", i), Status: 200}}); err != nil {
			t.Fatalf("upstream %d of %d: %v", i+2, upstream.MaxUpstreams, err)
		}
	}
	if err := e.ReportUpstream([]enforcer.UpstreamCall{{Upstream: "one-too-many", Status: 200}}); err == nil {
		t.Errorf("a %dth upstream was taken", upstream.MaxUpstreams+1)
	}
}

// sampleEngineOnRedis is an engine of the sample plane on a real Redis, as
// node n1.
func sampleEngineOnRedis(t *testing.T) (*redistest.Server, *policy.Policy, *enforcer.Engine) {
	t.Helper()
	srv := redistest.Start(t)
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(p, enforcer.WithRedis(srv.Client()), enforcer.WithNodeID("n1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return srv, p, e
}
