package server

import (
	"context"
	"fmt"
	"html"
	"io/fs"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// uiEvilTenant is a tenant name html/template must escape.
const uiEvilTenant = `<script>alert("x")</script>`

// uiLoadedEngine is an engine on the sample plane, its global limit cut to
// 200 tokens/s (burst 200) so that a few hundred decisions contend for it,
// after five seconds of load in virtual time ending now: whale-1
// (enterprise) 143 reads/s, acme (standard) 100/s, two free tenants 83/s
// and 30/s (one named to test escaping), and a free tenant's exports beyond
// its endpoint limit.
func uiLoadedEngine(t *testing.T, now time.Time) *enforcer.Engine {
	t.Helper()
	files := fstest.MapFS{}
	err := fs.WalkDir(samples.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(samples.FS, path)
		files[path] = &fstest.MapFile{Data: b}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	plane := string(files["quotaplane.yaml"].Data)
	const global = "global: {rate: 10000, burst: 20000}"
	if !strings.Contains(plane, global) {
		t.Fatalf("the sample plane's global limit is no longer %q: update this test", global)
	}
	files["quotaplane.yaml"].Data = []byte(strings.Replace(plane, global, "global: {rate: 200, burst: 200}", 1))
	p, err := policy.LoadFS(files)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(p.WithVersion(7))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	offers := []struct {
		tenant, endpoint string
		every            int // ms between requests
	}{{"whale-1", "read", 7}, {"acme", "read", 10}, {"free-a", "read", 12}, {uiEvilTenant, "read", 33}} // ≈ 143, 100, 83, 30 /s
	start := now.Add(-5 * time.Second)
	for i := range 3 { // before the load: the third export of cost 50 is beyond the free tier's tenant burst of 100
		if _, err := e.DecideAt(start.Add(time.Duration(i-3)*time.Millisecond), enforcer.Request{Tenant: "free-b", Endpoint: "export"}); err != nil {
			t.Fatal(err)
		}
	}
	for ms := range 5000 {
		for _, o := range offers {
			if ms%o.every == 0 {
				if _, err := e.DecideAt(start.Add(time.Duration(ms)*time.Millisecond), enforcer.Request{Tenant: o.tenant, Endpoint: o.endpoint}); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return e
}

// uiRow is the HTML of the table row whose attr is value (escaped as
// html/template escapes an attribute), or fails the test.
func uiRow(t *testing.T, body, attr, value string) string {
	t.Helper()
	esc := strings.NewReplacer(`"`, "&#34;", "<", "&lt;", ">", "&gt;").Replace(value)
	m := regexp.MustCompile(`(?s)<tr class="[a-z]+" ` + attr + `="` + regexp.QuoteMeta(esc) + `">(.*?)</tr>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no row %s=%q in the page", attr, value)
	}
	return m[1]
}

// uiCell is the text of the cell of class class in row.
func uiCell(t *testing.T, row, class string) string {
	t.Helper()
	m := regexp.MustCompile(`<td class="n ` + class + `">([^<]*)</td>`).FindStringSubmatch(row)
	if m == nil {
		t.Fatalf("no cell %q in row %s", class, row)
	}
	return html.UnescapeString(m[1])
}

// TestUIShowsTheEnginesNumbers: GET /quota/ui on the real admin handler
// under contention shows the policy version, each tier's weight, floor,
// tenants, demand, fair share and counters, the busiest tenants' and the
// denials by level exactly as the engine reports them; tenant names are
// escaped; the page loads nothing from anywhere.
func TestUIShowsTheEnginesNumbers(t *testing.T) {
	e := uiLoadedEngine(t, time.Now())
	admin := NewAdmin(e, NewMetrics(e, nil), func() bool { return true })
	rec := get(admin, "/quota/ui")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET /quota/ui: %d %s\n%s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	body := rec.Body.String()
	load := e.PlaneLoad(uiTop) // no decision since: the page's state
	if !load.Contended || load.Denied[enforcer.LevelGlobal] == 0 || load.Denied[enforcer.LevelTenant] == 0 {
		t.Fatalf("the load is too light to test the view: %+v", load)
	}

	for _, want := range []string{`id="policy-version">v7<`, `id="mode">local<`, `<b id="contended">contended</b>`, `<meta http-equiv="refresh" content="2">`} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %s", want)
		}
	}
	wantTiers := map[string][2]string{"enterprise": {"8", "40% · 80.0/s"}, "standard": {"4", "25% · 50.0/s"}, "free": {"1", "5% · 10.0/s"}}
	for _, tl := range load.Tiers {
		row := uiRow(t, body, "data-tier", tl.Name)
		var denied int64
		for _, n := range tl.Denied {
			denied += n
		}
		for class, want := range map[string]string{
			"weight": wantTiers[tl.Name][0], "floor": wantTiers[tl.Name][1],
			"tenants": strconv.Itoa(tl.Tenants), "demand": uiRate(tl.Demand), "share": uiShare(true, tl.FairShare),
			"admitted": strconv.FormatInt(tl.Admitted, 10), "denied": strconv.FormatInt(denied, 10),
		} {
			if got := uiCell(t, row, class); got != want {
				t.Errorf("tier %s: %s shows %q, the engine %q", tl.Name, class, got, want)
			}
		}
	}
	busy := map[string]bool{"whale-1": true, "acme": true, "free-a": true, uiEvilTenant: true, "free-b": true}
	for i, tl := range load.Top {
		row := uiRow(t, body, "data-tenant", tl.Tenant)
		for class, want := range map[string]string{
			"demand": uiRate(tl.Demand), "share": uiShare(true, tl.FairShare),
			"admitted": strconv.FormatInt(tl.Admitted, 10), "denied": strconv.FormatInt(tl.Denied, 10),
		} {
			if got := uiCell(t, row, class); got != want {
				t.Errorf("tenant %s: %s shows %q, the engine %q", tl.Tenant, class, got, want)
			}
		}
		if i < len(busy) && (!busy[tl.Tenant] || tl.Demand <= 0) {
			t.Errorf("top %d: %s, demand %.1f/s; want the tenants under load first", i, tl.Tenant, tl.Demand)
		}
	}
	for _, l := range enforcer.Levels {
		if got, want := uiCell(t, uiRow(t, body, "data-level", string(l)), "count"), strconv.FormatInt(load.Denied[l], 10); got != want {
			t.Errorf("denied at %s: the page %s, the engine %s", l, got, want)
		}
	}

	if strings.Contains(body, uiEvilTenant) || !strings.Contains(body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
		t.Error("the tenant name <script>… is not escaped")
	}
	for _, external := range []string{"http://", "https://", "<script", "<link", "<img", "@import", "url("} {
		if strings.Contains(body, external) {
			t.Errorf("the page holds %q: it must load nothing", external)
		}
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
}

// TestUIRates: admitted tokens/s and denials/s are the counters'
// differences over the interval between two views, the first view has
// none, and a view sooner than uiMinInterval after the last keeps its
// rates.
func TestUIRates(t *testing.T) {
	now := time.Now()
	e := uiLoadedEngine(t, now)
	u := newUI(e, &adminConfig{})
	ctx := context.Background()
	first := u.view(ctx, now)
	if first.Rated || !strings.Contains(fmt.Sprint(first.Tiers[0].AdmittedRate), "NaN") {
		t.Fatalf("the first view has rates: %+v", first.Tiers[0])
	}
	before := e.PlaneLoad(uiTop)
	for i := range 40 { // whale-1: 40 reads in 2 s, all within its limits
		if _, err := e.DecideAt(now.Add(time.Duration(i)*50*time.Millisecond), enforcer.Request{Tenant: "whale-1", Endpoint: "read"}); err != nil {
			t.Fatal(err)
		}
	}
	after := e.PlaneLoad(uiTop)
	second := u.view(ctx, now.Add(2*time.Second))
	if !second.Rated || second.RateSeconds != "2.0" {
		t.Fatalf("second view: rated %v over %s s", second.Rated, second.RateSeconds)
	}
	tierRate := float64(after.Tiers[0].AdmittedCost-before.Tiers[0].AdmittedCost) / 2
	if tierRate <= 0 || second.Tiers[0].AdmittedRate != tierRate {
		t.Errorf("enterprise admitted %.1f/s on the page, %.1f/s by the engine's counters", second.Tiers[0].AdmittedRate, tierRate)
	}
	var globalRate float64
	for _, d := range second.Denied {
		if d.Level == "global" {
			globalRate = d.Rate
		}
	}
	if want := float64(after.Denied[enforcer.LevelGlobal]-before.Denied[enforcer.LevelGlobal]) / 2; globalRate != want {
		t.Errorf("global denials %.1f/s on the page, %.1f/s by the counters", globalRate, want)
	}
	if third := u.view(ctx, now.Add(2500*time.Millisecond)); third.RateSeconds != "2.0" || third.Tiers[0].AdmittedRate != tierRate {
		t.Errorf("a view 0.5 s later: rates over %s s, enterprise %.1f/s; want the last rates kept", third.RateSeconds, third.Tiers[0].AdmittedRate)
	}
}

// TestUIFleet: in mode central the page lists the fleet from the reports
// in Redis — each enforcer's policy version, marked when it differs from
// this one's, its mode and state — and says the global bucket is in Redis
// rather than showing this enforcer's idle one; in mode local, the fleet is
// the enforcer alone.
func TestUIFleet(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, centralDebugPlane).WithVersion(4)
	reports, err := store.New(srv.Client(), p.ID())
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(p, enforcer.WithRedis(srv.Client()), enforcer.WithNodeID("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	ctx := context.Background()
	if err := reports.ReportState(ctx, store.EnforcerReport{ID: "node-a", PolicyVersion: 4, DecisionsPerSec: 12.5, Mode: "central"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := reports.ReportState(ctx, store.EnforcerReport{ID: "node-<b>", PolicyVersion: 3, DecisionsPerSec: 2, Mode: "central", Degraded: true}, time.Minute); err != nil {
		t.Fatal(err)
	}
	body := get(NewAdmin(e, NewMetrics(e, nil), func() bool { return true }, WithFleet(reports)), "/quota/ui").Body.String()
	self := uiRow(t, body, "data-enforcer", "node-a")
	if uiCell(t, self, "version") != "v4" || !strings.Contains(self, "(this one)") || !strings.Contains(self, "12.5") || !strings.Contains(self, ">ok<") {
		t.Errorf("this enforcer's row: %s", self)
	}
	other := uiRow(t, body, "data-enforcer", "node-<b>")
	if !strings.Contains(other, `v3 <span class="bad">≠</span>`) || !strings.Contains(other, "degraded") || !strings.Contains(other, "node-&lt;b&gt;") {
		t.Errorf("the other enforcer's row (older policy, degraded): %s", other)
	}
	if !strings.Contains(body, `<span id="global-remaining">its bucket in Redis</span>`) {
		t.Error("mode central: the page does not say the global bucket is in Redis")
	}

	local := uiLoadedEngine(t, time.Now())
	body = get(NewAdmin(local, NewMetrics(local, nil), func() bool { return true }), "/quota/ui").Body.String()
	if row := uiRow(t, body, "data-enforcer", local.NodeID()); uiCell(t, row, "version") != "v7" || strings.Count(body, `<tr class="enforcer"`) != 1 {
		t.Errorf("mode local: the fleet is not this enforcer alone at v7: %s", row)
	}
}

// TestUIUpstreams: with a published plan whose upstream llm is degraded,
// the page shows its phase, its capacity confidence as the engine applies
// it, its capacity and, per class, the requests the engine refused.
func TestUIUpstreams(t *testing.T) {
	srv, p, e := sampleEngineOnRedis(t)
	plan := &upstream.Plan{Plane: p.ID(), Interval: 30 * time.Second, Upstreams: []upstream.UpstreamPlan{{
		Name: "llm", Endpoints: []string{"export"}, Capacity: 100, Confidence: 0.55, Phase: upstream.Phase1,
		Tiers: map[string]upstream.Class{"enterprise": upstream.High, "standard": upstream.Medium, "free": upstream.Low},
	}}}
	if err := upstream.PublishPlan(context.Background(), srv.Client(), plan); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the enforcer to hold the plan", func() bool { return len(e.UpstreamStatus()) > 0 })
	api := NewAPI(e, nil)
	for range 3 { // a free tenant (class low) is suspended on export in phase 1
		if rec := post(api, "/api/export", map[string]string{HeaderTenant: "free-trial", HeaderAPIKey: "k1"}, ""); rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("free tenant on export in phase 1: %d %s", rec.Code, rec.Body)
		}
	}
	before := e.UpstreamStatus()[0]
	body := get(NewAdmin(e, NewMetrics(e, nil), func() bool { return true }), "/quota/ui").Body.String()
	after := e.UpstreamStatus()[0]
	m := regexp.MustCompile(`(?s)<div class="upstream" data-upstream="llm">.*?<span class="phase">([^<]*)</span>.*?<span class="confidence">([^<]*)</span>.*?<span class="capacity">([^<]*)</span>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no upstream llm in the page:\n%s", body)
	}
	confidence, err := strconv.ParseFloat(m[2], 64)
	if m[1] != before.Phase || err != nil || confidence > before.Confidence+0.005 || confidence < after.Confidence-0.005 || m[3] != "100" {
		t.Errorf("llm: phase %s, confidence %s, capacity %s; the engine: %s, %.3f to %.3f, %.0f", m[1], m[2], m[3], before.Phase, before.Confidence, after.Confidence, before.Capacity)
	}
	for _, c := range after.Classes {
		row := uiRow(t, body, "data-class", c.Class)
		if got, want := uiCell(t, row, "suspended"), strconv.FormatInt(c.Suspended, 10); got != want {
			t.Errorf("class %s: %s suspended on the page, %s by the engine", c.Class, got, want)
		}
		if c.Class == "low" && c.Suspended != 3 {
			t.Errorf("class low: %d suspended, 3 sent", c.Suspended)
		}
	}
}
