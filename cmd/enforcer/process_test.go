package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaplane/quotaplane/pkg/testport"
)

// The enforcer binary, built once for the package's tests.
var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "enforcer-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "enforcer")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func enforcerBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/enforcer: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// process is a running enforcer on loopback ports.
type process struct {
	t                            *testing.T
	cmd                          *exec.Cmd
	exited                       chan struct{}
	apiAddr, adminAddr, grpcAddr string

	mu  sync.Mutex
	out bytes.Buffer
}

func (p *process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *process) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// startEnforcer runs the enforcer on the plane in dir with extra flags,
// and waits until its admin listener says it is ready. It is stopped
// (SIGTERM, then SIGKILL after 10 s) when the test ends.
func startEnforcer(t *testing.T, dir string, extra ...string) *process {
	t.Helper()
	return startEnforcerEnv(t, dir, nil, extra...)
}

// startEnforcerEnv is startEnforcer with QUOTAPLANE_* variables in env.
func startEnforcerEnv(t *testing.T, dir string, env []string, extra ...string) *process {
	t.Helper()
	p := &process{t: t, exited: make(chan struct{}), apiAddr: freeAddr(t), adminAddr: freeAddr(t), grpcAddr: freeAddr(t)}
	// No drain unless a test asks: the cleanup's SIGTERM stops at once.
	args := []string{"-listen", p.apiAddr, "-admin-listen", p.adminAddr, "-grpc-listen", p.grpcAddr, "-drain", "0s"}
	if dir != "" {
		args = append(args, "-policy", dir, "-reload-interval", "1h")
	}
	for i := range extra {
		if extra[i] == "-admin-listen" && i+1 < len(extra) { // reach it on loopback, whatever it binds
			_, port, _ := net.SplitHostPort(extra[i+1])
			p.adminAddr = "127.0.0.1:" + port
		}
	}
	p.cmd = exec.Command(enforcerBinary(t), append(args, extra...)...)
	p.cmd.Env = append(cleanEnv(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("enforcer output:\n%s", p.output())
		}
	})
	if dir != "" {
		p.waitFor("its admin listener says ready", func() bool {
			resp, err := http.Get("http://" + p.adminAddr + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	return p
}

// runEnforcer runs the enforcer with args until it exits (at most 30 s)
// and returns its output.
func runEnforcer(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, enforcerBinary(t), args...)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// cleanEnv is the test's environment without QUOTAPLANE_* variables, so
// that the flags alone configure the enforcer.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "QUOTAPLANE_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitFor polls cond every 10 ms for up to 30 s, failing early when the
// process exits.
func (p *process) waitFor(what string, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-p.exited:
			p.t.Fatalf("the enforcer exited while waiting until %s:\n%s", what, p.output())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("after 30 s, still waiting until %s", what)
		}
	}
}

func freeAddr(t *testing.T) string {
	return "127.0.0.1:" + strconv.Itoa(testport.Free(t))
}

// dial connects to the process's gRPC listener (plain text unless opts
// say otherwise).
func (p *process) dial(opts ...grpc.DialOption) *grpc.ClientConn {
	p.t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(p.grpcAddr, opts...)
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { conn.Close() })
	return conn
}

// waitServing waits until gRPC health says SERVING over conn.
func (p *process) waitServing(conn *grpc.ClientConn) {
	p.t.Helper()
	client := healthpb.NewHealthClient(conn)
	p.waitFor("gRPC health is SERVING", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
	})
}

// limitState is one limit of GET /quota/debug.
type limitState struct {
	Level     string `json:"level"`
	Name      string `json:"name"`
	Remaining int64  `json:"remaining"`
}

// remaining reads the tokens left of tenant's limits from the admin
// listener's debug view, by "level" or "level/name" (a key's or an
// endpoint's); ok is false when the enforcer has no state for the tenant.
func (p *process) remaining(tenant string) (map[string]int64, bool) {
	p.t.Helper()
	resp, err := http.Get("http://" + p.adminAddr + "/quota/debug?tenant=" + tenant)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, false
	}
	var view struct {
		Limits []limitState `json:"limits"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&view); err != nil || resp.StatusCode != http.StatusOK {
		p.t.Fatalf("debug of %s: %d %v", tenant, resp.StatusCode, err)
	}
	m := map[string]int64{}
	for _, l := range view.Limits {
		name := l.Level
		if l.Name != "" {
			name += "/" + l.Name
		}
		m[name] = l.Remaining
	}
	return m, true
}

// planeYAML is a plane whose limits do not refill during a test (rates per
// hour or day): global 1,000 an hour; tenants of the tier basic 100 a day,
// each key 50 an hour; endpoint read (cost 1, /v1/read...) and write (cost
// 5, POST /v1/items, 10 per 5 minutes per tenant); tenant acme's key
// k-small 3 an hour; tenant whale 100,000 a day. spec is added to the
// QuotaPlane's spec, docs to the file.
func planeYAML(spec, docs string) string {
	return `apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata:
  name: gw
spec:
  global: {rate: 1000, burst: 1000, period: 1h}
  mode: local
  fairness: none
  defaultTier: basic
  tiers:
    - name: basic
      weight: 1
      tenant: {rate: 100, burst: 100, period: 24h}
      key: {rate: 50, burst: 50, period: 1h}
` + spec + `
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata:
  name: read
spec:
  endpoint: read
  match:
    - path: {type: PathPrefix, value: /v1/read}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata:
  name: write
spec:
  endpoint: write
  cost: 5
  limit: {rate: 10, burst: 10, period: 5m}
  match:
    - path: {type: Exact, value: /v1/items}
      methods: [POST]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata:
  name: acme
spec:
  tenant: acme
  tier: basic
  keys:
    - key: k-small
      limit: {rate: 3, burst: 3, period: 1h}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata:
  name: whale
spec:
  tenant: whale
  tier: basic
  limit: {rate: 100000, burst: 100000, period: 24h}
` + docs
}

// writePlane writes a plane into a new directory and returns it.
func writePlane(t *testing.T, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "plane.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// desc is a descriptor of key=value entries.
func desc(pairs ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, pair := range pairs {
		k, v, _ := strings.Cut(pair, "=")
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

// withHits sets a descriptor's own hits_addend.
func withHits(d *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}

// rls calls ShouldRateLimit in domain gw with request-level hits.
func rls(t *testing.T, client rlsv3.RateLimitServiceClient, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "gw", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// headers turns response_headers_to_add into a map (each name once).
func headers(t *testing.T, resp *rlsv3.RateLimitResponse) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		if _, twice := m[h.Key]; twice {
			t.Fatalf("header %s added twice", h.Key)
		}
		m[h.Key] = h.Value
	}
	return m
}

// httpsClient is an HTTP client trusting roots, presenting certs.
func httpsClient(roots *tls.Config) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: roots}}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
