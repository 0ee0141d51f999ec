package controllers

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// testManager is a running manager with its controllers.
type testManager struct {
	ctrl.Manager
	registry *prometheus.Registry
	cancel   context.CancelFunc
	done     chan error
}

// startManager starts a manager against env and Redis r, stopped when the
// test ends (or by stop). leader turns on leader election, with short leases.
func startManager(t *testing.T, env *testenv.Env, r *redistest.Server, leader bool) *testManager {
	t.Helper()
	opts := ctrl.Options{
		Scheme:                 NewScheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Several managers of one process register controllers of the same names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if leader {
		opts.LeaderElection = true
		opts.LeaderElectionID = "quotaplane-test"
		opts.LeaderElectionNamespace = "default"
		opts.LeaderElectionReleaseOnCancel = true
		// Short, but with room for a renewal to be late on a loaded
		// 2-core machine running the race detector.
		opts.LeaseDuration = ptr.To(testLease)
		opts.RenewDeadline = ptr.To(testLease * 3 / 4)
		opts.RetryPeriod = ptr.To(100 * time.Millisecond)
	}
	mgr, err := ctrl.NewManager(env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := Setup(mgr, Options{Redis: r.Client(), FleetInterval: 100 * time.Millisecond, ScaleDownDelay: time.Second, Resync: time.Second, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &testManager{Manager: mgr, registry: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- mgr.Start(ctx) }()
	t.Cleanup(m.stop)
	return m
}

func (m *testManager) stop() {
	m.cancel()
	<-m.done
	m.done <- nil // stop is idempotent
}

// namespace creates a fresh namespace.
func namespace(t *testing.T, env *testenv.Env, name string) string {
	t.Helper()
	if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	return name
}

// samples reads config/samples with their namespace set to ns.
func samples(t *testing.T, ns string) []runtime.Object {
	t.Helper()
	objs, err := policy.ReadDir(filepath.Join(testenv.Root(), "config", "samples"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		o.(client.Object).SetNamespace(ns)
	}
	return objs
}

// create creates objs in the API server.
func create(t *testing.T, env *testenv.Env, objs []runtime.Object) {
	t.Helper()
	for _, o := range objs {
		if err := env.Client.Create(context.Background(), o.(client.Object).DeepCopyObject().(client.Object)); err != nil {
			t.Fatalf("create %T %s: %v", o, o.(client.Object).GetName(), err)
		}
	}
}

// get reads obj afresh from the API server.
func get(t *testing.T, env *testenv.Env, obj client.Object) {
	t.Helper()
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatal(err)
	}
}

// ready is obj's Ready condition (nil when unset).
func ready(obj client.Object) *metav1.Condition {
	return meta.FindStatusCondition(statusOf(obj).Conditions, v1alpha1.ConditionReady)
}

// current is the plane's published policy in Redis (nil when none).
func current(t *testing.T, r *redistest.Server, plane string) *policy.Policy {
	t.Helper()
	s, err := store.New(r.Client(), plane)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Current(context.Background())
	if err != nil {
		return nil
	}
	return p
}

// update reads obj afresh, applies change and writes it, again on conflicts
// (the manager writes statuses meanwhile).
func update(t *testing.T, env *testenv.Env, obj client.Object, change func()) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		get(t, env, obj)
		change()
		return env.Client.Update(context.Background(), obj)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitPublished waits until Redis holds want for its plane and obj's status
// names that version, and returns the version.
func waitPublished(t *testing.T, env *testenv.Env, r *redistest.Server, want *policy.Policy, obj client.Object) int64 {
	t.Helper()
	var version int64
	poll.Until(t, 20*time.Second, "the whole plane is published and "+obj.GetName()+" names it", func() bool {
		get(t, env, obj)
		p := current(t, r, want.ID())
		if p == nil || p.Hash() != want.Hash() || statusOf(obj).PolicyVersion != p.Version() {
			return false
		}
		version = p.Version()
		return true
	})
	return version
}

// waitEvent waits for an Event of the manager about the object name in ns.
func waitEvent(t *testing.T, env *testenv.Env, ns, eventType, reason, name string) {
	t.Helper()
	poll.Until(t, 10*time.Second, "a "+reason+" event on "+name, func() bool {
		var evs eventsv1.EventList
		if err := env.Client.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.Type == eventType && e.Reason == reason && e.Regarding.Name == name && e.ReportingController == EventSource {
				return true
			}
		}
		return false
	})
}
