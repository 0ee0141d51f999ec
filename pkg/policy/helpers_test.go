package policy_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// testNS is the namespace of the plane the tests build.
const testNS = "quota"

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: testNS, Name: name}
}

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// lim is a token-bucket API limit with the default period.
func lim(rate, burst int64) *v1alpha1.Limit {
	return &v1alpha1.Limit{Rate: rate, Burst: burst}
}

// limPer is a token-bucket API limit with an explicit period.
func limPer(rate, burst int64, period time.Duration) *v1alpha1.Limit {
	return &v1alpha1.Limit{Rate: rate, Burst: burst, Period: dur(period)}
}

// tb is the compiled token bucket the tests expect.
func tb(rate, burst int64, period time.Duration) *policy.Limit {
	return &policy.Limit{Rate: rate, Burst: burst, Period: period, Algorithm: policy.TokenBucket}
}

// newPlane is a valid plane with three tiers (gold, silver, bronze; bronze is
// hard and, having the lowest weight, the default tier). Mutators adjust it.
func newPlane(mut ...func(*v1alpha1.QuotaPlane)) *v1alpha1.QuotaPlane {
	qp := &v1alpha1.QuotaPlane{
		TypeMeta:   metav1.TypeMeta{APIVersion: "quotaplane.io/v1alpha1", Kind: "QuotaPlane"},
		ObjectMeta: meta("main"),
		Spec: v1alpha1.QuotaPlaneSpec{
			Global: *lim(10000, 20000),
			Tiers: []v1alpha1.Tier{
				{Name: "gold", Weight: 8, FloorPercent: 40, Tenant: lim(2000, 4000), Key: lim(500, 1000)},
				{Name: "silver", Weight: 4, FloorPercent: 25, Tenant: lim(500, 1000), Key: lim(200, 400)},
				{Name: "bronze", Weight: 1, FloorPercent: 5, Hard: true, Tenant: lim(50, 100), Key: lim(50, 100)},
			},
		},
	}
	for _, m := range mut {
		m(qp)
	}
	return qp
}

func newTenant(name, tenant, tier string, mut ...func(*v1alpha1.TenantQuota)) *v1alpha1.TenantQuota {
	tq := &v1alpha1.TenantQuota{
		TypeMeta:   metav1.TypeMeta{APIVersion: "quotaplane.io/v1alpha1", Kind: "TenantQuota"},
		ObjectMeta: meta(name),
		Spec:       v1alpha1.TenantQuotaSpec{Tenant: tenant, Tier: tier},
	}
	for _, m := range mut {
		m(tq)
	}
	return tq
}

func newEndpoint(name, endpoint string, mut ...func(*v1alpha1.EndpointQuota)) *v1alpha1.EndpointQuota {
	eq := &v1alpha1.EndpointQuota{
		TypeMeta:   metav1.TypeMeta{APIVersion: "quotaplane.io/v1alpha1", Kind: "EndpointQuota"},
		ObjectMeta: meta(name),
		Spec:       v1alpha1.EndpointQuotaSpec{Endpoint: endpoint},
	}
	for _, m := range mut {
		m(eq)
	}
	return eq
}

func newPool(name string, mut ...func(*v1alpha1.BurstPool)) *v1alpha1.BurstPool {
	bp := &v1alpha1.BurstPool{
		TypeMeta:   metav1.TypeMeta{APIVersion: "quotaplane.io/v1alpha1", Kind: "BurstPool"},
		ObjectMeta: meta(name),
		Spec:       v1alpha1.BurstPoolSpec{Size: 5000, RefillRate: 500, PerTenantCeiling: 1000},
	}
	for _, m := range mut {
		m(bp)
	}
	return bp
}

func objects(objs ...runtime.Object) []runtime.Object { return objs }

// mustCompile compiles objs and fails the test on any problem.
func mustCompile(t testing.TB, objs ...runtime.Object) *policy.Policy {
	t.Helper()
	p, problems := policy.Compile(objs)
	if len(problems) > 0 {
		t.Fatalf("unexpected problems:\n%s", problemList(problems))
	}
	if p == nil {
		t.Fatal("Compile returned no policy and no problem")
	}
	return p
}

func problemList(problems []policy.Problem) string {
	var b strings.Builder
	for _, p := range problems {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	return b.String()
}

func tenantNames(p *policy.Policy) []string {
	var names []string
	for _, t := range p.Spec().Tenants {
		names = append(names, t.Name)
	}
	return names
}

func endpointNames(p *policy.Policy) []string {
	var names []string
	for _, e := range p.Endpoints() {
		names = append(names, e.Name)
	}
	return names
}

func tierOrder(p *policy.Policy) []string {
	var names []string
	for _, t := range p.Spec().Tiers {
		names = append(names, t.Name)
	}
	return names
}

// encodeSpec builds an envelope in the format of Policy.Encode around spec,
// with the hash that matches it, so Decode can only reject it for its content.
func encodeSpec(t testing.TB, version int64, spec *policy.Spec) []byte {
	t.Helper()
	enc, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(enc)
	return fmt.Appendf(nil, `{"version":%d,"hash":%q,"spec":%s}`, version, hex.EncodeToString(sum[:]), enc)
}

// cloneSpec is a deep copy of a compiled spec that a test may modify.
func cloneSpec(t testing.TB, s *policy.Spec) *policy.Spec {
	t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var c policy.Spec
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	return &c
}
