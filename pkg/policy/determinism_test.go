package policy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

const realisticTenants = 50

// realisticObjects is a plane as an operator would write it: three tiers, five
// endpoints with tier limits, 50 tenants with key and endpoint overrides, and a
// burst pool. Lists are deliberately written out of canonical order.
func realisticObjects() []runtime.Object {
	objs := []runtime.Object{
		newPlane(func(qp *v1alpha1.QuotaPlane) {
			qp.Spec.Mode = v1alpha1.ModeLocalReconciled
			qp.Spec.Fairness = v1alpha1.FairnessWFQ
			qp.Spec.FailureMode = v1alpha1.FailureAllow
			qp.Spec.ReconcileInterval = dur(50 * time.Millisecond)
			qp.Spec.Enforcer = v1alpha1.EnforcerFleet{DeploymentName: "enforcer", MinReplicas: 2, MaxReplicas: 20, TargetRatePerReplica: 40000}
		}),
		newEndpoint("read", "read"),
		newEndpoint("write", "write", func(eq *v1alpha1.EndpointQuota) {
			eq.Spec.Cost = 5
			eq.Spec.Limit = lim(500, 1000)
			eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{
				{Tier: "silver", Limit: *lim(200, 400)},
				{Tier: "bronze", Limit: *lim(50, 50)},
			}
		}),
		newEndpoint("export", "export", func(eq *v1alpha1.EndpointQuota) {
			eq.Spec.Cost = 50
			eq.Spec.Limit = limPer(1000, 500, time.Minute)
			eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{
				{Tier: "gold", Limit: *limPer(5000, 2000, time.Minute)},
				{Tier: "bronze", Limit: v1alpha1.Limit{Rate: 100, Period: dur(300 * time.Second), Algorithm: v1alpha1.SlidingWindow}},
			}
		}),
		newEndpoint("search-v2", "search", func(eq *v1alpha1.EndpointQuota) {
			eq.Spec.Cost = 2
			eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{{Tier: "gold", Limit: *lim(3000, 0)}}
		}),
		newEndpoint("delete", "delete", func(eq *v1alpha1.EndpointQuota) {
			eq.Spec.Cost = 10
			eq.Spec.Limit = &v1alpha1.Limit{Rate: 20, Period: dur(time.Minute), Algorithm: v1alpha1.SlidingWindow}
		}),
		newPool("shared", func(bp *v1alpha1.BurstPool) { bp.Spec.Tiers = []string{"silver", "gold"} }),
	}
	tiers := []string{"gold", "silver", "bronze", ""}
	for i := range realisticTenants {
		// Object names and tenant ids sort differently, so the compiler's
		// order cannot come from the object names.
		tenant := fmt.Sprintf("tenant-%02d", (i*37)%realisticTenants)
		tq := newTenant(fmt.Sprintf("tq-%02d", i), tenant, tiers[i%len(tiers)])
		if i%3 == 0 {
			tq.Spec.Keys = []v1alpha1.KeyQuota{
				{Key: tenant + "-z", Limit: *lim(int64(10+i), 0)},
				{Key: tenant + "-a", Limit: *lim(int64(20+i), int64(40+i))},
				{Key: tenant + "-m", Limit: *limPer(1, 5, time.Hour)},
			}
		}
		if i%4 == 1 {
			tq.Spec.Endpoints = []v1alpha1.TenantEndpointQuota{
				{Endpoint: "write", Limit: *lim(int64(100+i), 0)},
				{Endpoint: "export", Limit: *limPer(int64(2000+i), 1000, time.Minute)},
			}
		}
		if i%5 == 0 {
			tq.Spec.Limit = lim(int64(1000+i), int64(3000+i))
		}
		if i%7 == 0 {
			w := int64(1 + i)
			tq.Spec.Weight = &w
		}
		if i%6 == 0 {
			hard := i%12 == 0
			tq.Spec.Hard = &hard
		}
		objs = append(objs, tq)
	}
	return objs
}

// pick returns the object of type T named name.
func pick[T interface {
	runtime.Object
	metav1.Object
}](t testing.TB, objs []runtime.Object, name string) T {
	t.Helper()
	for _, o := range objs {
		if x, ok := o.(T); ok && x.GetName() == name {
			return x
		}
	}
	var zero T
	t.Fatalf("no %T named %q", zero, name)
	return zero
}

func deepCopyAll(objs []runtime.Object) []runtime.Object {
	out := make([]runtime.Object, len(objs))
	for i, o := range objs {
		out[i] = o.DeepCopyObject()
	}
	return out
}

func TestRealisticObjectsCompileToTheExpectedShape(t *testing.T) {
	p := mustCompile(t, realisticObjects()...)
	if got := len(p.Spec().Tenants); got != realisticTenants {
		t.Errorf("tenants = %d, want %d", got, realisticTenants)
	}
	if got, want := endpointNames(p), []string{"delete", "export", "read", "search", "write"}; !slices.Equal(got, want) {
		t.Errorf("endpoints = %v, want %v", got, want)
	}
	if got, want := tierOrder(p), []string{"gold", "silver", "bronze"}; !slices.Equal(got, want) {
		t.Errorf("tiers = %v, want %v", got, want)
	}
	if got, want := p.Spec().BurstPool.Tiers, []string{"gold", "silver"}; !slices.Equal(got, want) {
		t.Errorf("pool tiers = %v, want %v", got, want)
	}
	// tq-00 is tenant-00: gold, keys reordered, limit and weight overridden, hard.
	got, ok := p.Tenant("tenant-00")
	if !ok {
		t.Fatal("tenant-00 missing")
	}
	want := policy.Tenant{
		Name: "tenant-00", Tier: "gold", Limit: tb(1000, 3000, time.Second), Weight: 1, Hard: true, Known: true,
		Keys: []policy.KeyLimit{
			{Key: "tenant-00-a", Limit: *tb(20, 40, time.Second)},
			{Key: "tenant-00-m", Limit: *tb(1, 5, time.Hour)},
			{Key: "tenant-00-z", Limit: *tb(10, 10, time.Second)},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tenant-00 =\n%+v\nwant\n%+v", got, want)
	}
	// tq-01 is tenant-37: silver with endpoint overrides sorted by endpoint.
	got, _ = p.Tenant("tenant-37")
	wantEndpoints := []policy.EndpointLimit{
		{Endpoint: "export", Limit: *tb(2001, 1000, time.Minute)},
		{Endpoint: "write", Limit: *tb(101, 101, time.Second)},
	}
	if got.Tier != "silver" || !reflect.DeepEqual(got.Endpoints, wantEndpoints) {
		t.Errorf("tenant-37 = %+v, want tier silver and endpoints %+v", got, wantEndpoints)
	}
	// tq-03 names no tier: it gets the default tier, bronze.
	if got, _ := p.Tenant(fmt.Sprintf("tenant-%02d", (3*37)%realisticTenants)); got.Tier != "bronze" || !got.Hard {
		t.Errorf("tenant of tq-03 = %+v, want the default tier bronze (hard)", got)
	}
}

func TestCompileIsIndependentOfObjectOrder(t *testing.T) {
	objs := realisticObjects()
	pristine := deepCopyAll(objs)
	want := mustCompile(t, objs...)
	wantEncoded, wantSpec, wantHash := want.Encode(), want.EncodedSpec(), want.Hash()
	if len(wantHash) != 64 {
		t.Fatalf("hash %q is not a hex SHA-256", wantHash)
	}

	rng := rand.New(rand.NewPCG(2026, 1))
	perm := slices.Clone(objs)
	for i := range 200 {
		rng.Shuffle(len(perm), func(a, b int) { perm[a], perm[b] = perm[b], perm[a] })
		p, problems := policy.Compile(perm)
		if p == nil || len(problems) > 0 {
			t.Fatalf("permutation %d: policy %v, problems:\n%s", i, p, problemList(problems))
		}
		if p.Hash() != wantHash {
			t.Fatalf("permutation %d: hash %s, want %s", i, p.Hash(), wantHash)
		}
		if !bytes.Equal(p.Encode(), wantEncoded) {
			t.Fatalf("permutation %d: Encode differs:\n%s\nwant\n%s", i, p.Encode(), wantEncoded)
		}
		if !bytes.Equal(p.EncodedSpec(), wantSpec) {
			t.Fatalf("permutation %d: EncodedSpec differs", i)
		}
	}
	if !reflect.DeepEqual(objs, pristine) {
		t.Error("Compile modified its input objects")
	}
}

func TestCompileProblemsAreIndependentOfObjectOrder(t *testing.T) {
	objs := append(realisticObjects(),
		newTenant("dup-of-tenant-01", "tenant-01", "gold"),
		newTenant("bad-tier", "lost", "platinum"),
		newEndpoint("read-again", "read"),
		newPool("another"),
		newEndpoint("elsewhere", "elsewhere", func(eq *v1alpha1.EndpointQuota) { eq.Namespace = "other" }),
	)
	want, wantProblems := policy.Compile(objs)
	if want == nil || len(wantProblems) != 5 {
		t.Fatalf("policy %v, problems (want 5):\n%s", want, problemList(wantProblems))
	}
	rng := rand.New(rand.NewPCG(7, 7))
	perm := slices.Clone(objs)
	for i := range 200 {
		rng.Shuffle(len(perm), func(a, b int) { perm[a], perm[b] = perm[b], perm[a] })
		p, problems := policy.Compile(perm)
		if p == nil || p.Hash() != want.Hash() {
			t.Fatalf("permutation %d: policy %v, want hash %s", i, p, want.Hash())
		}
		if !reflect.DeepEqual(problems, wantProblems) {
			t.Fatalf("permutation %d: problems\n%s\nwant\n%s", i, problemList(problems), problemList(wantProblems))
		}
	}
}

func TestChangingOneFieldChangesTheHash(t *testing.T) {
	base := mustCompile(t, realisticObjects()...).Hash()
	tests := []struct {
		name   string
		mutate func(t *testing.T, objs []runtime.Object) []runtime.Object
	}{
		{"key override rate", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.TenantQuota](t, objs, "tq-03").Spec.Keys[0].Limit.Rate++
			return objs
		}},
		{"endpoint override period", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.TenantQuota](t, objs, "tq-05").Spec.Endpoints[1].Limit.Period = dur(2 * time.Minute)
			return objs
		}},
		{"tenant tier", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.TenantQuota](t, objs, "tq-02").Spec.Tier = "gold"
			return objs
		}},
		{"tenant id", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.TenantQuota](t, objs, "tq-02").Spec.Tenant = "renamed"
			return objs
		}},
		{"tenant hard flag", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			hard := false
			pick[*v1alpha1.TenantQuota](t, objs, "tq-00").Spec.Hard = &hard
			return objs
		}},
		{"endpoint cost", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.EndpointQuota](t, objs, "read").Spec.Cost = 2
			return objs
		}},
		{"endpoint tier limit algorithm", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.EndpointQuota](t, objs, "write").Spec.Tiers[0].Limit.Algorithm = v1alpha1.SlidingWindow
			return objs
		}},
		{"global burst", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.QuotaPlane](t, objs, "main").Spec.Global.Burst = 20001
			return objs
		}},
		{"tier floor", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.QuotaPlane](t, objs, "main").Spec.Tiers[2].FloorPercent = 6
			return objs
		}},
		{"plane fairness", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.QuotaPlane](t, objs, "main").Spec.Fairness = v1alpha1.FairnessDRR
			return objs
		}},
		{"enforcer max replicas", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.QuotaPlane](t, objs, "main").Spec.Enforcer.MaxReplicas = 21
			return objs
		}},
		{"pool refill rate", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.BurstPool](t, objs, "shared").Spec.RefillRate = 501
			return objs
		}},
		{"pool removed", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			return slices.DeleteFunc(objs, func(o runtime.Object) bool { _, ok := o.(*v1alpha1.BurstPool); return ok })
		}},
		{"tenant added", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			return append(objs, newTenant("tq-new", "newcomer", "silver"))
		}},
		{"tenant priority importance", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.TenantQuota](t, objs, "tq-02").Spec.Priority = &v1alpha1.TenantPriority{Importance: 1}
			return objs
		}},
		{"tenant priority realtime", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.TenantQuota](t, objs, "tq-02").Spec.Priority = &v1alpha1.TenantPriority{Realtime: true}
			return objs
		}},
		{"tier priority base", func(t *testing.T, objs []runtime.Object) []runtime.Object {
			pick[*v1alpha1.QuotaPlane](t, objs, "main").Spec.Tiers[1].PriorityBase = ptr[int64](41)
			return objs
		}},
	}
	seen := map[string]string{base: "base"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, tt.mutate(t, realisticObjects())...)
			if prev, dup := seen[p.Hash()]; dup {
				t.Fatalf("hash %s equals the hash of %q", p.Hash(), prev)
			}
			seen[p.Hash()] = tt.name
		})
	}
}

func TestEquivalentObjectsHaveTheSameHash(t *testing.T) {
	base := mustCompile(t, realisticObjects()...)
	tests := []struct {
		name   string
		mutate func(t *testing.T, objs []runtime.Object)
	}{
		{"defaults spelt out", func(t *testing.T, objs []runtime.Object) {
			qp := pick[*v1alpha1.QuotaPlane](t, objs, "main")
			qp.Spec.Global.Period = dur(time.Second)
			qp.Spec.Global.Algorithm = v1alpha1.TokenBucket
			qp.Spec.DefaultTier = "bronze"
			qp.Spec.UnknownTenants = v1alpha1.UnknownDefault
			qp.Spec.UnknownEndpoints = v1alpha1.UnknownDefault
			pick[*v1alpha1.EndpointQuota](t, objs, "read").Spec.Cost = 1
			pick[*v1alpha1.EndpointQuota](t, objs, "search-v2").Spec.Tiers[0].Limit.Burst = 3000
			pick[*v1alpha1.TenantQuota](t, objs, "tq-03").Spec.Tier = "bronze"
			pick[*v1alpha1.TenantQuota](t, objs, "tq-03").Spec.Keys[0].Limit.Burst = 13
		}},
		{"sliding window burst is ignored", func(t *testing.T, objs []runtime.Object) {
			pick[*v1alpha1.EndpointQuota](t, objs, "delete").Spec.Limit.Burst = 999
		}},
		{"object metadata and status", func(t *testing.T, objs []runtime.Object) {
			tq := pick[*v1alpha1.TenantQuota](t, objs, "tq-07")
			tq.Labels = map[string]string{"team": "a"}
			tq.ResourceVersion = "12345"
			tq.Generation = 3
			tq.Status.PolicyVersion = 9
			pick[*v1alpha1.QuotaPlane](t, objs, "main").Status.PublishedHash = "stale"
		}},
		{"TenantQuota object renamed", func(t *testing.T, objs []runtime.Object) {
			pick[*v1alpha1.TenantQuota](t, objs, "tq-07").Name = "renamed"
		}},
		{"list order inside objects", func(t *testing.T, objs []runtime.Object) {
			slices.Reverse(pick[*v1alpha1.TenantQuota](t, objs, "tq-09").Spec.Keys)
			slices.Reverse(pick[*v1alpha1.TenantQuota](t, objs, "tq-09").Spec.Endpoints)
			slices.Reverse(pick[*v1alpha1.EndpointQuota](t, objs, "export").Spec.Tiers)
			slices.Reverse(pick[*v1alpha1.QuotaPlane](t, objs, "main").Spec.Tiers)
			slices.Reverse(pick[*v1alpha1.BurstPool](t, objs, "shared").Spec.Tiers)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := realisticObjects()
			tt.mutate(t, objs)
			p := mustCompile(t, objs...)
			if p.Hash() != base.Hash() || !bytes.Equal(p.EncodedSpec(), base.EncodedSpec()) {
				t.Errorf("hash %s, want %s", p.Hash(), base.Hash())
			}
		})
	}
}

func TestWithVersionKeepsTheHashAndTheOriginal(t *testing.T) {
	p := mustCompile(t, realisticObjects()...)
	before := p.Encode()
	hash := p.Hash()

	v := p.WithVersion(42)
	if v == p {
		t.Fatal("WithVersion returned the receiver, want a copy")
	}
	if v.Version() != 42 {
		t.Errorf("copy version = %d, want 42", v.Version())
	}
	if p.Version() != 0 {
		t.Errorf("original version = %d, want 0", p.Version())
	}
	if v.Hash() != hash || p.Hash() != hash {
		t.Errorf("hashes %s / %s, want %s", v.Hash(), p.Hash(), hash)
	}
	if !bytes.Equal(p.Encode(), before) {
		t.Errorf("original encoding changed:\n%s\nwant\n%s", p.Encode(), before)
	}
	if !bytes.Equal(v.EncodedSpec(), p.EncodedSpec()) {
		t.Error("EncodedSpec differs between versions")
	}
	want := bytes.Replace(before, []byte(`{"version":0,`), []byte(`{"version":42,`), 1)
	if !bytes.Equal(v.Encode(), want) {
		t.Errorf("Encode of version 42 =\n%s\nwant\n%s", v.Encode(), want)
	}
	if v.WithVersion(43).Version() != 43 || v.Version() != 42 {
		t.Error("WithVersion on a copy changed the copy")
	}
}

func TestEncodeIsTheDocumentedEnvelope(t *testing.T) {
	p := mustCompile(t, realisticObjects()...).WithVersion(7)
	var env struct {
		Version int64           `json:"version"`
		Hash    string          `json:"hash"`
		Spec    json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(p.Encode(), &env); err != nil {
		t.Fatalf("Encode is not JSON: %v", err)
	}
	if env.Version != 7 || env.Hash != p.Hash() || !bytes.Equal(env.Spec, p.EncodedSpec()) {
		t.Errorf("envelope = version %d hash %s, want 7 %s and the encoded spec", env.Version, env.Hash, p.Hash())
	}
	// The hash covers exactly the spec bytes.
	if got := encodeSpec(t, 7, p.Spec()); !bytes.Equal(got, p.Encode()) {
		t.Errorf("re-encoding the spec gives\n%s\nwant\n%s", got, p.Encode())
	}
}

func TestEncodedSpecIsACopy(t *testing.T) {
	p := mustCompile(t, newPlane())
	b := p.EncodedSpec()
	want := string(b)
	for i := range b {
		b[i] = 'x'
	}
	if got := string(p.EncodedSpec()); got != want {
		t.Errorf("modifying the returned slice changed the policy: %s", got)
	}
	if q, err := policy.Decode(p.Encode()); err != nil || q.Hash() != p.Hash() {
		t.Errorf("Decode after modifying EncodedSpec: %v", err)
	}
}
