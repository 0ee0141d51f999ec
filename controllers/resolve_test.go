package controllers

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
)

// plane is the samples of namespace ns as the API server would hold them:
// each object with a uid and generation 1.
func plane(t *testing.T, ns string) []runtime.Object {
	t.Helper()
	objs := samples(t, ns)
	for _, o := range objs {
		m := o.(client.Object)
		m.SetUID(types.UID(kindOf(o) + "/" + m.GetName()))
		m.SetGeneration(1)
	}
	return objs
}

// edit returns objs with the object kind/name replaced by a copy that
// change edits, one generation later.
func edit(objs []runtime.Object, kind, name string, change func(client.Object)) []runtime.Object {
	out := make([]runtime.Object, len(objs))
	for i, o := range objs {
		out[i] = o
		if m := o.(client.Object); kindOf(o) == kind && m.GetName() == name {
			c := m.DeepCopyObject().(client.Object)
			c.SetGeneration(m.GetGeneration() + 1)
			change(c)
			out[i] = c
		}
	}
	return out
}

// inForceOf is what resolving objs puts in force, failing when anything is
// rejected or held.
func inForceOf(t *testing.T, objs []runtime.Object) inForceSet {
	t.Helper()
	res := resolve(objs, nil)
	if res.policy == nil {
		t.Fatalf("the plane does not compile: %v", res.problems)
	}
	for key, o := range res.outcomes {
		if len(o.problems) > 0 || o.held > 0 {
			t.Fatalf("%v: %+v", key, o)
		}
	}
	return res.compiled
}

func tierIn(t *testing.T, res *resolution, tenant string) string {
	t.Helper()
	if res.policy == nil {
		t.Fatal("no policy")
	}
	tn, ok := res.policy.Tenant(tenant)
	if !ok {
		return ""
	}
	return tn.Tier
}

func TestResolveHoldsAnInvalidEdit(t *testing.T) {
	objs := plane(t, "ns")
	prev := inForceOf(t, objs)
	typo := edit(objs, "TenantQuota", "acme", func(o client.Object) { o.(*v1alpha1.TenantQuota).Spec.Tier = "standrd" })
	res := resolve(typo, prev)
	o := res.outcomes[objectKey{"TenantQuota", "acme"}]
	if o.held != 1 || len(o.problems) != 1 || !strings.Contains(o.problems[0], `tier "standrd"`) {
		t.Fatalf("acme: %+v; want held at generation 1 with the typo named", o)
	}
	if tier := tierIn(t, res, "acme"); tier != "standard" {
		t.Fatalf("acme compiled with tier %q, want standard (its last valid spec)", tier)
	}
	if rec := res.compiled[objectKey{"TenantQuota", "acme"}]; rec.generation != 1 {
		t.Fatalf("acme's record in force is generation %d, want 1 kept", rec.generation)
	}
	// Without a record (a new object), or with another uid (recreated),
	// it is left out.
	for name, prev := range map[string]inForceSet{"no record": nil, "another uid": recreated(prev, "TenantQuota", "acme")} {
		res := resolve(typo, prev)
		if o := res.outcomes[objectKey{"TenantQuota", "acme"}]; o.held != 0 || len(o.problems) == 0 {
			t.Errorf("%s: acme %+v; want left out", name, o)
		}
		if tier := tierIn(t, res, "acme"); tier != "" {
			t.Errorf("%s: acme compiled with tier %q, want left out", name, tier)
		}
	}
}

// recreated is prev with key's uid changed.
func recreated(prev inForceSet, kind, name string) inForceSet {
	out := inForceSet{}
	for k, v := range prev {
		if k == (objectKey{kind, name}) {
			v.uid = "other"
		}
		out[k] = v
	}
	return out
}

func TestResolveHoldsAnInvalidPlaneEdit(t *testing.T) {
	objs := plane(t, "ns")
	prev := inForceOf(t, objs)
	broken := edit(objs, "QuotaPlane", "main", func(o client.Object) {
		o.(*v1alpha1.QuotaPlane).Spec.Tiers[0].FloorPercent = 99 // floors add up to more than 100
	})
	broken = edit(broken, "TenantQuota", "globex", func(o client.Object) { o.(*v1alpha1.TenantQuota).Spec.Tier = "enterprise" })
	res := resolve(broken, prev)
	if o := res.outcomes[objectKey{"QuotaPlane", "main"}]; o.held != 1 || len(o.problems) == 0 {
		t.Fatalf("the plane: %+v; want held", o)
	}
	if tier := tierIn(t, res, "globex"); tier != "enterprise" {
		t.Fatalf("globex's valid edit compiled as %q; an invalid plane edit must not freeze the others", tier)
	}
}

func TestResolveTierRename(t *testing.T) {
	objs := plane(t, "ns")
	prev := inForceOf(t, objs)
	rename := func(o client.Object) {
		for i, tier := range o.(*v1alpha1.QuotaPlane).Spec.Tiers {
			if tier.Name == "standard" {
				o.(*v1alpha1.QuotaPlane).Spec.Tiers[i].Name = "premium"
			}
		}
	}
	renamed := edit(objs, "QuotaPlane", "main", rename)
	res := resolve(renamed, prev)
	o := res.outcomes[objectKey{"QuotaPlane", "main"}]
	if o.held != 1 || len(o.problems) != 0 {
		t.Fatalf("the plane: %+v; want held, its own spec valid", o)
	}
	got := strings.Join(o.orphans, "\n")
	for _, want := range []string{"TenantQuota acme", "TenantQuota globex", "TenantQuota initech", "BurstPool shared"} {
		if !strings.Contains(got, want) {
			t.Errorf("orphans %q do not name %s", got, want)
		}
	}
	if len(o.orphans) != 4 {
		t.Errorf("orphans %q; want the 3 standard tenants and the burst pool", o.orphans)
	}
	if tier := tierIn(t, res, "acme"); tier != "standard" {
		t.Fatalf("acme compiled as %q, want standard kept", tier)
	}

	// Renamed together with everything that uses it (one GitOps commit):
	// it goes through at once.
	together := renamed
	for _, name := range []string{"acme", "globex", "initech"} {
		together = edit(together, "TenantQuota", name, func(o client.Object) { o.(*v1alpha1.TenantQuota).Spec.Tier = "premium" })
	}
	together = edit(together, "BurstPool", "shared", func(o client.Object) {
		o.(*v1alpha1.BurstPool).Spec.Tiers = []string{"enterprise", "premium"}
	})
	res = resolve(together, prev)
	for key, o := range res.outcomes {
		if o.held != 0 || len(o.problems) != 0 {
			t.Errorf("%v: %+v; want the whole change in force", key, o)
		}
	}
	if tier := tierIn(t, res, "acme"); tier != "premium" {
		t.Fatalf("acme compiled as %q, want premium", tier)
	}

	// Tenants moved first, while the old plane is in force: each is held
	// (premium is not a tier yet), and the plane's rename then goes through.
	moved := objs
	for _, name := range []string{"acme", "globex", "initech"} {
		moved = edit(moved, "TenantQuota", name, func(o client.Object) { o.(*v1alpha1.TenantQuota).Spec.Tier = "premium" })
	}
	res = resolve(moved, prev)
	if o := res.outcomes[objectKey{"TenantQuota", "acme"}]; o.held != 1 {
		t.Fatalf("acme moved to premium before the plane has it: %+v; want held", o)
	}
}

func TestResolveDuplicatePlane(t *testing.T) {
	objs := plane(t, "ns")
	main := primaryPlane(objs)
	main.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	second := &v1alpha1.QuotaPlane{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a-second", UID: "second", Generation: 1,
		CreationTimestamp: metav1.NewTime(main.CreationTimestamp.Add(time.Second))},
		Spec: v1alpha1.QuotaPlaneSpec{Global: v1alpha1.Limit{Rate: 1}, Tiers: []v1alpha1.Tier{{Name: "only"}}}}
	res := resolve(append(objs, second), nil)
	if res.plane != "main" || res.policy == nil || res.policy.Plane() != "main" {
		t.Fatalf("plane %q, policy of %v; want main, the oldest", res.plane, res.policy)
	}
	if o := res.outcomes[objectKey{"QuotaPlane", "a-second"}]; o.duplicateOf != "main" {
		t.Fatalf("the second plane: %+v; want a duplicate of main", o)
	}
	// Equal timestamps: the name decides.
	second.CreationTimestamp = main.CreationTimestamp
	if res := resolve(append(objs, second), nil); res.plane != "a-second" {
		t.Fatalf("with equal creation times the plane is %q, want a-second (the first name)", res.plane)
	}
}

func TestSourcesRoundTrip(t *testing.T) {
	set := inForceOf(t, plane(t, "ns"))
	b, err := encodeSources(set)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeSources("ns", b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(set) {
		t.Fatalf("%d records back, want %d", len(got), len(set))
	}
	for key, want := range set {
		rec := got[key]
		if rec.uid != want.uid || rec.generation != want.generation || !reflect.DeepEqual(specOf(rec.obj), specOf(want.obj)) {
			t.Errorf("%v: %+v, want %+v", key, rec, want)
		}
	}
	for _, bad := range []string{"", "{", `{"format":2}`, `{"format":1,"objects":[{"kind":"Secret","name":"x","spec":{}}]}`} {
		if _, err := decodeSources("ns", []byte(bad)); err == nil {
			t.Errorf("decodeSources(%q) succeeded", bad)
		}
	}
}
