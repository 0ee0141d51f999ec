package upstream

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

const leaderPlane = `
apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: main, namespace: prod}
spec:
  global: {rate: 100000, burst: 100000}
  tiers:
  - {name: enterprise, weight: 8, tenant: {rate: 100, burst: 100}}
  - {name: free, weight: 1, tenant: {rate: 10, burst: 10}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: chat, namespace: prod}
spec: {endpoint: chat, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: gold, namespace: prod}
spec: {tenant: gold, tier: enterprise, priority: {contractValue: 500000}}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: silver, namespace: prod}
spec: {tenant: silver, tier: enterprise}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: bronze, namespace: prod}
spec: {tenant: bronze, tier: free}
---
apiVersion: quotaplane.io/v1alpha1
kind: Upstream
metadata: {name: llm, namespace: prod}
spec:
  capacity: {rate: 600, period: 1m}
  endpoints: [chat]
  probe: {url: PROBE_URL, interval: 15s, timeout: 1s}
`

// testLeader is a leader of leaderPlane probing url, on a virtual clock.
func testLeader(t *testing.T, srv *redistest.Server, url string, clock *atomic.Int64) *Leader {
	t.Helper()
	objs, err := policy.DecodeYAML([]byte(strings.Replace(leaderPlane, "PROBE_URL", url, 1)))
	if err != nil {
		t.Fatal(err)
	}
	p, problems := policy.Compile(objs)
	if len(problems) > 0 {
		t.Fatalf("compile: %v", problems)
	}
	var ups []*v1alpha1.Upstream
	for _, o := range objs {
		if u, ok := o.(*v1alpha1.Upstream); ok {
			ups = append(ups, u)
		}
	}
	specs, problems := policy.CompileUpstreams(p, ups)
	if len(problems) > 0 {
		t.Fatalf("upstreams: %v", problems)
	}
	return &Leader{Plane: p.ID(), Redis: srv.Client(),
		Load:  func(context.Context) (*policy.Policy, []policy.Upstream, error) { return p, specs, nil },
		Clock: func() time.Time { return time.UnixMilli(clock.Load()) }}
}

// TestLeaderDegradesAndClasses: a provider that starts failing takes its
// upstream from Healthy through Degraded to phase 1 in two cycles; the
// critical tenant (enterprise, 500k contract) is upgraded at once, the free
// one suspended only on the second cycle below (hysteresis); the plan in
// Redis carries it all, critical's reserve included; a leader that takes
// over restores the phases and classes, so its first cycle changes
// nothing.
func TestLeaderDegradesAndClasses(t *testing.T) {
	srv := redistest.Start(t)
	var failing atomic.Bool
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer provider.Close()
	var clock atomic.Int64
	clock.Store(time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC).UnixMilli())
	l := testLeader(t, srv, provider.URL, &clock)
	ctx := context.Background()
	probe := func() {
		l.probeDue(ctx, l.now())
		l.probing.Wait()
	}
	advance := func(d time.Duration) { clock.Add(d.Milliseconds()) }

	c := l.RunCycle(ctx)
	probe()
	if c.Err != nil || c.Upstreams[0].Phase != Healthy {
		t.Fatalf("first cycle: %+v, want Healthy and published", c)
	}
	failing.Store(true)
	for range 5 {
		advance(15 * time.Second)
		probe()
	}
	c = l.RunCycle(ctx) // 1 success, 5 errors: confidence ≈ 1 − 0.5·5/6
	u := c.Upstreams[0]
	if c.Err != nil || u.Phase != Degraded || u.Terms.Confidence > 0.6 || u.Terms.Confidence < 0.55 {
		t.Fatalf("after 5 failed probes: phase %s, confidence %.3f, err %v; want Degraded at about 0.58", u.Phase, u.Terms.Confidence, c.Err)
	}
	if len(u.Changes) != 1 || u.Changes[0] != (ClassChange{Tenant: "gold", From: High, To: Critical, Score: 0.85}) {
		t.Errorf("first degraded cycle's changes %+v, want gold high → critical only (an upgrade is immediate, a downgrade waits)", u.Changes)
	}
	advance(10 * time.Second)
	probe()
	c = l.RunCycle(ctx)
	u = c.Upstreams[0]
	if u.Phase != Phase1 || len(u.Changes) != 1 || u.Changes[0].Tenant != "bronze" || u.Changes[0].To != Suspended {
		t.Fatalf("second degraded cycle: phase %s, changes %+v; want Phase1 and bronze suspended", u.Phase, u.Changes)
	}
	plan, err := ReadPlan(ctx, srv.Client(), l.Plane)
	if err != nil || plan == nil {
		t.Fatalf("plan: %v %v", plan, err)
	}
	up := plan.Upstreams[0]
	if _, listed := up.Tenants["bronze"]; up.Phase != Phase1 || up.Tenants["gold"].Class != Critical || listed || up.Reserve != 10 || up.Capacity != 10 {
		t.Errorf("published %+v, want Phase1, gold critical with its 100/s reserve capped at the 10/s capacity, bronze not listed (its tier's class)", up)
	}
	if up.Tiers["free"] != Suspended || up.Tiers["enterprise"] != High {
		t.Errorf("tier classes %v, want free suspended, enterprise high", up.Tiers)
	}

	next := testLeader(t, srv, provider.URL, &clock)
	advance(10 * time.Second)
	c = next.RunCycle(ctx)
	if u := c.Upstreams[0]; u.Phase != Phase1 || len(u.Changes) != 0 {
		t.Errorf("a new leader's first cycle: phase %s, changes %+v; want Phase1 kept and no changes", u.Phase, u.Changes)
	}
}

// TestBandMarginKeepsClassesAtAnEdge: a confidence hovering at a band's
// edge, as a flapping upstream's does, does not move a tenant up and down;
// once past the edge by BandMargin the upgrade is immediate.
func TestBandMarginKeepsClassesAtAnEdge(t *testing.T) {
	var classes Classifier
	// Score 0.4 (base 0.4): suspended below 0.65, low from 0.65 to 0.9.
	for i, step := range []struct {
		c    float64
		want Class
	}{
		{0.60, Suspended},
		{0.67, Suspended}, // 0.62 is still below the edge
		{0.63, Suspended},
		{0.68, Suspended},
		{0.71, Low}, // 0.66: past the edge
		{0.63, Low}, // a first cycle below
		{0.67, Low},
		{0.63, Low},
		{0.60, Suspended}, // a second cycle below
	} {
		got, _ := classify(&classes, "t", 0.4, step.c, 0.4)
		classes.EndCycle()
		if got != step.want {
			t.Errorf("cycle %d at %.2f: %s, want %s", i, step.c, got, step.want)
		}
	}
}

// TestPlanNowCeiling: capacity now is capacity × confidence, at most the
// provider's stated limit.
func TestPlanNowCeiling(t *testing.T) {
	u := UpstreamPlan{Capacity: 2000}
	if got := u.Now(0.5); got != 1000 {
		t.Errorf("no ceiling: %v, want 1000", got)
	}
	u.Ceiling = 800
	if got := u.Now(0.5); got != 800 {
		t.Errorf("ceiling 800: %v, want 800", got)
	}
	if got := u.Now(0.3); got != 600 {
		t.Errorf("ceiling 800 at 0.3: %v, want 600", got)
	}
}
