package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/explain"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/server"
)

// enforcerServers serves an engine on the sample plane as an enforcer
// does: the decision API and the admin listener, on loopback.
func enforcerServers(t *testing.T) (api, admin *httptest.Server) {
	t.Helper()
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(p.WithVersion(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	m := server.NewMetrics(e, nil)
	api, admin = httptest.NewServer(server.NewAPI(e, m)), httptest.NewServer(server.NewAdmin(e, m, func() bool { return true }))
	t.Cleanup(api.Close)
	t.Cleanup(admin.Close)
	return api, admin
}

func decide(t *testing.T, api *httptest.Server, tenant, endpoint string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, api.URL+"/api/"+endpoint, nil)
	req.Header.Set(server.HeaderTenant, tenant)
	req.Header.Set(server.HeaderAPIKey, "k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A free tenant's bucket holds two exports (cost 50, burst 100); the third
// is denied at the tenant level, and explain says so.
func TestExplainAThrottledTenant(t *testing.T) {
	api, admin := enforcerServers(t)
	for i, want := range []int{200, 200, 429} {
		if got := decide(t, api, "free-trial", "export"); got != want {
			t.Fatalf("export %d: %d, want %d", i+1, got, want)
		}
	}
	code, out, errOut := quotactl(t, "explain", "free-trial", "--enforcer", admin.URL)
	if code != 0 {
		t.Fatalf("explain: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"tenant free-trial: tier free, weight 1, named by the plane; policy version 3, mode local",
		"its last denial (", "export, cost 50) was at the tenant level",
		"recent decisions, newest first",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`\ntenant +- +50 per 1s \(burst 100\) +\d+\n`).MatchString(out) {
		t.Errorf("explain output lacks the tenant level's row:\n%s", out)
	}
	code, out, _ = quotactl(t, "explain", "-o", "json", "--enforcer", admin.URL, "free-trial")
	var x explain.Explanation
	if err := json.Unmarshal([]byte(out), &x); code != 0 || err != nil {
		t.Fatalf("explain -o json: exit %d, %v\n%s", code, err, out)
	}
	if x.View.Admitted != 2 || x.View.Denied["tenant"] != 1 || len(x.View.Recent) != 2 || x.View.Recent[1].Count != 2 || x.View.Recent[0].Allowed || x.View.Tier != "free" {
		t.Errorf("explain -o json: %+v", x.View)
	}

	// A tenant that sent nothing here, a wrong URL and a dead enforcer.
	code, _, errOut = quotactl(t, "explain", "nobody", "--enforcer", admin.URL)
	if code != 1 || !strings.Contains(errOut, `404 Not Found: no state for tenant "nobody"`) {
		t.Errorf("explain of a tenant without state: exit %d, %s", code, errOut)
	}
	code, _, errOut = quotactl(t, "explain", "acme", "--enforcer", "127.0.0.1:9090")
	if code != 1 || !strings.Contains(errOut, "want the admin listener's URL") {
		t.Errorf("explain with a URL without scheme: exit %d, %s", code, errOut)
	}
	admin.Close()
	code, _, errOut = quotactl(t, "explain", "free-trial", "--enforcer", admin.URL)
	if code != 1 || !strings.Contains(errOut, "cannot reach the enforcer's admin API") {
		t.Errorf("explain against a closed listener: exit %d, %s", code, errOut)
	}
}

// A tenant that only got its requests through is not throttled.
func TestExplainATenantNotThrottled(t *testing.T) {
	api, admin := enforcerServers(t)
	if got := decide(t, api, "acme", "read"); got != 200 {
		t.Fatalf("read: %d", got)
	}
	code, out, errOut := quotactl(t, "explain", "acme", "--enforcer", admin.URL, "-o", "markdown")
	if code != 0 || !strings.Contains(out, "- not throttled now") || !strings.Contains(out, "| tenant | - | 500 per 1s (burst 1000) |") {
		t.Errorf("explain acme: exit %d, %s\n%s", code, errOut, out)
	}
}
