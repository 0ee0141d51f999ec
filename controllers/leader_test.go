package controllers

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// testLease is the lease duration startManager gives a leader-elected manager.
const testLease = 3 * time.Second

// TestLeaderElection runs two managers against one API server and one Redis:
// only the elected one publishes, and when it stops the other takes over and
// publishes the next version.
func TestLeaderElection(t *testing.T) {
	env := testenv.Start(t)
	r := redistest.Start(t)
	managers := [2]*testManager{startManager(t, env, r, true), startManager(t, env, r, true)}

	var leader, follower *testManager
	poll.Until(t, 30*time.Second, "a manager is elected", func() bool {
		for i, m := range managers {
			if elected(m) {
				leader, follower = m, managers[1-i]
				return true
			}
		}
		return false
	})
	holder := leaseHolder(t, env)
	if holder == "" {
		t.Fatal("a manager is elected, but the Lease names no holder")
	}
	// For two lease durations the leader keeps renewing and the follower
	// stays a follower.
	consistently(t, 2*testLease, "the first leader keeps the lease", func() bool {
		return !elected(follower) && len(leader.done) == 0 && leaseHolder(t, env) == holder
	})

	ns := namespace(t, env, "leader")
	objs := samples(t, ns)
	create(t, env, objs)
	want, _ := policy.Compile(objs)
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
	poll.Until(t, 20*time.Second, "the leader publishes the samples", func() bool {
		get(t, env, plane)
		return plane.Status.PublishedHash == want.Hash()
	})
	if n := publishes(t, leader); n < 1 {
		t.Errorf("the leader counts %g publishes; it published version %d", n, plane.Status.PublishedVersion)
	}
	if n := publishes(t, follower); n != 0 {
		t.Fatalf("the follower counts %g publishes; only the leader may publish", n)
	}
	tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whale-1"}}
	poll.Until(t, 10*time.Second, "the tenant names the published version", func() bool {
		get(t, env, tq)
		return tq.Status.PolicyVersion == plane.Status.PublishedVersion
	})
	before := tq.Status.PolicyVersion

	stopped := time.Now()
	leader.stop()
	stopTook := time.Since(stopped)
	poll.Until(t, 3*testLease, "the follower takes over within three lease durations", func() bool {
		return elected(follower)
	})
	takeover := time.Since(stopped)
	t.Logf("takeover: %s after the leader was told to stop (its shutdown took %s; lease %s)", takeover.Round(time.Millisecond), stopTook.Round(time.Millisecond), testLease)
	if h := leaseHolder(t, env); h == "" || h == holder {
		t.Errorf("after the takeover the Lease names %q; want the new leader, not %q", h, holder)
	}

	update(t, env, tq, func() { tq.Spec.Limit.Rate = 4321 })
	poll.Until(t, 20*time.Second, "the new leader publishes the next version and the tenant follows", func() bool {
		get(t, env, tq)
		return tq.Status.PolicyVersion == before+1 && tq.Status.ObservedGeneration == tq.Generation
	})
	p := current(t, r, ns+"/main")
	if tenant, _ := p.Tenant("whale-1"); p.Version() != before+1 || tenant.Limit == nil || tenant.Limit.Rate != 4321 {
		t.Fatalf("Redis holds %s with whale-1 %+v; want version %d with rate 4321", describe(p), tenant.Limit, before+1)
	}
	// The samples it found already published it did not publish again: one
	// content change, one version.
	if n := publishes(t, follower); n != 1 {
		t.Errorf("the new leader counts %g publishes; want 1, the update", n)
	}
}

// elected reports whether m leads (its Elected channel is closed).
func elected(m *testManager) bool {
	select {
	case <-m.Elected():
		return true
	default:
		return false
	}
}

// leaseHolder is the holder the managers' Lease names ("" when none).
func leaseHolder(t *testing.T, env *testenv.Env) string {
	t.Helper()
	var lease coordinationv1.Lease
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "quotaplane-test"}, &lease); err != nil {
		if apierrors.IsNotFound(err) {
			return ""
		}
		t.Fatal(err)
	}
	if lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// publishes is m's quotaplane_manager_publishes_total, summed over namespaces.
func publishes(t *testing.T, m *testManager) float64 {
	t.Helper()
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() == "quotaplane_manager_publishes_total" {
			for _, c := range f.GetMetric() {
				n += c.GetCounter().GetValue()
			}
		}
	}
	return n
}

// consistently checks cond every 20 ms for d and fails the test the first
// time it does not hold.
func consistently(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for start := time.Now(); time.Now().Before(end); <-tick.C {
		if !cond() {
			t.Fatalf("after %s of %s: no longer %s", time.Since(start).Round(time.Millisecond), d, what)
		}
	}
}
