package controllers

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// TestManager runs one manager against a real API server and a real Redis;
// each subtest works in its own namespace (its own plane).
func TestManager(t *testing.T) {
	env := testenv.Start(t)
	r := redistest.Start(t)
	startManager(t, env, r, false)
	ctx := context.Background()

	t.Run("the samples publish what Compile gives", func(t *testing.T) {
		ns := namespace(t, env, "samples")
		objs := samples(t, ns)
		create(t, env, objs)
		want, problems := policy.Compile(objs)
		if want == nil || len(problems) > 0 {
			t.Fatalf("the samples do not compile: %v", problems)
		}
		plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
		// Objects arrive one by one, so intermediate versions may come first.
		poll.Until(t, 20*time.Second, "the whole plane is published", func() bool {
			get(t, env, plane)
			return plane.Status.PublishedHash == want.Hash()
		})
		got := current(t, r, ns+"/main")
		if got == nil || got.Hash() != want.Hash() || got.Version() != plane.Status.PublishedVersion {
			t.Fatalf("Redis holds %s; want the compiled samples (hash %s) at version %d", describe(got), want.Hash(), plane.Status.PublishedVersion)
		}
		// Every object says it is in force in that version.
		for _, o := range objs {
			obj := o.(client.Object)
			// Ready in the version Redis holds: an object that arrived
			// early is Ready in an intermediate version first, and its
			// status controller catches up after the publish.
			poll.Until(t, 10*time.Second, "every object is Ready in the published version", func() bool {
				get(t, env, obj)
				c := ready(obj)
				return c != nil && c.Status == metav1.ConditionTrue && statusOf(obj).PolicyVersion == got.Version()
			})
			st := statusOf(obj)
			if st.PolicyVersion != got.Version() || st.ObservedGeneration != obj.GetGeneration() || ready(obj).Reason != ReasonPublished {
				t.Errorf("%T %s: status %+v; want policyVersion %d, observedGeneration %d", obj, obj.GetName(), st, got.Version(), obj.GetGeneration())
			}
		}
		waitEvent(t, env, ns, corev1.EventTypeNormal, "Published", "main")
	})

	t.Run("an update publishes the next version", func(t *testing.T) {
		ns := namespace(t, env, "update")
		create(t, env, samples(t, ns))
		plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
		tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whale-1"}}
		before := waitPublished(t, env, r, samplePolicy(t, ns), tq)
		update(t, env, tq, func() { tq.Spec.Limit.Rate = 1234 })
		poll.Until(t, 10*time.Second, "the tenant's status names the next version", func() bool {
			get(t, env, tq)
			return tq.Status.PolicyVersion == before+1 && tq.Status.ObservedGeneration == tq.Generation
		})
		poll.Until(t, 10*time.Second, "the QuotaPlane's status.publishedVersion is the next version", func() bool {
			get(t, env, plane)
			return plane.Status.PublishedVersion == before+1
		})
		p := current(t, r, ns+"/main")
		if tenant, _ := p.Tenant("whale-1"); p.Version() != before+1 || tenant.Limit == nil || tenant.Limit.Rate != 1234 {
			t.Fatalf("Redis holds version %d with whale-1 %+v; want version %d with rate 1234", p.Version(), tenant.Limit, before+1)
		}
		// Other objects follow to the new version too.
		ep := &v1alpha1.EndpointQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read"}}
		poll.Until(t, 10*time.Second, "the other objects name the next version", func() bool {
			get(t, env, ep)
			return ep.Status.PolicyVersion == before+1
		})
	})

	t.Run("an invalid object gets a condition and is not published", func(t *testing.T) {
		ns := namespace(t, env, "invalid")
		create(t, env, samples(t, ns))
		plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
		version := waitPublished(t, env, r, samplePolicy(t, ns), plane)
		bad := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hooli"},
			Spec: v1alpha1.TenantQuotaSpec{Tenant: "hooli", Tier: "platinum"}}
		if err := env.Client.Create(ctx, bad); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 10*time.Second, "the object is marked Invalid", func() bool {
			get(t, env, bad)
			c := ready(bad)
			return c != nil && c.Reason == ReasonInvalid
		})
		if c := ready(bad); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "platinum") || !strings.Contains(c.Message, "spec.tier") {
			t.Errorf("condition %+v; want Ready=False naming spec.tier and the unknown tier", c)
		}
		if bad.Status.PolicyVersion != 0 {
			t.Errorf("an object left out names policy version %d", bad.Status.PolicyVersion)
		}
		p := current(t, r, ns+"/main")
		if _, named := p.Tenant("hooli"); p.Version() != version || named {
			t.Fatalf("Redis holds version %d (hooli in it: %t); want version %d unchanged", p.Version(), named, version)
		}
		waitEvent(t, env, ns, corev1.EventTypeWarning, "Rejected", "hooli")
	})

	t.Run("an invalid edit keeps the last valid version in force", func(t *testing.T) { testTypoIsHeld(t, env, r) })
	t.Run("a tier rename that would orphan objects is held until they move", func(t *testing.T) { testTierRenameIsHeld(t, env, r) })
	t.Run("a second QuotaPlane is a Duplicate and the first stays in force", func(t *testing.T) { testDuplicatePlane(t, env, r) })
	t.Run("Enforced follows the fleet's reports", func(t *testing.T) { testEnforced(t, env, r) })
	t.Run("a mode local plane is kept at one enforcer", func(t *testing.T) { testLocalModeOneReplica(t, env, r) })

	t.Run("a tenant's api keys come from its Secret, as hashes only", func(t *testing.T) {
		ns := namespace(t, env, "keys")
		create(t, env, samples(t, ns))
		tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "keyed"},
			Spec: v1alpha1.TenantQuotaSpec{Tenant: "keyed", Tier: "standard",
				KeyHashes:    []string{policy.HashKey("listed-key")},
				KeySecretRef: &v1alpha1.SecretReference{Name: "keyed-keys"}}}
		if err := env.Client.Create(ctx, tq); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 10*time.Second, "a missing Secret is named on the TenantQuota", func() bool {
			get(t, env, tq)
			c := ready(tq)
			return c != nil && c.Reason == ReasonInvalid && strings.Contains(c.Message, `"keyed-keys"`)
		})
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "keyed-keys"},
			Data: map[string][]byte{"a": []byte("raw-secret-key\n"), "b": []byte(policy.HashKey("other-key"))}}
		if err := env.Client.Create(ctx, secret); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 10*time.Second, "the tenant is published once its Secret exists", func() bool {
			get(t, env, tq)
			c := ready(tq)
			return c != nil && c.Status == metav1.ConditionTrue
		})
		p := current(t, r, ns+"/main")
		got, _ := p.Tenant("keyed")
		want := []string{policy.HashKey("listed-key"), policy.HashKey("other-key"), policy.HashKey("raw-secret-key")}
		slices.Sort(want)
		if !slices.Equal(got.KeyHashes, want) {
			t.Fatalf("published key hashes %v; want %v", got.KeyHashes, want)
		}
		if !p.KeyBelongs("keyed", "raw-secret-key") || p.KeyBelongs("keyed", "raw-secret-key\n") {
			t.Error("the Secret's key (without its trailing newline) does not belong to the tenant")
		}
		if blob := string(p.Encode()); strings.Contains(blob, "raw-secret-key") {
			t.Fatal("the published policy holds a raw api key")
		}
	})

	t.Run("a deleted object leaves the next version", func(t *testing.T) {
		ns := namespace(t, env, "delete")
		create(t, env, samples(t, ns))
		tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "globex"}}
		version := waitPublished(t, env, r, samplePolicy(t, ns), tq)
		if p := current(t, r, ns+"/main"); p == nil {
			t.Fatal("nothing published")
		} else if _, ok := p.Tenant("globex"); !ok {
			t.Fatal("globex is not in the published policy")
		}
		if err := env.Client.Delete(ctx, tq); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 10*time.Second, "a version without globex", func() bool {
			p := current(t, r, ns+"/main")
			_, ok := p.Tenant("globex")
			return p.Version() == version+1 && !ok
		})
	})

	t.Run("the enforcer fleet follows the decision rate", func(t *testing.T) {
		ns := namespace(t, env, "fleet")
		objs := samples(t, ns)
		for _, o := range objs {
			if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
				// A distributed mode: a local plane is kept at one enforcer.
				qp.Spec.Mode = v1alpha1.ModeLocalReconciled
				qp.Spec.Enforcer = v1alpha1.EnforcerFleet{DeploymentName: "enforcer", MinReplicas: 2, MaxReplicas: 8, TargetRatePerReplica: 1000}
			}
		}
		create(t, env, objs)
		dep := enforcerDeployment(t, env, ns, 1)
		plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
		replicas := func() int32 { get(t, env, dep); return *dep.Spec.Replicas }
		poll.Until(t, 20*time.Second, "no reports: the fleet is raised to minReplicas", func() bool {
			return replicas() == 2
		})
		want, _ := policy.Compile(objs)
		version := waitPublished(t, env, r, want, plane)
		s, err := store.New(r.Client(), ns+"/main")
		if err != nil {
			t.Fatal(err)
		}
		report := func(rates ...float64) {
			for i, rate := range rates {
				if err := s.Report(ctx, "enforcer-"+itoa(int64(i)), version, rate, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
		}
		report(2000, 1500)
		poll.Until(t, 5*time.Second, "3,500 decisions/s at 1,000 each: 4 replicas", func() bool { return replicas() == 4 })
		poll.Until(t, 5*time.Second, "the plane's status shows the fleet", func() bool {
			get(t, env, plane)
			c := meta.FindStatusCondition(plane.Status.Conditions, ConditionScaled)
			return plane.Status.Replicas == 4 && plane.Status.EnforcersReady == 2 && c != nil && c.Status == metav1.ConditionTrue
		})
		report(6000, 5000)
		poll.Until(t, 5*time.Second, "11,000 decisions/s: capped at maxReplicas 8", func() bool { return replicas() == 8 })

		// Down slowly: 3,000/s must be wanted for the whole delay (1 s here).
		report(1500, 1500)
		lowered := time.Now()
		poll.Until(t, 5*time.Second, "3,000 decisions/s: 3 replicas after the delay", func() bool { return replicas() == 3 })
		if waited := time.Since(lowered); waited < 900*time.Millisecond {
			t.Errorf("scaled down after %s; the delay is 1s", waited)
		}
		// Within the tolerance (±10% of 3,000) the fleet holds.
		for _, rates := range [][]float64{{1600, 1600}, {1400, 1400}, {1650, 1600}, {1400, 1350}} {
			report(rates...)
			hold := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(hold) {
				if n := replicas(); n != 3 {
					t.Fatalf("rates %v within 10%% of 3,000/s moved the fleet to %d replicas", rates, n)
				}
			}
		}
	})

	t.Run("a plane scales only an enforcer, and no fleet past the manager's cap", func(t *testing.T) {
		ns := namespace(t, env, "victim")
		objs := samples(t, ns)
		for _, o := range objs {
			if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
				qp.Spec.Mode = v1alpha1.ModeCentral
				qp.Spec.Enforcer = v1alpha1.EnforcerFleet{DeploymentName: "victim", MinReplicas: 200, MaxReplicas: 1000}
			}
		}
		victim := deployment(t, env, ns, "victim", 1, nil) // someone else's nginx
		create(t, env, objs)
		plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
		var c *metav1.Condition
		poll.Until(t, 20*time.Second, "Scaled=False, NotAnEnforcer", func() bool {
			get(t, env, plane)
			c = meta.FindStatusCondition(plane.Status.Conditions, ConditionScaled)
			return c != nil && c.Reason == "NotAnEnforcer"
		})
		if get(t, env, victim); c.Status != metav1.ConditionFalse || *victim.Spec.Replicas != 1 || !strings.Contains(c.Message, EnforcerLabel) {
			t.Fatalf("Scaled %s %q; victim at %d replicas; want False naming the label, and the victim left at 1", c.Status, c.Message, *victim.Spec.Replicas)
		}

		// Pointed at an enforcer, the fleet stops at the manager's cap.
		enforcer := enforcerDeployment(t, env, ns, 1)
		get(t, env, plane)
		patch := client.MergeFrom(plane.DeepCopy())
		plane.Spec.Enforcer.DeploymentName = enforcer.Name
		if err := env.Client.Patch(ctx, plane, patch); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 20*time.Second, "the enforcer at the cap of 100", func() bool {
			get(t, env, enforcer)
			return *enforcer.Spec.Replicas == DefaultMaxEnforcerReplicas
		})
		poll.Until(t, 5*time.Second, "Scaled says the cap", func() bool {
			get(t, env, plane)
			c = meta.FindStatusCondition(plane.Status.Conditions, ConditionScaled)
			return c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "--max-enforcer-replicas")
		})
		if get(t, env, victim); *victim.Spec.Replicas != 1 {
			t.Errorf("the victim went to %d replicas", *victim.Spec.Replicas)
		}
	})

	// Next to last: it empties Redis under every plane.
	t.Run("a Redis that lost its data gets the plane back, at a higher version", func(t *testing.T) {
		ns := namespace(t, env, "flushed")
		create(t, env, samples(t, ns))
		want := samplePolicy(t, ns)
		plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
		before := waitPublished(t, env, r, want, plane)
		if err := r.Client().FlushAll(ctx).Err(); err != nil { // a restart without persistence
			t.Fatal(err)
		}
		poll.Until(t, 10*time.Second, "the plane is published again, unchanged and with no object changed", func() bool {
			p := current(t, r, ns+"/main")
			return p != nil && p.Hash() == want.Hash()
		})
		if p := current(t, r, ns+"/main"); p.Version() != before+1 {
			t.Fatalf("after Redis lost version %d, it was published again as version %d; want %d: versions only grow", before, p.Version(), before+1)
		}
		poll.Until(t, 10*time.Second, "the status names the new version", func() bool {
			get(t, env, plane)
			return plane.Status.PublishedVersion == before+1
		})
	})

	// Last: it takes Redis away from the manager.
	t.Run("a publish fails while Redis is away and lands when it is back", func(t *testing.T) {
		ns := namespace(t, env, "outage")
		create(t, env, samples(t, ns))
		tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whale-1"}}
		version := waitPublished(t, env, r, samplePolicy(t, ns), tq)
		s, err := store.New(r.Client(), ns+"/main")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Report(ctx, "enforcer-a", version, 1, time.Hour); err != nil {
			t.Fatal(err)
		}
		plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
		poll.Until(t, 10*time.Second, "one enforcer runs the plane", func() bool {
			get(t, env, plane)
			c := condition(plane, v1alpha1.ConditionEnforced)
			return plane.Status.EnforcersReady == 1 && c != nil && c.Status == metav1.ConditionTrue
		})
		r.Stop()
		// The report (valid for an hour) cannot be read: no stale count.
		poll.Until(t, 20*time.Second, "the fleet is unknown while Redis is away", func() bool {
			get(t, env, plane)
			c := condition(plane, v1alpha1.ConditionEnforced)
			return plane.Status.EnforcersReady == 0 && c != nil && c.Status == metav1.ConditionUnknown && c.Reason == "FleetUnknown"
		})
		if status, _ := argoHealth(t, plane, "fleet-unknown"); status != "Degraded" {
			t.Errorf("Argo CD health while the fleet cannot be read: %s, want Degraded", status)
		}
		update(t, env, tq, func() { tq.Spec.Limit.Rate = 777 })
		poll.Until(t, 20*time.Second, "the objects say the publish failed", func() bool {
			get(t, env, tq)
			get(t, env, plane)
			c, pc := ready(tq), ready(plane)
			return c != nil && c.Reason == ReasonPublishFailed && pc != nil && pc.Reason == ReasonPublishFailed
		})
		r.Restart()
		poll.Until(t, 20*time.Second, "the edit is published once Redis is back", func() bool {
			get(t, env, tq)
			p := current(t, r, ns+"/main")
			if p == nil {
				return false
			}
			tenant, _ := p.Tenant("whale-1")
			c := ready(tq)
			return tenant.Limit != nil && tenant.Limit.Rate == 777 && c != nil && c.Status == metav1.ConditionTrue && tq.Status.PolicyVersion == p.Version()
		})
	})
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// enforcerDeployment creates a Deployment named enforcer in ns with
// replicas, labelled as quotaplane's enforcer (EnforcerLabel).
func enforcerDeployment(t *testing.T, env *testenv.Env, ns string, replicas int32) *appsv1.Deployment {
	return deployment(t, env, ns, "enforcer", replicas, map[string]string{EnforcerLabel: "true"})
}

// deployment creates a Deployment named name in ns with replicas and
// labels.
func deployment(t *testing.T, env *testenv.Env, ns, name string, replicas int32, objectLabels map[string]string) *appsv1.Deployment {
	t.Helper()
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: objectLabels},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "enforcer", Image: "quotaplane-enforcer"}}}}}}
	if err := env.Client.Create(context.Background(), dep); err != nil {
		t.Fatal(err)
	}
	return dep
}

// samplePolicy is Compile of the samples in ns.
func samplePolicy(t *testing.T, ns string) *policy.Policy {
	p, _ := policy.Compile(samples(t, ns))
	return p
}

func describe(p *policy.Policy) string {
	if p == nil {
		return "nothing"
	}
	return "version " + itoa(p.Version()) + " (hash " + p.Hash() + ")"
}
