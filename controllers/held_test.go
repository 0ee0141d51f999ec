package controllers

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// tierOf is the tier tenant has in the policy Redis holds for plane ("" when
// the tenant is not in it).
func tierOf(t *testing.T, r *redistest.Server, plane, tenant string) string {
	t.Helper()
	p := current(t, r, plane)
	if p == nil {
		return ""
	}
	tn, ok := p.Tenant(tenant)
	if !ok {
		return ""
	}
	return tn.Tier
}

// condition is obj's condition of type (nil when unset).
func condition(obj client.Object, typ string) *metav1.Condition {
	if qp, ok := obj.(*v1alpha1.QuotaPlane); ok {
		return meta.FindStatusCondition(qp.Status.Conditions, typ)
	}
	return meta.FindStatusCondition(statusOf(obj).Conditions, typ)
}

// testTypoIsHeld: a typo in a tenant's tier keeps the tenant's last valid
// version in force (issue 13: it dropped acme to the free tier at once).
func testTypoIsHeld(t *testing.T, env *testenv.Env, r *redistest.Server) {
	ns := namespace(t, env, "typo")
	create(t, env, samples(t, ns))
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
	acme := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "acme"}}
	version := waitPublished(t, env, r, samplePolicy(t, ns), acme)
	good := acme.Generation

	update(t, env, acme, func() { acme.Spec.Tier = "standrd" })
	poll.Until(t, 10*time.Second, "acme is Held", func() bool {
		get(t, env, acme)
		c := ready(acme)
		return c != nil && c.Reason == ReasonHeld && acme.Status.ObservedGeneration == acme.Generation
	})
	c := ready(acme)
	for _, want := range []string{`tier "standrd" is not one of the plane's tiers`, "enterprise, free, standard", "the last valid version (generation " + itoa(good) + ") stays in force until this is fixed"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("acme's condition %q does not say %q", c.Message, want)
		}
	}
	if c.Status != metav1.ConditionFalse || acme.Status.PolicyVersion != version {
		t.Errorf("acme: Ready %s, policyVersion %d; want False and the version in force, %d", c.Status, acme.Status.PolicyVersion, version)
	}
	if tier := tierOf(t, r, ns+"/main", "acme"); tier != "standard" {
		t.Fatalf("acme's tier in Redis is %q; the last valid version (standard) must stay in force", tier)
	}
	captureObject(t, acme, "tenantquota-degraded-held")
	poll.Until(t, 10*time.Second, "the plane counts one held object", func() bool {
		get(t, env, plane)
		return plane.Status.HeldObjects == 1 && plane.Status.RejectedObjects == 0
	})
	if status, msg := argoHealth(t, plane, "held"); status != "Degraded" || !strings.Contains(msg, "1 held") {
		t.Errorf("Argo CD health of a plane with a held tenant: %s %q; want Degraded naming it", status, msg)
	}
	waitEvent(t, env, ns, corev1.EventTypeWarning, "Held", "acme")

	// Another, valid edit of the same tenant is what is published then.
	update(t, env, acme, func() { acme.Spec.Tier = "enterprise" })
	poll.Until(t, 10*time.Second, "the fixed tenant is published", func() bool {
		get(t, env, acme)
		c := ready(acme)
		return c != nil && c.Status == metav1.ConditionTrue && tierOf(t, r, ns+"/main", "acme") == "enterprise"
	})
	captureObject(t, acme, "tenantquota-healthy-published")
	poll.Until(t, 10*time.Second, "the plane counts no held object", func() bool {
		get(t, env, plane)
		return plane.Status.HeldObjects == 0
	})

	// A brand-new invalid object is still simply left out.
	bad := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "newco"},
		Spec: v1alpha1.TenantQuotaSpec{Tenant: "newco", Tier: "standrd"}}
	if err := env.Client.Create(context.Background(), bad); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the new invalid object is Invalid and counted as rejected", func() bool {
		get(t, env, bad)
		get(t, env, plane)
		c := ready(bad)
		return c != nil && c.Reason == ReasonInvalid && plane.Status.RejectedObjects == 1
	})
	captureObject(t, bad, "tenantquota-degraded-invalid")
	if tier := tierOf(t, r, ns+"/main", "newco"); tier != "" {
		t.Fatalf("a never-valid tenant is in the policy with tier %q", tier)
	}
	// Deleted and created again under the same name, an object is new: its
	// old generations are not held for it.
	if err := env.Client.Delete(context.Background(), acme); err != nil {
		t.Fatal(err)
	}
	again := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "acme"},
		Spec: v1alpha1.TenantQuotaSpec{Tenant: "acme", Tier: "standrd"}}
	poll.Until(t, 10*time.Second, "acme recreated", func() bool {
		return env.Client.Create(context.Background(), again.DeepCopy()) == nil
	})
	poll.Until(t, 10*time.Second, "the recreated invalid acme is Invalid, not Held", func() bool {
		get(t, env, again)
		c := ready(again)
		return c != nil && c.Reason == ReasonInvalid && c.ObservedGeneration == again.Generation && tierOf(t, r, ns+"/main", "acme") == ""
	})
}

// testTierRenameIsHeld: renaming a tier that tenants and the burst pool use
// is held (the plane's last valid spec stays in force, naming them) until
// they move; moving them lets the rename through.
func testTierRenameIsHeld(t *testing.T, env *testenv.Env, r *redistest.Server) {
	ns := namespace(t, env, "rename-tier")
	create(t, env, samples(t, ns))
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
	version := waitPublished(t, env, r, samplePolicy(t, ns), plane)
	good := plane.Generation

	update(t, env, plane, func() {
		for i := range plane.Spec.Tiers {
			if plane.Spec.Tiers[i].Name == "standard" {
				plane.Spec.Tiers[i].Name = "premium"
			}
		}
	})
	poll.Until(t, 10*time.Second, "the plane is Held", func() bool {
		get(t, env, plane)
		c := ready(plane)
		return c != nil && c.Reason == ReasonHeld && c.ObservedGeneration == plane.Generation
	})
	c := ready(plane)
	for _, want := range []string{"would take objects in force out of the policy", "TenantQuota acme", "TenantQuota globex", "TenantQuota initech", "BurstPool shared",
		"the last valid version (generation " + itoa(good) + ") stays in force"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("the plane's condition %q does not say %q", c.Message, want)
		}
	}
	if strings.Contains(c.Message, "whale-1") {
		t.Errorf("the plane's condition %q names an enterprise tenant the rename does not touch", c.Message)
	}
	if p := current(t, r, ns+"/main"); p == nil || p.Version() != version {
		t.Fatalf("Redis holds %s; the held rename must publish nothing new (version %d)", describe(p), version)
	}
	for _, tenant := range []string{"acme", "globex", "initech"} {
		if tier := tierOf(t, r, ns+"/main", tenant); tier != "standard" {
			t.Fatalf("%s's tier in Redis is %q, want standard kept", tenant, tier)
		}
	}
	poll.Until(t, 10*time.Second, "the plane counts itself held", func() bool {
		get(t, env, plane)
		return plane.Status.HeldObjects == 1
	})
	if status, _ := argoHealth(t, plane, "tier-rename"); status != "Degraded" {
		t.Errorf("Argo CD health of a held plane: %s, want Degraded", status)
	}

	// Move them (each one alone is held meanwhile: premium is not a tier
	// of the plane in force), then the rename goes through.
	for _, name := range []string{"acme", "globex", "initech"} {
		tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		update(t, env, tq, func() { tq.Spec.Tier = "premium" })
	}
	bp := &v1alpha1.BurstPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shared"}}
	update(t, env, bp, func() { bp.Spec.Tiers = []string{"enterprise", "premium"} })
	poll.Until(t, 20*time.Second, "the rename and the moves are published", func() bool {
		get(t, env, plane)
		c := ready(plane)
		return c != nil && c.Status == metav1.ConditionTrue && plane.Status.HeldObjects == 0 &&
			tierOf(t, r, ns+"/main", "acme") == "premium" && tierOf(t, r, ns+"/main", "initech") == "premium"
	})
	if p := current(t, r, ns+"/main"); p.Spec().BurstPool == nil || !strings.Contains(strings.Join(p.Spec().BurstPool.Tiers, ","), "premium") {
		t.Fatalf("the burst pool in Redis is %+v, want it to name premium", p.Spec().BurstPool)
	}
}

// testDuplicatePlane: a second QuotaPlane gets Ready=False, reason
// Duplicate, naming the one in force, and the first keeps publishing.
func testDuplicatePlane(t *testing.T, env *testenv.Env, r *redistest.Server) {
	ctx := context.Background()
	ns := namespace(t, env, "duplicate")
	create(t, env, samples(t, ns))
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
	version := waitPublished(t, env, r, samplePolicy(t, ns), plane)
	// Its name sorts first: the oldest is in force, not the first by name.
	second := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a-second"},
		Spec: v1alpha1.QuotaPlaneSpec{Global: v1alpha1.Limit{Rate: 1}, Tiers: []v1alpha1.Tier{{Name: "only"}}}}
	poll.Until(t, 10*time.Second, "a second later", func() bool {
		// creationTimestamp has whole seconds: make the second one younger.
		get(t, env, plane)
		return time.Since(plane.CreationTimestamp.Time) > time.Second
	})
	if err := env.Client.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the second plane says Duplicate", func() bool {
		get(t, env, second)
		c := ready(second)
		return c != nil && c.Reason == ReasonDuplicate
	})
	if c := ready(second); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "QuotaPlane main is this namespace's plane") {
		t.Errorf("the second plane's condition: %+v; want False naming main", c)
	}
	tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whale-1"}}
	update(t, env, tq, func() { tq.Spec.Limit.Rate = 4321 })
	poll.Until(t, 10*time.Second, "the first plane keeps publishing", func() bool {
		p := current(t, r, ns+"/main")
		tn, _ := p.Tenant("whale-1")
		get(t, env, plane)
		c := ready(plane)
		return p.Version() == version+1 && tn.Limit != nil && tn.Limit.Rate == 4321 &&
			c != nil && c.Status == metav1.ConditionTrue && plane.Status.PublishedVersion == version+1 && plane.Status.RejectedObjects == 1
	})
	if s, err := store.New(r.Client(), ns+"/a-second"); err != nil {
		t.Fatal(err)
	} else if _, err := s.Current(ctx); err == nil {
		t.Fatal("the second plane was published")
	}
	if c := condition(second, v1alpha1.ConditionEnforced); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "NotPublished" {
		t.Errorf("the second plane's Enforced condition: %+v; want False, NotPublished", c)
	}
	if err := env.Client.Delete(ctx, second); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the plane counts nothing rejected", func() bool {
		get(t, env, plane)
		return plane.Status.RejectedObjects == 0
	})
}

// testEnforced: Ready says published, Enforced says the fleet runs it; the
// Argo CD health check follows Enforced. Reports that lapse stop counting.
func testEnforced(t *testing.T, env *testenv.Env, r *redistest.Server) {
	ctx := context.Background()
	ns := namespace(t, env, "enforced")
	create(t, env, samples(t, ns))
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
	version := waitPublished(t, env, r, samplePolicy(t, ns), plane)
	enforced := func(status metav1.ConditionStatus, reason string) func() bool {
		return func() bool {
			get(t, env, plane)
			c := condition(plane, v1alpha1.ConditionEnforced)
			return c != nil && c.Status == status && c.Reason == reason && c.ObservedGeneration == plane.Generation
		}
	}
	poll.Until(t, 10*time.Second, "Ready, but not Enforced: no enforcer reports", enforced(metav1.ConditionFalse, "NoEnforcers"))
	if c := ready(plane); c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v; want True (published)", c)
	}
	if c := condition(plane, v1alpha1.ConditionReconciling); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Reconciling %+v; want True while no enforcer runs the version", c)
	}
	if status, _ := argoHealth(t, plane, "no-enforcers"); status != "Progressing" {
		t.Errorf("Argo CD health with no enforcer: %s, want Progressing", status)
	}
	s, err := store.New(r.Client(), ns+"/main")
	if err != nil {
		t.Fatal(err)
	}
	report := func(id string, v int64, ttl time.Duration) {
		if err := s.Report(ctx, id, v, 10, ttl); err != nil {
			t.Fatal(err)
		}
	}
	report("enforcer-a", version, time.Minute)
	report("enforcer-b", version-1, time.Minute) // still on the version before
	poll.Until(t, 10*time.Second, "rolling out", enforced(metav1.ConditionFalse, "RollingOut"))
	if c := condition(plane, v1alpha1.ConditionEnforced); !strings.Contains(c.Message, "1 of 2 enforcers run version "+itoa(version)) || !strings.Contains(c.Message, "enforcer-b (version "+itoa(version-1)+")") {
		t.Errorf("Enforced message %q; want it to count and name the lagging enforcer", c.Message)
	}
	if plane.Status.EnforcersReady != 1 || plane.Status.Enforcers != 2 {
		t.Errorf("enforcersReady %d of %d; want 1 of 2", plane.Status.EnforcersReady, plane.Status.Enforcers)
	}
	if status, _ := argoHealth(t, plane, "rolling-out"); status != "Progressing" {
		t.Errorf("Argo CD health while rolling out: %s, want Progressing", status)
	}
	report("enforcer-b", version, time.Minute)
	poll.Until(t, 10*time.Second, "enforced", enforced(metav1.ConditionTrue, "Enforced"))
	if c := condition(plane, v1alpha1.ConditionReconciling); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Reconciling %+v; want False once enforced", c)
	}
	if c := condition(plane, v1alpha1.ConditionStalled); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Stalled %+v; want False", c)
	}
	if status, msg := argoHealth(t, plane, "enforced"); status != "Healthy" {
		t.Errorf("Argo CD health once enforced: %s %q, want Healthy", status, msg)
	}

	// An edit: Ready at once with the next version, Enforced only when the
	// fleet reports it.
	tq := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "whale-1"}}
	update(t, env, tq, func() { tq.Spec.Limit.Rate = 2500 })
	poll.Until(t, 10*time.Second, "the next version is published and not yet enforced", func() bool {
		return enforced(metav1.ConditionFalse, "RollingOut")() && plane.Status.PublishedVersion == version+1
	})
	report("enforcer-a", version+1, time.Minute)
	report("enforcer-b", version+1, 300*time.Millisecond) // then it stops
	poll.Until(t, 10*time.Second, "enforced at the next version", enforced(metav1.ConditionTrue, "Enforced"))
	// enforcer-b's report lapses: it no longer counts.
	poll.Until(t, 10*time.Second, "a lapsed report stops counting", func() bool {
		get(t, env, plane)
		return plane.Status.Enforcers == 1 && plane.Status.EnforcersReady == 1
	})
}

// testLocalModeOneReplica: the manager keeps a mode local plane at one
// enforcer whatever its spec asks, and says why.
func testLocalModeOneReplica(t *testing.T, env *testenv.Env, r *redistest.Server) {
	ctx := context.Background()
	ns := namespace(t, env, "local-mode")
	objs := samples(t, ns)
	for _, o := range objs {
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
			qp.Spec.Mode = v1alpha1.ModeLocal
			qp.Spec.Enforcer = v1alpha1.EnforcerFleet{DeploymentName: "enforcer", MinReplicas: 2, MaxReplicas: 8}
		}
	}
	create(t, env, objs)
	dep := enforcerDeployment(t, env, ns, 3)
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
	poll.Until(t, 20*time.Second, "a local plane's 3 enforcers are scaled down to 1 at once", func() bool {
		get(t, env, dep)
		get(t, env, plane)
		c := condition(plane, ConditionScaled)
		return *dep.Spec.Replicas == 1 && c != nil && c.Reason == "LocalMode" && plane.Status.Replicas == 1
	})
	if c := condition(plane, ConditionScaled); !strings.Contains(c.Message, "N times each limit") || !strings.Contains(c.Message, "central or local-reconciled") {
		t.Errorf("Scaled message %q; want it to say limits multiply and how to scale", c.Message)
	}
	// Two enforcers still report (the second is stopping): the condition
	// says by how much the limits are multiplied now.
	want, _ := policy.Compile(objs)
	version := waitPublished(t, env, r, want, plane)
	s, err := store.New(r.Client(), ns+"/main")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"e1", "e2"} {
		if err := s.Report(ctx, id, version, 1, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	poll.Until(t, 10*time.Second, "the multiplication is named", func() bool {
		get(t, env, plane)
		c := condition(plane, ConditionScaled)
		return c != nil && strings.Contains(c.Message, "2 enforcers run the plane now, admitting up to 2 times each limit")
	})
	// Switched to a distributed mode, the fleet scales to its minimum.
	update(t, env, plane, func() { plane.Spec.Mode = v1alpha1.ModeCentral })
	poll.Until(t, 20*time.Second, "a central plane gets minReplicas", func() bool {
		get(t, env, dep)
		return *dep.Spec.Replicas == 2
	})
}

// TestManagerRestart: what a manager must not forget across a restart. The
// spec in force of an object whose edit is invalid comes back from Redis
// (stored beside the version), and after Redis lost its data as well the
// next version still exceeds the one the QuotaPlane's status recorded.
func TestManagerRestart(t *testing.T) {
	env := testenv.Start(t)
	r := redistest.Start(t)
	ctx := context.Background()
	ns := namespace(t, env, "restart")
	create(t, env, samples(t, ns))
	plane := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "main"}}
	acme := &v1alpha1.TenantQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "acme"}}

	first := startManager(t, env, r, false)
	version := waitPublished(t, env, r, samplePolicy(t, ns), acme)
	good := acme.Generation
	poll.Until(t, 10*time.Second, "the plane's status records the version", func() bool {
		get(t, env, plane)
		return plane.Status.PublishedVersion == version
	})
	first.stop()

	// The typo lands while no manager runs: the next one has never seen
	// acme's valid generation.
	update(t, env, acme, func() { acme.Spec.Tier = "standrd" })
	second := startManager(t, env, r, false)
	poll.Until(t, 20*time.Second, "the restarted manager holds acme's last valid version", func() bool {
		get(t, env, acme)
		c := ready(acme)
		return c != nil && c.Reason == ReasonHeld && c.ObservedGeneration == acme.Generation
	})
	if c := ready(acme); !strings.Contains(c.Message, "(generation "+itoa(good)+")") {
		t.Errorf("acme's condition %q; want it to name generation %d", c.Message, good)
	}
	if tier := tierOf(t, r, ns+"/main", "acme"); tier != "standard" {
		t.Fatalf("after the restart acme's tier in Redis is %q, want standard kept", tier)
	}
	if p := current(t, r, ns+"/main"); p.Version() != version {
		t.Fatalf("the restarted manager published version %d; nothing changed, want %d", p.Version(), version)
	}
	second.stop()

	// Redis loses everything while no manager runs: the only record of the
	// version is the QuotaPlane's status.
	if err := r.Client().FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	startManager(t, env, r, false)
	poll.Until(t, 20*time.Second, "the plane is published again above the recorded version", func() bool {
		p := current(t, r, ns+"/main")
		return p != nil && p.Version() == version+1
	})
	poll.Until(t, 10*time.Second, "the status records it", func() bool {
		get(t, env, plane)
		return plane.Status.PublishedVersion == version+1
	})
	// The specs in force went with Redis's data and this manager's memory
	// (see controllers/doc.go): acme's invalid edit is now left out.
	poll.Until(t, 10*time.Second, "acme is left out", func() bool {
		get(t, env, acme)
		c := ready(acme)
		return c != nil && c.Reason == ReasonInvalid
	})
}
