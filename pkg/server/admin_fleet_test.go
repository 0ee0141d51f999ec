package server

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// centralDebugPlane refills once an hour, so that what the debug view reads
// is what the decisions left.
const centralDebugPlane = `
apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: dbg, namespace: default}
spec:
  mode: central
  global: {rate: 1, burst: 1000, period: 1h}
  tiers: [{name: std, weight: 1, tenant: {rate: 1, burst: 100, period: 1h}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: export, namespace: default}
spec: {endpoint: export, cost: 10, limit: {rate: 1, burst: 30, period: 1h}}
`

// TestDebugCentral: in mode central, /quota/debug shows the remaining
// tokens per level from Redis — on an enforcer that never decided for the
// tenant too — and the fleet: every enforcer's report (version, mode,
// degraded), an earlier enforcer's report without a state, and the
// answering enforcer itself.
func TestDebugCentral(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, centralDebugPlane).WithVersion(4)
	reports, err := store.New(srv.Client(), p.ID())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var admins []http.Handler
	var engines []*enforcer.Engine
	for _, id := range []string{"node-a", "node-b"} {
		e, err := enforcer.New(p, enforcer.WithRedis(srv.Client()), enforcer.WithNodeID(id))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		engines = append(engines, e)
		admins = append(admins, NewAdmin(e, NewMetrics(e, nil), func() bool { return true }, WithFleet(reports)))
		b := e.BackendStatus()
		if err := reports.ReportState(ctx, store.EnforcerReport{ID: id, PolicyVersion: 4, DecisionsPerSec: 2, Mode: b.Mode.String(), Degraded: b.Degraded}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := reports.Report(ctx, "old-node", 3, 0, time.Minute); err != nil {
		t.Fatal(err)
	}
	for i := range 4 { // three exports pass, the fourth meets the endpoint's 30
		d, err := engines[0].Decide(ctx, enforcer.Request{Tenant: "acme", Endpoint: "export"})
		if err != nil || d.Allow != (i < 3) {
			t.Fatalf("export %d: %+v, %v", i, d, err)
		}
	}

	rec := get(admins[1], "/quota/debug?tenant=acme") // node-b: never saw acme
	if rec.Code != http.StatusOK {
		t.Fatalf("debug on node-b: %d %s", rec.Code, rec.Body)
	}
	var v DebugView
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	remaining := map[string]int64{}
	for _, l := range v.Limits {
		remaining[l.Level+" "+l.Name] = l.Remaining
	}
	want := map[string]int64{"global ": 970, "tenant ": 70, "endpoint export": 0}
	if len(remaining) != len(want) || v.LimitsReadAt == nil || v.Backend != "central" {
		t.Fatalf("limits %+v (read at %v, backend %s); want %v from Redis", v.Limits, v.LimitsReadAt, v.Backend, want)
	}
	for level, n := range want {
		if got, ok := remaining[level]; !ok || got != n {
			t.Fatalf("limits %+v; want %v from Redis", v.Limits, want)
		}
	}

	if v.Fleet == nil || v.Fleet.Error != "" {
		t.Fatalf("fleet %+v; want the reports", v.Fleet)
	}
	type row struct {
		id       string
		self     bool
		version  int64
		mode     string
		degraded string
	}
	var got []row
	for _, f := range v.Fleet.Enforcers {
		degraded := "unknown"
		if f.Degraded != nil {
			degraded = map[bool]string{true: "degraded", false: "ok"}[*f.Degraded]
		}
		got = append(got, row{f.ID, f.Self, f.PolicyVersion, f.Mode, degraded})
	}
	wantFleet := []row{{"node-a", false, 4, "central", "ok"}, {"node-b", true, 4, "central", "ok"}, {"old-node", false, 3, "", "unknown"}}
	if len(got) != len(wantFleet) {
		t.Fatalf("fleet %+v; want %+v", got, wantFleet)
	}
	for i := range got {
		if got[i] != wantFleet[i] {
			t.Fatalf("fleet %+v; want %+v", got, wantFleet)
		}
	}
}

// TestDebugFleetWithoutReports: an enforcer whose own report is missing
// (it could not reach Redis, or reports nowhere) lists itself, unreported,
// with its state; without a report source the fleet says why.
func TestDebugFleetWithoutReports(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, centralDebugPlane)
	e, err := enforcer.New(p.WithVersion(1), enforcer.WithRedis(srv.Client()), enforcer.WithNodeID("lonely"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.Decide(context.Background(), enforcer.Request{Tenant: "acme", Endpoint: "export"}); err != nil {
		t.Fatal(err)
	}
	var v DebugView
	rec := get(NewAdmin(e, NewMetrics(e, nil), func() bool { return true }), "/quota/debug?tenant=acme")
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	if v.Fleet == nil || v.Fleet.Error == "" || len(v.Fleet.Enforcers) != 1 {
		t.Fatalf("fleet %+v; want an error and this enforcer alone", v.Fleet)
	}
	if self := v.Fleet.Enforcers[0]; !self.Self || self.Reported || self.ID != "lonely" || self.Mode != "central" || self.Degraded == nil || *self.Degraded {
		t.Fatalf("self %+v; want lonely, unreported, central, not degraded", self)
	}
}
