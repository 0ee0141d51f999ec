package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/controllers"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// upstreamSpeed is how much faster than real time the manager's upstream
// leaders run in TestUpstreamOutageEndToEnd: probe intervals, windows and
// the 30 s / 10 s cycles, all on one clock.
const upstreamSpeed = 10

// TestUpstreamOutageEndToEnd runs seed 004's pipeline across the chain: the
// sample Upstream, given a probe, is applied with the API client; the
// manager probes a fake upstream that starts failing; its plan suspends
// the free tier; and both enforcers answer the same free tenant 503 with
// X-Outage-Mode, within one reconcile interval of each other.
//
// The manager runs in this process, its upstream leaders on a clock ten
// times faster than real time (controllers.UpstreamOptions.Clock), so the
// outage takes seconds, not the minute and more of real cycles (30 s until
// the first cycle with probes, 30 s to Degraded, 10 s to Phase1). The
// enforcers are the real binary on real time: the plan is what they share
// with the manager, published at Redis TIME.
func TestUpstreamOutageEndToEnd(t *testing.T) {
	t.Parallel() // bounds no timing (package doc)
	if os.Getenv("QUOTAPLANE_E2E_CLUSTER") != "" {
		t.Skip("the fake upstream and the manager's fast clock live in this process; a cluster's manager cannot reach them")
	}
	const ns = "e2e-upstream"
	plane := ns + "/main"
	ctx := context.Background()
	bins := build(t, "enforcer")
	env := testenv.Start(t)
	r := redistest.Start(t)

	// The fake upstream: 200 until told to fail.
	var status atomic.Int32
	status.Store(http.StatusOK)
	var probes atomic.Int64
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		probes.Add(1)
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(fake.Close)

	// The manager, with leader election: the upstream leaders run on the
	// elected one.
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                        controllers.NewScheme(),
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionID:              "quotaplane-e2e-upstream",
		LeaderElectionNamespace:       "default",
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	epoch := time.Now()
	clock := func() time.Time { return epoch.Add(time.Since(epoch) * upstreamSpeed) }
	err = controllers.Setup(mgr, controllers.Options{Redis: r.Client(), FleetInterval: 200 * time.Millisecond, Registerer: prometheus.NewRegistry(),
		Upstream: controllers.UpstreamOptions{Interval: 200 * time.Millisecond, Tick: 20 * time.Millisecond, Clock: clock}})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("the manager: %v", err)
		}
	})

	// Two enforcers following the plane, as in TestEndToEnd.
	var enforcers []*enforcerNode
	for i := range 2 {
		e := &enforcerNode{id: "e2e-upstream-enforcer-" + strconv.Itoa(i), api: "127.0.0.1:" + freePort(t), admin: "127.0.0.1:" + freePort(t)}
		start(t, bins["enforcer"], nil, "-redis-addr", r.Addr, "-plane", plane, "-node-id", e.id, "-listen", e.api, "-admin-listen", e.admin, "-grpc-listen", "127.0.0.1:0", "-drain", "0s")
		enforcers = append(enforcers, e)
	}

	// The sample plane, published and run by both enforcers.
	objs := createSamples(t, env.Client, ns)
	want, _ := policy.Compile(objs)
	s, err := store.New(r.Client(), plane)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, "both enforcers run the compiled samples", func() bool {
		p, err := s.Current(ctx)
		return err == nil && p.Hash() == want.Hash() && reportedAtLeast(ctx, t, s, p.Version()) >= len(enforcers)
	})
	for _, e := range enforcers {
		poll.Until(t, 10*time.Second, e.id+" is ready", func() bool { return e.get(t, "/readyz") == http.StatusOK })
	}
	interval := want.Spec().ReconcileInterval

	// The sample Upstream (llm, under export), applied with a probe of the
	// fake upstream. Latency stays out of its confidence: the fast clock
	// makes every latency ten times longer.
	ups, err := policy.ReadDir(filepath.Join(testenv.Root(), "config", "samples", "upstream"))
	if err != nil || len(ups) != 1 {
		t.Fatalf("the sample Upstream: %d objects, %v", len(ups), err)
	}
	llm := ups[0].(*v1alpha1.Upstream)
	llm.Namespace = ns
	llm.Spec.Probe = &v1alpha1.UpstreamProbe{URL: fake.URL + "/v1/models", Interval: &metav1.Duration{Duration: time.Second},
		Timeout: &metav1.Duration{Duration: 500 * time.Millisecond}, ExpectedStatuses: []int32{200}}
	llm.Spec.LatencyCeiling = &metav1.Duration{Duration: 10 * time.Minute}
	if err := env.Client.Create(ctx, llm); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the manager probes llm and finds it healthy", func() bool {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(llm), llm); err != nil {
			t.Fatal(err)
		}
		return llm.Status.Phase == v1alpha1.PhaseHealthy && llm.Status.LastProbeTime != nil && llm.Status.LastProbeError == ""
	})
	if probes.Load() == 0 {
		t.Fatal("llm is healthy by its probe, but the fake upstream was never called")
	}
	for _, e := range enforcers {
		if a := e.export(t, "free-trial"); a.outage || a.code == http.StatusServiceUnavailable {
			t.Fatalf("%s: free-trial on export while llm is healthy: %d with X-Outage-Mode; want no gate", e.id, a.code)
		}
	}

	// The upstream fails. Every enforcer is asked every 5 ms, each by its
	// own goroutine, until it suspends the free tenant.
	status.Store(http.StatusServiceUnavailable)
	failed := time.Now()
	suspended := make([]time.Time, len(enforcers))
	var wg sync.WaitGroup
	for i, e := range enforcers {
		wg.Go(func() {
			// Not poll.Until: this goroutine must not end the test.
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) {
				// While llm is Degraded the free tier is still low, and
				// throttled (429, X-Outage-Mode); suspended, it gets 503.
				if a := e.export(t, "free-trial"); a.outage && a.code == http.StatusServiceUnavailable {
					suspended[i] = time.Now()
					if a.tier != "suspended" || a.retryAfter == "" {
						t.Errorf("%s: free-trial suspended: X-Tier %q, Retry-After %q; want suspended and a Retry-After", e.id, a.tier, a.retryAfter)
					}
					return
				}
				<-tick.C
			}
		})
	}
	wg.Wait()
	for i, at := range suspended {
		if at.IsZero() {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(llm), llm); err != nil {
				t.Fatal(err)
			}
			t.Fatalf("%s never answered free-trial 503 with X-Outage-Mode within 30s (llm: phase %s, confidence %s, %+v)", enforcers[i].id, llm.Status.Phase, llm.Status.Confidence, llm.Status.Conditions)
		}
	}
	gap := suspended[0].Sub(suspended[1]).Abs()
	t.Logf("the fake upstream failed; %s later %s answered 503 with X-Outage-Mode, %s later %s too (reconcile interval %s)",
		suspended[0].Sub(failed).Round(time.Millisecond), enforcers[0].id, gap.Round(time.Millisecond), enforcers[1].id, interval)
	// One reconcile interval, plus the polling (5 ms) and the exchange
	// itself: each enforcer reads the plan one interval after its last
	// exchange ended.
	if slack := 50 * time.Millisecond; gap > interval+slack {
		t.Errorf("the enforcers began suspending free-trial %s apart; want at most one reconcile interval (%s, +%s for polling and the exchange)", gap, interval, slack)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(llm), llm); err != nil {
		t.Fatal(err)
	}
	if llm.Status.Phase != v1alpha1.PhaseRecovery1 && llm.Status.Phase != v1alpha1.PhaseDegraded {
		t.Errorf("llm is %s while its enforcers suspend the free tier; want Degraded or Phase1", llm.Status.Phase)
	}
}

// outageAnswer is an answer to one request on a gated endpoint.
type outageAnswer struct {
	code             int
	outage           bool // X-Outage-Mode: true
	tier, retryAfter string
}

// export asks e for one export (the endpoint that draws on llm) by tenant.
func (e *enforcerNode) export(t *testing.T, tenant string) outageAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+e.api+"/api/export", nil)
	req.Header.Set("X-Tenant", tenant)
	req.Header.Set("X-Api-Key", "e2e-key")
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Errorf("%s: %v", e.id, err)
		return outageAnswer{}
	}
	resp.Body.Close()
	return outageAnswer{code: resp.StatusCode, outage: resp.Header.Get("X-Outage-Mode") == "true",
		tier: resp.Header.Get("X-Tier"), retryAfter: resp.Header.Get("Retry-After")}
}
