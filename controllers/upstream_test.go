package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/testenv"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// upstreamSpeed is how much faster than real time the upstream leaders of
// these tests run: their clock, and so probe intervals, windows and cycles
// (30 s healthy, 10 s below 0.5 confidence), run ten times faster.
const upstreamSpeed = 10

// fastClock runs speed times faster than real time, from now.
func fastClock(speed int) func() time.Time {
	start := time.Now()
	return func() time.Time { return start.Add(time.Since(start) * time.Duration(speed)) }
}

// TestUpstreamOutage runs the pipeline in the manager against a real API
// server and Redis: an Upstream probes an httptest server that answers 200,
// then 503. Its status goes Healthy → Degraded → Phase1 with a confidence
// and since when; the plan in Redis names every tenant's class; the
// downgraded tenants' TenantQuotas get a ClassChanged Event, the upgraded
// one a Normal one; the outage webhook gets signed notices; an Upstream
// naming an endpoint the plane lacks is Invalid and says which; deleting
// the Upstreams lifts the plan and drops the series.
func TestUpstreamOutage(t *testing.T) {
	env := testenv.Start(t)
	r := redistest.Start(t)
	m := startUpstreamManager(t, env, r, UpstreamOptions{Interval: 100 * time.Millisecond, Tick: 20 * time.Millisecond, Clock: fastClock(upstreamSpeed),
		Notifier: upstream.NotifierOptions{Backoff: 10 * time.Millisecond}})
	ctx := context.Background()

	var status atomic.Int32
	status.Store(http.StatusOK)
	probed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(probed.Close)
	hook := &receiver{}
	hooked := httptest.NewServer(hook)
	t.Cleanup(hooked.Close)

	ns := namespace(t, env, "upstreams")
	objs := []runtime.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hook"}, Data: map[string][]byte{"secret": []byte("s3cret\n")}}}
	for _, o := range samples(t, ns) {
		switch o := o.(type) {
		case *v1alpha1.QuotaPlane: // tiers enterprise, standard, free: bases 0.7, 0.4, 0.1
			o.Spec.Outage = &v1alpha1.Outage{Webhook: &v1alpha1.OutageWebhook{URL: hooked.URL, SecretRef: &v1alpha1.SecretKeyReference{Name: "hook", Key: "secret"}}}
			objs = append(objs, o)
		case *v1alpha1.EndpointQuota:
			objs = append(objs, o)
		}
	}
	for _, tq := range []struct {
		name, tier string
		priority   *v1alpha1.TenantPriority
	}{
		{"anchor", "enterprise", &v1alpha1.TenantPriority{ContractValue: 500000}}, // 0.85: critical once degraded
		{"corp", "enterprise", nil}, // 0.7: high
		{"batch", "standard", nil},  // 0.4: low, suspended below 0.65
		{"trial", "free", nil},      // 0.1: low, suspended once degraded
	} {
		objs = append(objs, &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: tq.name},
			Spec: v1alpha1.TenantQuotaSpec{Tenant: tq.name, Tier: tq.tier, Priority: tq.priority}})
	}
	objs = append(objs,
		&v1alpha1.Upstream{ObjectMeta: metav1.ObjectMeta{Name: "llm"}, Spec: v1alpha1.UpstreamSpec{
			Capacity:  v1alpha1.Rate{Rate: 600, Period: &metav1.Duration{Duration: time.Minute}},
			Endpoints: []string{"export"},
			Probe: &v1alpha1.UpstreamProbe{URL: probed.URL + "/v1/models", Interval: &metav1.Duration{Duration: time.Second},
				Timeout: &metav1.Duration{Duration: 500 * time.Millisecond}},
			Passive: ptr.To(false),
			Window:  &metav1.Duration{Duration: time.Minute},
			// The fast clock makes every latency ten times longer: keep
			// latency out of the confidence.
			LatencyCeiling: &metav1.Duration{Duration: 10 * time.Minute},
		}},
		&v1alpha1.Upstream{ObjectMeta: metav1.ObjectMeta{Name: "broken"}, Spec: v1alpha1.UpstreamSpec{
			Capacity: v1alpha1.Rate{Rate: 100}, Endpoints: []string{"missing"}}},
	)
	for _, o := range objs {
		o.(client.Object).SetNamespace(ns)
	}
	create(t, env, objs)
	plane := ns + "/main"

	llm := &v1alpha1.Upstream{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"}}
	broken := &v1alpha1.Upstream{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "broken"}}
	poll.Until(t, 30*time.Second, "llm is sensed healthy with a successful probe", func() bool {
		get(t, env, llm)
		c := meta.FindStatusCondition(llm.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == ReasonSensing && llm.Status.Phase == v1alpha1.PhaseHealthy &&
			llm.Status.LastProbeTime != nil && llm.Status.LastProbeError == "" && llm.Status.ObservedGeneration == llm.Generation
	})
	if c := confidence(t, llm); c < upstream.HealthyConfidence {
		t.Errorf("healthy llm: confidence %q, want at least %v", llm.Status.Confidence, upstream.HealthyConfidence)
	}
	if cl := llm.Status.Classes; cl == nil || cl.High != 2 || cl.Low != 2 {
		t.Errorf("healthy llm: classes %+v, want the static tiers: 2 high (enterprise), 2 low (standard, free)", cl)
	}
	poll.Until(t, 10*time.Second, "broken is Invalid", func() bool {
		get(t, env, broken)
		c := meta.FindStatusCondition(broken.Status.Conditions, v1alpha1.ConditionReady)
		return c != nil && c.Reason == ReasonInvalid
	})
	if c := meta.FindStatusCondition(broken.Status.Conditions, v1alpha1.ConditionReady); c.Status != metav1.ConditionFalse ||
		!strings.Contains(c.Message, `endpoint "missing" has no valid EndpointQuota`) || broken.Status.Phase != "" {
		t.Errorf("broken: Ready %s %s %q, phase %q; want False, naming the missing endpoint and how to fix it, and not sensed", c.Status, c.Reason, c.Message, broken.Status.Phase)
	}
	healthy := readPlan(t, r, plane)
	if len(healthy.Upstreams) != 1 || healthy.Upstreams[0].Name != "llm" || healthy.Upstreams[0].Phase != upstream.Healthy {
		t.Fatalf("the healthy plan: %+v; want llm alone (broken is not sensed), Healthy", healthy.Upstreams)
	}
	if got := classes(healthy.Upstreams[0]); got != "anchor=high batch=low corp=high trial=low" {
		t.Errorf("the healthy plan's classes: %s; want the static tiers'", got)
	}

	// The upstream fails.
	status.Store(http.StatusServiceUnavailable)
	var phases []v1alpha1.UpstreamPhase
	poll.Until(t, 30*time.Second, "llm reaches Phase1", func() bool {
		get(t, env, llm)
		if n := len(phases); n == 0 || phases[n-1] != llm.Status.Phase {
			phases = append(phases, llm.Status.Phase)
		}
		return llm.Status.Phase == v1alpha1.PhaseRecovery1
	})
	if want := []v1alpha1.UpstreamPhase{v1alpha1.PhaseHealthy, v1alpha1.PhaseDegraded, v1alpha1.PhaseRecovery1}; !slices.Equal(phases, want) {
		t.Errorf("llm went through phases %v; want %v", phases, want)
	}
	if c := confidence(t, llm); !regexp.MustCompile(`^0\.\d\d$`).MatchString(llm.Status.Confidence) || c >= upstream.Phase2Confidence {
		t.Errorf("llm in Phase1: confidence %q, want two decimals below %v", llm.Status.Confidence, upstream.Phase2Confidence)
	}
	if llm.Status.LastTransitionTime == nil || !strings.Contains(llm.Status.LastProbeError, "503") {
		t.Errorf("llm in Phase1: since %v, last probe error %q; want a since and the 503", llm.Status.LastTransitionTime, llm.Status.LastProbeError)
	}
	for _, note := range []string{"phase Healthy → Degraded", "phase Degraded → Phase1"} {
		waitEventNote(t, env, ns, corev1.EventTypeWarning, EventPhaseChanged, "llm", note)
	}

	// Two cycles below their class suspend batch and trial; anchor was
	// upgraded at once.
	var plan *upstream.Plan
	poll.Until(t, 20*time.Second, "the plan suspends batch and trial", func() bool {
		plan = readPlan(t, r, plane)
		return len(plan.Upstreams) == 1 && classes(plan.Upstreams[0]) == "anchor=critical batch=suspended corp=high trial=suspended"
	})
	if up := plan.Upstreams[0]; up.Phase != upstream.Phase1 || up.Confidence >= upstream.Phase2Confidence || up.Tiers["free"] != upstream.Suspended {
		t.Errorf("the plan: phase %s, confidence %v, tier free %s; want Phase1 below %v, free suspended", up.Phase, up.Confidence, up.Tiers["free"], upstream.Phase2Confidence)
	}
	waitEventNote(t, env, ns, corev1.EventTypeWarning, EventClassChanged, "trial", "class on upstream llm: low → suspended (score 0.10, confidence 0.")
	waitEventNote(t, env, ns, corev1.EventTypeWarning, EventClassChanged, "batch", "class on upstream llm: low → suspended (score 0.40")
	waitEventNote(t, env, ns, corev1.EventTypeNormal, EventClassChanged, "anchor", "class on upstream llm: high → critical (score 0.85")

	// The webhook got each change, signed with the Secret's value (its
	// trailing newline dropped).
	var notices []upstream.Notice
	poll.Until(t, 10*time.Second, "the webhook gets the three changes", func() bool {
		notices = hook.notices(t, []byte("s3cret"))
		return len(notices) >= 3
	})
	var got []string
	for _, n := range notices {
		if n.Plane != plane || n.Upstream != "llm" {
			t.Errorf("notice %+v; want plane %s, upstream llm", n, plane)
		}
		got = append(got, n.Tenant+":"+n.From.String()+"→"+n.To.String())
	}
	slices.Sort(got)
	if want := []string{"anchor:high→critical", "batch:low→suspended", "trial:low→suspended"}; !slices.Equal(got, want) {
		t.Errorf("notices %v; want %v", got, want)
	}

	// The metrics say the same.
	poll.Until(t, 10*time.Second, "the metrics count the changes and the notices", func() bool {
		return metric(t, m.registry, "quotaplane_manager_upstream_phase", "namespace", ns, "upstream", "llm") == float64(upstream.Phase1) &&
			metric(t, m.registry, "quotaplane_manager_upstream_tenants", "namespace", ns, "upstream", "llm", "class", "suspended") == 2 &&
			metric(t, m.registry, "quotaplane_manager_upstream_class_changes_total", "namespace", ns, "upstream", "llm", "from", "low", "to", "suspended") == 2 &&
			metric(t, m.registry, "quotaplane_manager_upstream_webhook_notices_total", "namespace", ns, "result", "sent") == 3
	})
	if c := metric(t, m.registry, "quotaplane_manager_upstream_capacity_confidence", "namespace", ns, "upstream", "llm"); c < 0 || c >= upstream.Phase2Confidence {
		t.Errorf("confidence series %v; want the Phase1 confidence", c)
	}

	// Without Upstreams the leader stops: the gate is lifted at once and
	// the namespace's series are gone.
	for _, u := range []*v1alpha1.Upstream{llm, broken} {
		if err := env.Client.Delete(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 10*time.Second, "the plan is deleted and the series dropped", func() bool {
		return readPlan(t, r, plane) == nil && metric(t, m.registry, "quotaplane_manager_upstream_phase", "namespace", ns, "upstream", "llm") == -1
	})

	t.Run("at most 50 class Events a cycle", func(t *testing.T) {
		crowd := namespace(t, env, "crowd")
		var tqs []runtime.Object
		for i := range 60 {
			name := fmt.Sprintf("t%02d", i)
			tqs = append(tqs, &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: crowd, Name: name}, Spec: v1alpha1.TenantQuotaSpec{Tenant: name, Tier: "free"}})
		}
		create(t, env, tqs)
		reg := prometheus.NewRegistry()
		um, err := newUpstreamMetrics(reg)
		if err != nil {
			t.Fatal(err)
		}
		events := &eventLog{}
		up := &v1alpha1.Upstream{ObjectMeta: metav1.ObjectMeta{Namespace: crowd, Name: "llm"}}
		pl := &planeLeader{u: &upstreamLeaders{client: env.Client, recorder: events, metrics: um, logger: slog.Default()},
			ns: crowd, name: "main", id: crowd + "/main", ctx: ctx, objs: map[string]*v1alpha1.Upstream{"llm": up},
			series: map[string]bool{}, phases: map[string]upstream.Phase{}}
		uc := upstream.UpstreamCycle{Spec: policy.Upstream{Name: "llm"}, Phase: upstream.Phase1, Terms: upstream.Terms{Confidence: 0.41}}
		for i := range 60 {
			uc.Changes = append(uc.Changes, upstream.ClassChange{Tenant: fmt.Sprintf("t%02d", i), From: upstream.Low, To: upstream.Suspended, Score: 0.1})
		}
		pl.tell(&upstream.Cycle{Upstreams: []upstream.UpstreamCycle{uc}})
		byReason := map[string][]string{}
		for _, e := range events.events {
			byReason[e.reason] = append(byReason[e.reason], e.kind+" "+e.regarding+": "+e.note)
		}
		if n := len(byReason[EventClassChanged]); n != maxClassEvents {
			t.Errorf("%d ClassChanged Events for 60 changes; want %d", n, maxClassEvents)
		}
		if got, want := byReason[EventClassChanged][0], "Warning t00: class on upstream llm: low → suspended (score 0.10, confidence 0.41, Phase1)"; got != want {
			t.Errorf("ClassChanged %q; want %q", got, want)
		}
		if s := byReason[EventClassesChanged]; len(s) != 1 || !strings.HasPrefix(s[0], "Warning llm: 60 tenants changed class on this upstream in this cycle (60 down, 0 up); 10 of them have no Event") {
			t.Errorf("ClassesChanged %q; want one on llm summing up the 60", s)
		}
		if n := metric(t, reg, "quotaplane_manager_upstream_class_changes_total", "namespace", crowd, "from", "low", "to", "suspended"); n != 60 {
			t.Errorf("class changes counted %v; want 60", n)
		}
	})
}

// eventLog is an events.EventRecorder that keeps what it is told.
type eventLog struct {
	mu     sync.Mutex
	events []recordedEvent
}

type recordedEvent struct{ regarding, kind, reason, note string }

func (l *eventLog) Eventf(regarding, _ runtime.Object, eventtype, reason, _, note string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, recordedEvent{regarding.(client.Object).GetName(), eventtype, reason, fmt.Sprintf(note, args...)})
}

// TestUpstreamStatus: the status an Upstream is given, pure.
func TestUpstreamStatus(t *testing.T) {
	at := time.Date(2026, 3, 1, 2, 17, 0, 123456789, time.UTC)
	obj := &v1alpha1.Upstream{ObjectMeta: metav1.ObjectMeta{Name: "llm", Generation: 3}}
	uc := &upstream.UpstreamCycle{Spec: policy.Upstream{Name: "llm", Sensing: true, Passive: true, Probe: &policy.Probe{}},
		Terms: upstream.Terms{Error: 0.5, Confidence: 0.4149}, Phase: upstream.Phase1, Since: at, LastProbe: at.Add(time.Second),
		LastProbeError: "status 503 not expected", Classes: [upstream.NumClasses]int{upstream.Suspended: 3, upstream.Critical: 1}}

	st, ok := desiredUpstreamStatus(obj, uc, nil, nil, nil, 7)
	ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	if !ok || st.Confidence != "0.41" || st.Phase != v1alpha1.PhaseRecovery1 || !st.LastTransitionTime.Time.Equal(at.Truncate(time.Second)) ||
		st.LastProbeError != uc.LastProbeError || *st.Classes != (v1alpha1.UpstreamClasses{Critical: 1, Suspended: 3}) ||
		st.ObservedGeneration != 3 || st.PolicyVersion != 7 || ready.Status != metav1.ConditionTrue || ready.Reason != ReasonSensing ||
		ready.ObservedGeneration != 3 {
		t.Fatalf("sensed: %+v, Ready %+v", st, ready)
	}
	// Written and read back (times in whole seconds), the next cycle's
	// same status compares equal: nothing is written again.
	obj.Status = st
	again, _ := desiredUpstreamStatus(obj, uc, nil, nil, nil, 7)
	if !equality.Semantic.DeepEqual(&obj.Status, &again) {
		t.Errorf("the same cycle again gives another status:\n%+v\n%+v", obj.Status, again)
	}

	// Edited into an invalid spec: not sensed, the sensing fields cleared.
	obj.Generation = 4
	st, _ = desiredUpstreamStatus(obj, nil, []string{`spec.endpoints[0]: endpoint "x" has no valid EndpointQuota in this plane; create one or remove it from endpoints`}, nil, nil, 7)
	ready = meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	if st.Phase != "" || st.Confidence != "" || st.Classes != nil || st.PolicyVersion != 0 || st.ObservedGeneration != 4 ||
		ready.Status != metav1.ConditionFalse || ready.Reason != ReasonInvalid || !strings.Contains(ready.Message, `endpoint "x"`) {
		t.Errorf("invalid: %+v, Ready %+v", st, ready)
	}

	// The plane's policy cannot be read: what was sensed stays, Ready says why.
	obj.Status, obj.Generation = again, 3
	st, _ = desiredUpstreamStatus(obj, nil, nil, errors.New("no policy"), errors.New("load the plane: no policy"), 0)
	ready = meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	if st.Phase != v1alpha1.PhaseRecovery1 || ready.Reason != ReasonNotSensed || ready.Status != metav1.ConditionFalse {
		t.Errorf("no policy: %+v, Ready %+v", st, ready)
	}

	// Sensing Disabled, and a plan Redis did not take.
	uc.Spec.Sensing = false
	st, _ = desiredUpstreamStatus(obj, uc, nil, nil, nil, 7)
	if ready = meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); ready.Reason != ReasonSensingDisabled {
		t.Errorf("sensing disabled: Ready %+v", ready)
	}
	st, _ = desiredUpstreamStatus(obj, uc, nil, nil, errors.New("publish upstream plan: connection refused"), 7)
	if ready = meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady); ready.Reason != ReasonPublishFailed || ready.Status != metav1.ConditionFalse {
		t.Errorf("publish failed: Ready %+v", ready)
	}
	// A long probe error is cut to what the CRD takes, at a rune.
	if got := truncate("éééé", 6); got != "é..." {
		t.Errorf("truncate cut a rune: %q", got)
	}
	// Listed after the cycle's load: nothing to write.
	if _, ok := desiredUpstreamStatus(obj, nil, nil, nil, nil, 7); ok {
		t.Error("an Upstream the cycle did not sense gets a status")
	}
}

// TestUpstreamPlanes: a leader runs for each namespace's primary plane
// that has an Upstream.
func TestUpstreamPlanes(t *testing.T) {
	older := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	qp := func(ns, name string, created metav1.Time) v1alpha1.QuotaPlane {
		return v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: created}}
	}
	up := func(ns string) v1alpha1.Upstream {
		return v1alpha1.Upstream{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llm"}}
	}
	want, primaries := upstreamPlanes(
		[]v1alpha1.QuotaPlane{qp("a", "zeta", older), qp("a", "new", metav1.NewTime(older.Add(time.Hour))), qp("b", "main", older), qp("c", "y", older), qp("c", "x", older)},
		[]v1alpha1.Upstream{up("a"), up("a"), up("c"), up("orphan")})
	if len(want) != 2 || want["a"] != "zeta" || want["c"] != "x" {
		t.Errorf("leaders %v; want a/zeta (the oldest) and c/x (the name breaks the tie), none for b (no Upstream) nor orphan (no plane)", want)
	}
	if len(primaries) != 3 || primaries["b"] != "main" {
		t.Errorf("primaries %v", primaries)
	}
}

// TestCompileWithUpstream: an Upstream among a namespace's objects is
// checked by Compile and given no outcome by resolve (it used to panic in
// recordOf).
func TestCompileWithUpstream(t *testing.T) {
	objs := samples(t, "compile-upstream")
	objs = append(objs, &v1alpha1.Upstream{ObjectMeta: metav1.ObjectMeta{Namespace: "compile-upstream", Name: "extra", Generation: 1},
		Spec: v1alpha1.UpstreamSpec{Capacity: v1alpha1.Rate{Rate: 10}, Endpoints: []string{"read"}}})
	res := resolve(objs, nil)
	if res.policy == nil {
		t.Fatalf("the samples with an Upstream do not compile: %v", res.problems)
	}
	want, _ := policy.Compile(objs)
	if res.policy.Hash() != want.Hash() {
		t.Errorf("resolve compiled hash %s, Compile %s", res.policy.Hash(), want.Hash())
	}
	for key := range res.outcomes {
		if key.kind == "" {
			t.Errorf("resolve gave %q an outcome", key.name)
		}
	}
}

// startUpstreamManager is startManager with leader election on and the
// upstream leaders tuned by opts.
func startUpstreamManager(t *testing.T, env *testenv.Env, r *redistest.Server, opts UpstreamOptions) *testManager {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                        NewScheme(),
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		Controller:                    config.Controller{SkipNameValidation: ptr.To(true)},
		LeaderElection:                true,
		LeaderElectionID:              "quotaplane-upstream-test",
		LeaderElectionNamespace:       "default",
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 ptr.To(testLease),
		RenewDeadline:                 ptr.To(testLease * 3 / 4),
		RetryPeriod:                   ptr.To(100 * time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := Setup(mgr, Options{Redis: r.Client(), FleetInterval: 100 * time.Millisecond, Resync: time.Second, Registerer: reg, Upstream: opts}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &testManager{Manager: mgr, registry: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- mgr.Start(ctx) }()
	t.Cleanup(m.stop)
	return m
}

// confidence parses an Upstream's status confidence.
func confidence(t *testing.T, u *v1alpha1.Upstream) float64 {
	t.Helper()
	c, err := strconv.ParseFloat(u.Status.Confidence, 64)
	if err != nil {
		t.Fatalf("Upstream %s: confidence %q: %v", u.Name, u.Status.Confidence, err)
	}
	return c
}

// readPlan is the plane's plan in Redis (nil when there is none).
func readPlan(t *testing.T, r *redistest.Server, plane string) *upstream.Plan {
	t.Helper()
	p, err := upstream.ReadPlan(context.Background(), r.Client(), plane)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// classes lists the classes an upstream plan gives outageTenants as
// tenant=class, sorted.
func classes(up upstream.UpstreamPlan) string {
	var s []string
	for name, tier := range outageTenants {
		class, ok := up.Tiers[tier]
		if tc, named := up.Tenants[name]; named {
			class, ok = tc.Class, true
		}
		if ok {
			s = append(s, name+"="+class.String())
		}
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}

// outageTenants are TestUpstreamOutage's tenants and their tiers: a plan
// names a tenant only when its class is not its tier's (classes).
var outageTenants = map[string]string{"anchor": "enterprise", "corp": "enterprise", "batch": "standard", "trial": "free"}

// waitEventNote waits for an Event of the manager about the object name in
// ns whose note contains note.
func waitEventNote(t *testing.T, env *testenv.Env, ns, eventType, reason, name, note string) {
	t.Helper()
	poll.Until(t, 10*time.Second, "a "+eventType+" "+reason+" event on "+name+" saying "+note, func() bool {
		var evs eventsv1.EventList
		if err := env.Client.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.Reason == reason && e.Regarding.Name == name && e.ReportingController == EventSource &&
				e.Type == eventType && strings.Contains(e.Note, note) {
				return true
			}
		}
		return false
	})
}

// metric is the value of the series of name with labels (name, value
// pairs), -1 when there is none.
func metric(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, s := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch {
			case s.Gauge != nil:
				return s.GetGauge().GetValue()
			case s.Counter != nil:
				return s.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// receiver is a class-change webhook: it keeps what it is posted.
type receiver struct {
	mu     sync.Mutex
	bodies [][]byte
	sigs   []string
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.bodies = append(rc.bodies, body)
	rc.sigs = append(rc.sigs, r.Header.Get(upstream.SignatureHeader))
}

// notices are the notices posted so far; each must be signed with secret.
func (rc *receiver) notices(t *testing.T, secret []byte) []upstream.Notice {
	t.Helper()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []upstream.Notice
	for i, body := range rc.bodies {
		if got, want := rc.sigs[i], upstream.Sign(secret, body); got != want {
			t.Fatalf("notice %s signed %q, want %q", body, got, want)
		}
		var n upstream.Notice
		if err := json.Unmarshal(body, &n); err != nil {
			t.Fatalf("notice %s: %v", body, err)
		}
		out = append(out, n)
	}
	return out
}
