// Package gateways puts real gateways in front of a real upstream, each
// asking a real enforcer process before every request, with the
// configurations of config/samples/gateways as they are: Caddy's
// forward_auth and nginx's auth_request. It also checks that every sample
// there parses, that Envoy's configurations are valid Envoy protos, and
// that Caddy and nginx accept theirs.
//
// Caddy and nginx come from QUOTAPLANE_CADDY and QUOTAPLANE_NGINX, else
// from PATH (`make gateways` installs nginx with apt-get and builds Caddy
// with hack/caddy.sh; `make test` passes both). Without them a test skips,
// except under CI=true, where it fails: CI must run them.
//
//	QUOTAPLANE_CADDY=$(hack/caddy.sh) go test -v ./test/gateways/
package gateways

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/testport"
)

// root is the repository's root: tests run in their package's directory.
const root = "../.."

// samples is the directory of the gateway samples; plane is the plane they
// put in front of the upstream.
var (
	samples = filepath.Join(root, "config", "samples", "gateways")
	plane   = filepath.Join(samples, "plane")
)

// The demo plane's tenants and their keys (see plane/tenants.yaml).
const (
	freeTenant = "free-trial"
	freeKey    = "ft-demo-key"
	acmeTenant = "acme"
	acmeKey    = "acme-demo-key"
	// exportPath is an export in the demo plane (cost 50; a free tenant's
	// bucket holds 100): POST only, any report.
	exportPath = "/v1/reports/7/export"
)

// startTimeout bounds how long a process may take to answer.
const startTimeout = 30 * time.Second

// gatewayBinary finds a gateway's binary: the environment variable, else
// PATH. Without one the test skips, or fails under CI=true.
func gatewayBinary(t *testing.T, env, name, how string) string {
	t.Helper()
	if bin := os.Getenv(env); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("%s=%s: %v", env, bin, err)
		}
		return bin
	}
	if bin, err := exec.LookPath(name); err == nil {
		return bin
	}
	msg := fmt.Sprintf("no %s: set %s or put it on PATH (%s)", name, env, how)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI must run the gateway tests")
	}
	t.Skip(msg)
	return ""
}

func caddyBinary(t *testing.T) string {
	return gatewayBinary(t, "QUOTAPLANE_CADDY", "caddy", "make gateways, or hack/caddy.sh, builds it")
}

func nginxBinary(t *testing.T) string {
	return gatewayBinary(t, "QUOTAPLANE_NGINX", "nginx", "make gateways installs it with apt-get")
}

// enforcerBin builds cmd/enforcer once for the package's tests.
var enforcerBin = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "quotaplane-gateways-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "enforcer")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/enforcer")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/enforcer: %v\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := enforcerBin(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// startEnforcer runs an enforcer process on the demo plane, its API, admin
// and gRPC listeners on free loopback ports, and returns its API's address
// once it is ready.
func startEnforcer(t *testing.T) string {
	t.Helper()
	bin, err := enforcerBin()
	if err != nil {
		t.Fatal(err)
	}
	api, admin := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	start(t, "enforcer", bin, nil, "-policy", plane, "-listen", api, "-admin-listen", admin, "-grpc-listen", "", "-drain", "0s")
	poll.Until(t, startTimeout, "the enforcer's /readyz", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return api
}

// upstream is the API the gateways protect: it counts what reaches it.
type upstream struct {
	*httptest.Server
	requests atomic.Int64
}

func startUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.requests.Add(1)
		fmt.Fprintf(w, "upstream: %s %s\n", r.Method, r.URL)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) addr() string { return strings.TrimPrefix(u.URL, "http://") }

// client is a client of a gateway.
type client struct {
	t    *testing.T
	base string
}

type answer struct {
	status int
	header http.Header
	body   string
}

func (c client) do(method, path, tenant, key string, extra ...string) answer {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, string(body)}
}

// checkGateway is what every gateway must do with the demo plane in
// front of u: allowed requests reach the upstream with the limits in
// force on the answer; a free tenant's exports pass until its quota is
// used up, then a 429 with quotaplane's Retry-After, X-Quota-Level,
// X-Quota-Reason and RateLimit, also when the client sends forwarded
// header fields of its own to pass as a cheaper request; a key that is not
// the tenant's and a
// request without a tenant are refused (refusal is that status: 400 or
// 403); the upstream never sees a request that was not allowed.
func checkGateway(t *testing.T, c client, u *upstream, refusal int) {
	t.Helper()
	var allowed int64
	ok := c.do("GET", "/v1/things?page=2", acmeTenant, acmeKey)
	if ok.status != http.StatusOK || !strings.HasPrefix(ok.body, "upstream: GET /v1/things?page=2") {
		t.Fatalf("an allowed read: %d %q; want 200 from the upstream", ok.status, ok.body)
	}
	allowed++
	// acme's key, standard tier: a read (the catch-all) costs 1 of its 400.
	if got := ok.header.Get("RateLimit"); got != `"key";r=399;t=1` {
		t.Errorf("RateLimit on an allowed read %q; want quotaplane's, the key's 399 left", got)
	}
	if got := ok.header.Get("RateLimit-Policy"); !strings.Contains(got, `"tenant";q=500;w=1`) {
		t.Errorf("RateLimit-Policy on an allowed read %q; want the standard tier's limits", got)
	}

	// Exports until one is denied: two fit the free tier's bucket; a slow
	// machine may see a third after a refill, but the sliding window on
	// exports (2 in 5 minutes) denies the next one then.
	var denied answer
	for i := 0; ; i++ {
		if i == 4 {
			t.Fatalf("%d exports allowed; want a 429 by the fourth", allowed-1)
		}
		a := c.do("POST", exportPath, freeTenant, freeKey)
		if a.status == http.StatusOK {
			allowed++
			continue
		}
		denied = a
		break
	}
	if allowed < 3 { // the read and at least one export
		t.Errorf("the first export was not allowed: %d %q", denied.status, denied.body)
	}
	if denied.status != http.StatusTooManyRequests {
		t.Fatalf("a used-up export: %d %v %q; want 429", denied.status, denied.header, denied.body)
	}
	if s, err := strconv.Atoi(denied.header.Get("Retry-After")); err != nil || s < 1 || s > 300 {
		t.Errorf("Retry-After %q; want 1 to 300 seconds", denied.header.Get("Retry-After"))
	}
	level := denied.header.Get("X-Quota-Level")
	if level != "tenant" && level != "endpoint" {
		t.Errorf("X-Quota-Level %q; want tenant or endpoint", level)
	}
	if reason := denied.header.Get("X-Quota-Reason"); !strings.Contains(reason, "is used up") || !strings.Contains(denied.body, reason) {
		t.Errorf("X-Quota-Reason %q, body %q; want quotaplane's reason in both", reason, denied.body)
	}
	if got := denied.header.Get("RateLimit"); !strings.HasPrefix(got, `"`+level+`";r=0;t=`) {
		t.Errorf("RateLimit on the 429 %q; want the %s level, nothing left", got, level)
	}
	if got := denied.header.Get("RateLimit-Policy"); !strings.Contains(got, `"endpoint";q=100;w=300`) {
		t.Errorf("RateLimit-Policy on the 429 %q; want the free tier's export window", got)
	}

	// A client that sends its own X-Forwarded-Method and X-Forwarded-Uri,
	// to pass its export off as a read (cost 1), is not believed: the
	// gateway sets both from the request.
	forged := c.do("POST", exportPath, freeTenant, freeKey, "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/v1/things")
	if forged.status != http.StatusTooManyRequests {
		t.Errorf("an export claiming to be a read: %d %q; want the export's 429", forged.status, forged.body)
	}

	// Refusals: another tenant's key (the plane binds keys to tenants), no
	// tenant at all.
	wrongKey := c.do("GET", "/v1/things", acmeTenant, freeKey)
	if wrongKey.status != http.StatusForbidden || wrongKey.header.Get("X-Quota-Level") != "key" ||
		wrongKey.header.Get("Retry-After") != "" || !strings.Contains(wrongKey.header.Get("X-Quota-Reason"), "not a key of tenant") {
		t.Errorf("another tenant's key: %d %v %q; want 403, X-Quota-Level key, a reason, no Retry-After", wrongKey.status, wrongKey.header, wrongKey.body)
	}
	noTenant := c.do("GET", "/v1/things", "", acmeKey)
	if noTenant.status != refusal || !strings.Contains(noTenant.header.Get("X-Quota-Reason"), "missing X-Tenant") {
		t.Errorf("no tenant: %d %v %q; want %d saying X-Tenant is missing", noTenant.status, noTenant.header, noTenant.body, refusal)
	}
	if got := u.requests.Load(); got != allowed {
		t.Errorf("the upstream saw %d requests; want the %d allowed ones", got, allowed)
	}
}

func TestCaddyForwardAuth(t *testing.T) {
	caddy := caddyBinary(t)
	api := startEnforcer(t)
	u := startUpstream(t)
	port := freePort(t)
	home := t.TempDir()
	start(t, "caddy", caddy, []string{
		"GATEWAY_PORT=" + port, "GATEWAY_BIND=127.0.0.1", "GATEWAY_FORWARD_AUTH=" + api, "GATEWAY_UPSTREAM=" + u.addr(),
		// Caddy's own state, here rather than in the user's home.
		"HOME=" + home, "XDG_DATA_HOME=" + home, "XDG_CONFIG_HOME=" + home,
	}, "run", "--config", filepath.Join(samples, "Caddyfile"), "--adapter", "caddyfile")
	c := client{t, "http://127.0.0.1:" + port}
	waitListening(t, "caddy", "127.0.0.1:"+port)
	checkGateway(t, c, u, http.StatusBadRequest)
}

func TestNginxAuthRequest(t *testing.T) {
	nginx := nginxBinary(t)
	api := startEnforcer(t)
	u := startUpstream(t)
	port := freePort(t)
	dir := t.TempDir()
	conf := nginxConf(t, dir, map[string]string{
		"server 127.0.0.1:8080;": "server " + api + ";",
		"server 127.0.0.1:9000;": "server " + u.addr() + ";",
		"listen 127.0.0.1:8000;": "listen 127.0.0.1:" + port + ";",
	})
	start(t, "nginx", nginx, nil, "-p", dir, "-c", conf, "-e", filepath.Join(dir, "error.log"), "-g", "daemon off;")
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("nginx error.log:\n%s", log)
		}
	})
	waitListening(t, "nginx", "127.0.0.1:"+port)
	// auth_request passes only 403 on: a malformed request is a 403 too.
	checkGateway(t, client{t, "http://127.0.0.1:" + port}, u, http.StatusForbidden)
}

// nginxConf writes the sample nginx.conf into dir with each of the
// addresses in replace (each exactly once in the sample) replaced, and
// returns its path.
func nginxConf(t *testing.T, dir string, replace map[string]string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(samples, "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf := string(data)
	for from, to := range replace {
		if n := strings.Count(conf, from); n != 1 {
			t.Fatalf("the sample nginx.conf has %q %d times; the test replaces it once", from, n)
		}
		conf = strings.Replace(conf, from, to, 1)
	}
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// process is a started binary whose output is kept, and shown when the
// test fails.
type process struct {
	mu  sync.Mutex
	out bytes.Buffer
}

func (p *process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

// start runs bin with args and extra environment, stopped (SIGTERM, then
// SIGKILL after 10 s) when the test ends; the test fails if it exits
// before.
func start(t *testing.T, name, bin string, env []string, args ...string) {
	t.Helper()
	p := &process{}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = p, p
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var stopping atomic.Bool
	go func() {
		err := cmd.Wait()
		if !stopping.Load() {
			t.Errorf("%s exited early: %v", name, err)
		}
		close(exited)
	}()
	t.Cleanup(func() {
		stopping.Store(true)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			p.mu.Lock()
			t.Logf("%s output:\n%s", name, p.out.String())
			p.mu.Unlock()
		}
	})
}

func freePort(t *testing.T) string { return strconv.Itoa(testport.Free(t)) }

// waitListening waits until something accepts connections at addr.
func waitListening(t *testing.T, what, addr string) {
	t.Helper()
	poll.Until(t, startTimeout, what+" listening on "+addr, func() bool {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		conn.Close()
		return true
	})
}
