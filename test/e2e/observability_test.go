package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// TestObservability proves the dashboard and the alert rules against real
// data: the manager (on a real API server) and three central enforcers on
// one Redis, scraped every second by Debian's prometheus running
// config/prometheus/quotaplane.rules.yaml (each alert's for: shortened to
// 1s, the expressions as they are).
//
// The sample plane runs with a global limit of 100 tokens/s, which the
// load (about 250 requests a second from many free tenants and the named
// ones) overruns, and the third enforcer runs it with another global rate
// (-global-rps), so its policy's hash differs from the others'. Then:
//
//   - every /metrics body passes promtool check metrics;
//   - every query of every panel of config/grafana/quotaplane.json, and
//     every recording rule's expression, returns data;
//   - QuotaplaneGlobalDenials and QuotaplaneFleetMixedPolicies fire;
//   - Redis is stopped: QuotaplaneRedisDegraded and
//     QuotaplanePolicyPublishFailing fire.
//
// QuotaplaneReconcileOverage and QuotaplaneDecisionLatencyHigh are not
// required to fire: the overage needs local-reconciled nodes admitting
// beyond the global limit, which the engine works to prevent, and the p99
// depends on the machine (it fired in one of three runs on the
// development machine, after Redis stopped and decisions waited for its
// timeouts). Their
// quantities, the recording rules they compare, must return data; the log
// lists every alert seen firing.
//
// Without prometheus and promtool on PATH (make prometheus installs them)
// it skips, and fails under CI=true.
func TestObservability(t *testing.T) {
	t.Parallel() // bounds no timing (package doc)
	if os.Getenv("QUOTAPLANE_E2E_CLUSTER") != "" {
		t.Skip("starts its own chain and stops its Redis")
	}
	if testing.Short() {
		t.Skip("about 40 s of real time")
	}
	prometheusBin, promtoolBin := tool(t, "prometheus"), tool(t, "promtool")
	root := testenv.Root()
	const ns = "obs"
	plane := ns + "/main"

	bins := build(t, "manager", "enforcer")
	env := testenv.Start(t)
	r := redistest.Start(t)
	redisEnv := []string{"QUOTAPLANE_REDIS_PASSWORD=" + r.Password}
	managerMetrics := "127.0.0.1:" + freePort(t)
	start(t, bins["manager"], redisEnv, "-kubeconfig", adminKubeconfig(t, env), "-redis-addr", r.Addr,
		"-metrics-bind-address", managerMetrics, "-health-probe-bind-address", "127.0.0.1:"+freePort(t),
		"-fleet-interval", "200ms", "-resync-interval", "1s", "-log-format", "json")

	// The samples, in mode central with a global limit the load overruns.
	ctx := context.Background()
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	objs, err := policy.ReadDir(filepath.Join(root, "config", "samples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
			qp.Spec.Global = v1alpha1.Limit{Rate: 100, Burst: 100}
			qp.Spec.Mode = v1alpha1.ModeCentral
		}
		obj := o.(client.Object)
		obj.SetNamespace(ns)
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	s, err := store.New(r.Client(), plane)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the manager publishes the plane", func() bool {
		_, err := s.Current(ctx)
		return err == nil
	})

	var nodes []*enforcerNode
	for i := range 3 {
		e := &enforcerNode{id: "obs-" + strconv.Itoa(i), api: "127.0.0.1:" + freePort(t), admin: "127.0.0.1:" + freePort(t)}
		args := []string{"-redis-addr", r.Addr, "-plane", plane, "-node-id", e.id, "-listen", e.api, "-admin-listen", e.admin,
			"-grpc-listen", "127.0.0.1:0", "-drain", "0s", "-log-format", "json"}
		if i == 2 {
			args = append(args, "-global-rps", "90") // another policy hash: a mixed fleet
		}
		start(t, bins["enforcer"], redisEnv, args...)
		nodes = append(nodes, e)
	}
	for _, e := range nodes {
		poll.Until(t, 30*time.Second, e.id+" is ready", func() bool { return e.get(t, "/readyz") == http.StatusOK })
	}

	prom := startPrometheus(t, prometheusBin, root, managerMetrics, nodes)

	// About 250 requests a second until the test ends: free tenants (the
	// global level fires first: 100 tokens/s), the named ones, and writes
	// (cost 5) that their endpoint limits deny.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent, failed atomic.Int64
	t.Cleanup(func() { close(stop); wg.Wait() })
	loadClient := &http.Client{Timeout: 2 * time.Second}
	named := []string{"acme", "globex", "initech", "whale-1", "free-trial"}
	for g := range 5 {
		wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				tenant, endpoint := fmt.Sprintf("obs-free-%d", (g*31+n)%200), "read"
				switch n % 5 {
				case 0:
					tenant = named[(g+n)%len(named)]
				case 1:
					endpoint = "write"
				}
				req, _ := http.NewRequest(http.MethodPost, "http://"+nodes[n%2].api+"/api/"+endpoint, nil)
				req.Header.Set("X-Tenant", tenant)
				req.Header.Set("X-Api-Key", tenant+"-key")
				sent.Add(1)
				resp, err := loadClient.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}

	// promtool check metrics on every /metrics body.
	for _, target := range append([]string{managerMetrics}, admins(nodes)...) {
		body := get(t, "http://"+target+"/metrics")
		cmd := exec.Command(promtoolBin, "check", "metrics")
		cmd.Stdin = strings.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool check metrics on %s: %v\n%s", target, err, out)
		}
	}

	// Every panel's query returns data.
	queries := dashboardQueries(t, filepath.Join(root, "config", "grafana", "quotaplane.json"))
	rules := ruleGroups(t, filepath.Join(root, "config", "prometheus", "quotaplane.rules.yaml"))
	pending := map[string]string{}
	for title, exprs := range queries {
		for i, expr := range exprs {
			expr = strings.NewReplacer(`$namespace`, `.*`, `$__rate_interval`, `10s`).Replace(expr)
			pending[fmt.Sprintf("panel %q query %d: %s", title, i, expr)] = expr
		}
	}
	for _, r := range rules {
		if r.Record != "" {
			pending["recording rule "+r.Record+": "+r.Expr] = r.Expr
		} else if m := comparison.FindStringSubmatch(strings.TrimSpace(r.Expr)); m != nil {
			pending["alert "+r.Alert+"'s quantity: "+m[1]] = m[1]
		} else {
			t.Errorf("alert %s: %q is not <quantity> <op> <threshold>; the test cannot check its quantity", r.Alert, r.Expr)
		}
	}
	t.Logf("%d panel queries and rule expressions to answer", len(pending))
	defer func() {
		if t.Failed() { // poll.Until's Fatalf runs this too
			for what := range pending {
				t.Errorf("no data: %s", what)
			}
		}
	}()
	poll.Until(t, 40*time.Second, fmt.Sprintf("all %d panel queries and rule expressions return data", len(pending)), every(250*time.Millisecond, func() bool {
		for what, expr := range pending {
			if n := prom.series(t, expr); n > 0 {
				delete(pending, what)
			}
		}
		return len(pending) == 0
	}))

	// The alerts this chain can cause cheaply fire.
	prom.waitFiring(t, 30*time.Second, "QuotaplaneGlobalDenials", "QuotaplaneFleetMixedPolicies")
	r.Stop()
	prom.waitFiring(t, 40*time.Second, "QuotaplaneRedisDegraded", "QuotaplanePolicyPublishFailing")
	r.Restart()
	t.Logf("load: %d requests sent, %d failed (Redis stopped for a while); alerts seen firing: %v", sent.Load(), failed.Load(), prom.fired())
}

// comparison splits an alert's expression into its quantity and its
// threshold.
var comparison = regexp.MustCompile(`^(.+?)\s*(?:>|<|==|!=|>=|<=)\s*[0-9.e+-]+$`)

// tool finds a binary of Debian's prometheus package: missing, the test
// skips, or fails under CI=true.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is missing under CI=true: run the tests through `make test`, which installs Debian's prometheus package", name)
		}
		t.Skipf("%s is missing: `make prometheus` installs it (Debian's prometheus package)", name)
	}
	return path
}

// adminKubeconfig writes a kubeconfig of a system:masters user of env for
// the manager, as an operator runs it, and returns its path.
func adminKubeconfig(t *testing.T, env *testenv.Env) string {
	t.Helper()
	admin, err := env.AddUser(envtest.User{Name: "e2e-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	config, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, config, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func admins(nodes []*enforcerNode) []string {
	var out []string
	for _, e := range nodes {
		out = append(out, e.admin)
	}
	return out
}

func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := httpClient.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d, %v", u, resp.StatusCode, err)
	}
	return string(body)
}

// dashboardQueries reads every panel's PromQL from a dashboard's JSON, by
// panel title.
func dashboardQueries(t *testing.T, path string) map[string][]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var board struct {
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &board); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	out := map[string][]string{}
	for _, p := range board.Panels {
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			out[p.Title] = append(out[p.Title], target.Expr)
		}
	}
	if len(out) < 10 {
		t.Fatalf("%s: only %d panels", path, len(out))
	}
	return out
}

type promRule struct {
	Record string `json:"record"`
	Alert  string `json:"alert"`
	Expr   string `json:"expr"`
	For    string `json:"for"`
}

func ruleGroups(t *testing.T, path string) []promRule {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []promRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []promRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// prometheusServer is a prometheus process the test started.
type prometheusServer struct {
	addr string
	mu   sync.Mutex
	seen map[string]bool // alerts seen firing
}

// startPrometheus runs prometheus on a free loopback port with a data
// directory of the test's, scraping the manager and the enforcers every
// second and evaluating the rules every second, each alert's for: set to
// 1s.
func startPrometheus(t *testing.T, bin, root, manager string, nodes []*enforcerNode) *prometheusServer {
	t.Helper()
	dir := t.TempDir()
	rules, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "quotaplane.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+for:) .*$`).ReplaceAll(rules, []byte("$1 1s"))
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	quote := func(addrs []string) string {
		q := make([]string, len(addrs))
		for i, a := range addrs {
			q[i] = strconv.Quote(a)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [rules.yaml]
scrape_configs:
- job_name: quotaplane-manager
  honor_labels: true
  static_configs: [{targets: %s}]
- job_name: quotaplane-enforcer
  static_configs: [{targets: %s}]
`, quote([]string{manager}), quote(admins(nodes)))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &prometheusServer{addr: "127.0.0.1:" + freePort(t), seen: map[string]bool{}}
	start(t, bin, nil, "--config.file", filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path", filepath.Join(dir, "data"),
		"--web.listen-address", p.addr, "--storage.tsdb.retention.time", "1h")
	poll.Until(t, 30*time.Second, "prometheus is ready", func() bool {
		resp, err := httpClient.Get("http://" + p.addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// series is how many series expr returns now.
func (p *prometheusServer) series(t *testing.T, expr string) int {
	t.Helper()
	var answer struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	p.api(t, "/api/v1/query?query="+url.QueryEscape(expr), &answer)
	if answer.Status != "success" {
		t.Fatalf("prometheus refused %s: %s", expr, answer.Error)
	}
	return len(answer.Data.Result)
}

func (p *prometheusServer) api(t *testing.T, path string, v any) {
	t.Helper()
	resp, err := httpClient.Get("http://" + p.addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	if err := json.Unmarshal(body.Bytes(), v); err != nil {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body.String())
	}
}

// waitFiring waits until every named alert is firing.
func (p *prometheusServer) waitFiring(t *testing.T, timeout time.Duration, names ...string) {
	t.Helper()
	poll.Until(t, timeout, strings.Join(names, " and ")+" fire", every(250*time.Millisecond, func() bool {
		var answer struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		p.api(t, "/api/v1/alerts", &answer)
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, a := range answer.Data.Alerts {
			if a.State == "firing" {
				p.seen[a.Labels["alertname"]] = true
			}
		}
		for _, n := range names {
			if !p.seen[n] {
				return false
			}
		}
		return true
	}))
}

// every is cond asked at most once per interval (poll.Until polls every
// millisecond; a round of Prometheus queries costs more).
func every(interval time.Duration, cond func() bool) func() bool {
	var last time.Time
	return func() bool {
		if time.Since(last) < interval {
			return false
		}
		last = time.Now()
		return cond()
	}
}

func (p *prometheusServer) fired() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for n := range p.seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
