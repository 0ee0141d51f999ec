// Package e2e runs the whole chain: a real API server, the real manager, a
// real Redis and real enforcers, driven over HTTP and the Kubernetes API.
//
// By default it starts all of it on this machine: envtest's kube-apiserver
// and etcd, the manager binary, a Redis with a password, and two enforcer
// processes. With QUOTAPLANE_E2E_CLUSTER=1 it runs the same checks against
// a cluster where quotaplane is installed (hack/kind-e2e.sh sets this up on
// kind):
//
//	KUBECONFIG                    the cluster (default: ~/.kube/config)
//	QUOTAPLANE_E2E_NAMESPACE      where the samples go (default quotaplane-system)
//	QUOTAPLANE_E2E_REDIS          host:port of the cluster's Redis (a port-forward)
//	QUOTAPLANE_REDIS_PASSWORD     its password, if it has one
//	QUOTAPLANE_E2E_ENFORCERS      every enforcer pod as name=API-host:port/admin-host:port, comma-separated (port-forwards)
//
// The tests whose bounds are timings (failover_test.go's, a leader's
// takeover among them, toxiproxy_test.go's, outage_test.go's) run one at a
// time, first; the others (the chain, observability, trust, the upstream,
// the soak) then run two at a time (go test's -parallel, the cores): each
// starts its own API server, Redis and processes on ports of its own, and
// together they take about as long as the soak alone.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	kubeconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/controllers"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
	"github.com/quotaplane/quotaplane/pkg/testport"
)

const (
	password = "e2e-redis-password-must-not-be-logged"
	// edits is how many limit edits the propagation measurement makes.
	edits = 100
)

// chain is the system under test, however it was started.
type chain struct {
	client    client.Client
	namespace string
	store     *store.Store // the plane's policy store in the chain's Redis
	enforcers []*enforcerNode
	// processes are the ones this test started; their output must never
	// hold the Redis password.
	processes []*process
}

func TestEndToEnd(t *testing.T) {
	t.Parallel() // bounds no timing (package doc)
	var c *chain
	if os.Getenv("QUOTAPLANE_E2E_CLUSTER") != "" {
		c = clusterChain(t)
	} else {
		c = localChain(t)
	}
	c.run(t)
}

// localChain starts the whole chain on this machine.
func localChain(t *testing.T) *chain {
	const ns = "e2e"
	plane := ns + "/main" // the QuotaPlane of config/samples
	bins := build(t, "manager", "enforcer")
	env := testenv.Start(t)
	r := redistest.Start(t, "--requirepass", password)

	// The manager, as an operator runs it: its own kubeconfig, leader
	// election on, the Redis password from the environment.
	configPath := adminKubeconfig(t, env)
	redisEnv := "QUOTAPLANE_REDIS_PASSWORD=" + password
	c := &chain{client: env.Client, namespace: ns}
	c.processes = append(c.processes, start(t, bins["manager"], []string{redisEnv},
		"-kubeconfig", configPath, "-redis-addr", r.Addr,
		"-leader-elect", "-leader-election-namespace", "default",
		"-metrics-bind-address", "0", "-health-probe-bind-address", "127.0.0.1:"+freePort(t),
		"-fleet-interval", "200ms"))

	// Two enforcers following the plane in the policy store.
	for i := range 2 {
		e := &enforcerNode{id: "e2e-enforcer-" + strconv.Itoa(i), api: "127.0.0.1:" + freePort(t), admin: "127.0.0.1:" + freePort(t)}
		c.processes = append(c.processes, start(t, bins["enforcer"], []string{redisEnv},
			"-redis-addr", r.Addr, "-plane", plane, "-node-id", e.id, "-listen", e.api, "-admin-listen", e.admin, "-grpc-listen", "127.0.0.1:0", "-drain", "0s"))
		c.enforcers = append(c.enforcers, e)
	}
	if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	var err error
	if c.store, err = store.New(r.Client(), plane); err != nil {
		t.Fatal(err)
	}
	return c
}

// clusterChain reaches a chain installed in a cluster (see the package doc).
func clusterChain(t *testing.T) *chain {
	need := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			t.Fatalf("QUOTAPLANE_E2E_CLUSTER is set but %s is not (see the package doc)", name)
		}
		return v
	}
	ns := os.Getenv("QUOTAPLANE_E2E_NAMESPACE")
	if ns == "" {
		ns = "quotaplane-system"
	}
	cfg, err := kubeconfig.GetConfig()
	if err != nil {
		t.Fatalf("the cluster: %v", err)
	}
	kc, err := client.New(cfg, client.Options{Scheme: controllers.NewScheme()})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: need("QUOTAPLANE_E2E_REDIS"), Password: os.Getenv("QUOTAPLANE_REDIS_PASSWORD"), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	c := &chain{client: kc, namespace: ns}
	if c.store, err = store.New(rdb, ns+"/main"); err != nil {
		t.Fatal(err)
	}
	for _, spec := range strings.Split(need("QUOTAPLANE_E2E_ENFORCERS"), ",") {
		id, addrs, ok1 := strings.Cut(spec, "=")
		api, admin, ok2 := strings.Cut(addrs, "/")
		if !ok1 || !ok2 {
			t.Fatalf("QUOTAPLANE_E2E_ENFORCERS: %q is not name=API-host:port/admin-host:port", spec)
		}
		c.enforcers = append(c.enforcers, &enforcerNode{id: id, api: api, admin: admin})
	}
	return c
}

// apply creates obj, or makes an existing one what obj says (a chain that
// ran before holds the samples, edited).
func (c *chain) apply(t *testing.T, obj client.Object) {
	t.Helper()
	ctx := context.Background()
	err := c.client.Create(ctx, obj)
	if apierrors.IsAlreadyExists(err) {
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			existing := obj.DeepCopyObject().(client.Object)
			if err := c.client.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
				return err
			}
			obj.SetResourceVersion(existing.GetResourceVersion())
			return c.client.Update(ctx, obj)
		})
	}
	if err != nil {
		t.Fatalf("apply %T %s: %v", obj, obj.GetName(), err)
	}
}

// run applies the samples and checks the chain.
func (c *chain) run(t *testing.T) {
	ctx := context.Background()
	n := len(c.enforcers)
	objs, err := policy.ReadDir(filepath.Join(testenv.Root(), "config", "samples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		obj := o.(client.Object)
		obj.SetNamespace(c.namespace)
		c.apply(t, obj.DeepCopyObject().(client.Object))
	}
	want, _ := policy.Compile(objs)
	poll.Until(t, 60*time.Second, fmt.Sprintf("all %d enforcers run the compiled samples", n), func() bool {
		p, err := c.store.Current(ctx)
		return err == nil && p.Hash() == want.Hash() && reportedAtLeast(ctx, t, c.store, p.Version()) >= n
	})
	for _, e := range c.enforcers {
		poll.Until(t, 10*time.Second, e.id+" is ready", func() bool { return e.get(t, "/readyz") == http.StatusOK })
	}

	// 200s, and 429s that name the limit that fired, on every enforcer.
	// Tenants the samples do not name are free tenants, fresh in every run.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	for i, e := range c.enforcers {
		fresh := func(role string) string { return "e2e-" + role + "-" + run + "-" + strconv.Itoa(i) }
		// Free tenants: 50 tokens/s with a burst of 100.
		expect(t, e.decide(t, "read", fresh("reader"), "", 100), http.StatusOK, "")
		expect(t, e.decide(t, "read", fresh("reader"), "", 1), http.StatusTooManyRequests, "tenant")
		// acme-partner is an api key of acme limited to 10/s, burst 20; it
		// refills within 2 s, before a later run.
		expect(t, e.decide(t, "read", "acme", "acme-partner", 20), http.StatusOK, "")
		expect(t, e.decide(t, "read", "acme", "acme-partner", 1), http.StatusTooManyRequests, "key")
		expect(t, e.decide(t, "read", "acme", "acme-batch", 1), http.StatusOK, "")
		// Free tenants write at most 50 tokens at once (10 writes of cost 5).
		for range 10 {
			expect(t, e.decide(t, "write", fresh("writer"), "", 1), http.StatusOK, "")
		}
		expect(t, e.decide(t, "write", fresh("writer"), "", 1), http.StatusTooManyRequests, "endpoint")
	}

	// Edit a limit with the API client, again and again, and time each
	// edit until every enforcer reports the version that holds it.
	tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: "globex"}}
	var took []time.Duration
	for i := range edits {
		took = append(took, c.edit(t, tq, &v1alpha1.Limit{Rate: int64(600 + i), Burst: 1200}))
	}
	slices.Sort(took)
	p50, p99 := took[len(took)/2], took[(len(took)*99+99)/100-1]
	t.Logf("edit → all %d enforcers report the new version, %d edits: p50 %s, p99 %s, max %s (target p99 ≤ 1s)",
		n, edits, p50.Round(time.Millisecond), p99.Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	if p99 > time.Second {
		t.Errorf("p99 %s from an edit to every enforcer running it; the target is 1s", p99)
	}

	// The new limit is enforced: 5 tokens that do not refill this hour.
	c.edit(t, tq, &v1alpha1.Limit{Rate: 1, Burst: 5, Period: &metav1.Duration{Duration: time.Hour}})
	for _, e := range c.enforcers {
		admitted := 0
		for range 8 {
			switch a := e.decide(t, "read", "globex", "", 1); {
			case a.code == http.StatusOK:
				admitted++
			case a.code != http.StatusTooManyRequests || a.level != "tenant":
				t.Fatalf("%s: globex got %d (level %q); want 200 or a tenant-level 429", e.id, a.code, a.level)
			}
		}
		if admitted != 5 {
			t.Errorf("%s admitted %d of 8 requests under the new 5-token limit", e.id, admitted)
		}
		if debug := e.body(t, "/quota/debug?tenant=globex"); !strings.Contains(debug, `"limit":"1 per 1h0m0s (burst 5)"`) {
			t.Errorf("%s: /quota/debug does not show the new limit: %s", e.id, debug)
		}
	}

	// The QuotaPlane's status counts the enforcers that run its version.
	qp := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: "main"}}
	poll.Until(t, 10*time.Second, fmt.Sprintf("the QuotaPlane shows %d enforcers ready", n), func() bool {
		if err := c.client.Get(ctx, client.ObjectKeyFromObject(qp), qp); err != nil {
			t.Fatal(err)
		}
		p, err := c.store.Current(ctx)
		return err == nil && qp.Status.PublishedVersion == p.Version() && qp.Status.EnforcersReady >= int32(n)
	})

	// No process ever printed the Redis password.
	if len(c.processes) == 0 {
		t.Log("the chain runs elsewhere: its logs are not checked for the Redis password")
	}
	for _, proc := range c.processes {
		if strings.Contains(proc.output(), password) {
			t.Errorf("%s logged the Redis password", proc.name)
		}
	}
}

// reportedAtLeast counts the enforcers whose report names version or later.
func reportedAtLeast(ctx context.Context, t *testing.T, s *store.Store, version int64) int {
	reports, err := s.Enforcers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range reports {
		if r.PolicyVersion >= version {
			n++
		}
	}
	return n
}

// edit sets a TenantQuota's limit with the API client (again on conflicts:
// the manager writes its status meanwhile) and returns how long it took
// until every enforcer reported the version after the one in force.
func (c *chain) edit(t *testing.T, tq *v1alpha1.TenantQuota, limit *v1alpha1.Limit) time.Duration {
	t.Helper()
	ctx := context.Background()
	before, err := c.store.Current(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.client.Get(ctx, client.ObjectKeyFromObject(tq), tq); err != nil {
			return err
		}
		tq.Spec.Limit = limit
		return c.client.Update(ctx, tq)
	})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "every enforcer reports the edit", func() bool {
		return reportedAtLeast(ctx, t, c.store, before.Version()+1) >= len(c.enforcers)
	})
	return time.Since(start)
}

// enforcerNode is one enforcer's API and admin addresses (host:port).
type enforcerNode struct {
	id, api, admin string
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// decide asks for a decision.
func (e *enforcerNode) decide(t *testing.T, endpoint, tenant, key string, units int) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.api+"/api/"+endpoint, nil)
	req.Header.Set("X-Tenant", tenant)
	if key == "" {
		key = "e2e-key"
	}
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("X-Quota-Units", strconv.Itoa(units))
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", e.id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests && (resp.Header.Get("Retry-After") == "" || resp.Header.Get("RateLimit") == "") {
		t.Errorf("%s: a 429 without Retry-After or RateLimit: %v", e.id, resp.Header)
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("X-Quota-Level"), strings.TrimSpace(body.String())}
}

func (e *enforcerNode) get(t *testing.T, path string) int {
	resp, err := httpClient.Get("http://" + e.admin + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (e *enforcerNode) body(t *testing.T, path string) string {
	resp, err := httpClient.Get("http://" + e.admin + path)
	if err != nil {
		t.Fatalf("%s: %v", e.id, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return b.String()
}

// answer is a decision as the client sees it.
type answer struct {
	code  int
	level string // X-Quota-Level
	body  string
}

func expect(t *testing.T, got answer, code int, level string) {
	t.Helper()
	if got.code != code || got.level != level {
		t.Fatalf("got %d (level %q): %s; want %d (level %q)", got.code, got.level, got.body, code, level)
	}
}

// build builds the named commands into a temporary directory.
func build(t *testing.T, names ...string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	bins := map[string]string{}
	for _, name := range names {
		bins[name] = filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-o", bins[name], "./cmd/"+name)
		cmd.Dir = testenv.Root()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/%s: %v\n%s", name, err, out)
		}
	}
	return bins
}

// process is a started binary whose output is kept, and shown when the
// test fails.
type process struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{} // closed once it exited (cmd.ProcessState is then set)
	mu     sync.Mutex
	out    bytes.Buffer
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

// start runs bin with args and extra environment, stopped (SIGTERM, then
// SIGKILL after 10 s) when the test ends.
func start(t *testing.T, bin string, env []string, args ...string) *process {
	t.Helper()
	p := &process{name: filepath.Base(bin), exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
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
			t.Logf("%s output:\n%s", p.name, p.output())
		}
	})
	return p
}

// createSamples creates namespace ns and the sample plane's objects in it
// (config/samples) on the API server, and returns them (namespaced).
func createSamples(t *testing.T, c client.Client, ns string) []runtime.Object {
	t.Helper()
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	objs, err := policy.ReadDir(filepath.Join(testenv.Root(), "config", "samples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		obj := o.(client.Object)
		obj.SetNamespace(ns)
		if err := c.Create(ctx, obj.DeepCopyObject().(client.Object)); err != nil {
			t.Fatal(err)
		}
	}
	return objs
}

func freePort(t *testing.T) string { return strconv.Itoa(testport.Free(t)) }
