package policy_test

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// The hashes of realisticObjects and of newPlane as compiled before seed
// 004's fields existed. A plane that uses none of them must keep its hash,
// or every plane would be republished (and refused by enforcers that do not
// know the new fields) on the manager's upgrade. Change them only with a
// change to the policy's encoding, deliberately.
const (
	realisticHashBefore004 = "19a3a1ffe1ee2bd4dcd45ea87cc2c9b60bd1e24d1a3a8095e1f1e2bd23133307"
	planeHashBefore004     = "df4dfc063fb9394a5f32dddd83705eebd3b643bac84a276fdc62499a8dfd715e"
)

func TestPlanesWithoutPriorityKeepTheirHash(t *testing.T) {
	if got := mustCompile(t, realisticObjects()...).Hash(); got != realisticHashBefore004 {
		t.Errorf("realistic plane hash %s, want %s", got, realisticHashBefore004)
	}
	p := mustCompile(t, newPlane())
	if p.Hash() != planeHashBefore004 {
		t.Errorf("plane hash %s, want %s", p.Hash(), planeHashBefore004)
	}
	if bytes.Contains(p.EncodedSpec(), []byte("priority")) {
		t.Errorf("a plane without priority fields encodes one: %s", p.EncodedSpec())
	}
	// The defaults spelt out, an empty priority and an Upstream are the same
	// content.
	objs := realisticObjects()
	qp := pick[*v1alpha1.QuotaPlane](t, objs, "main")
	for i, base := range []int64{70, 40, 10} { // gold, silver, bronze
		qp.Spec.Tiers[i].PriorityBase = &base
	}
	pick[*v1alpha1.TenantQuota](t, objs, "tq-04").Spec.Priority = &v1alpha1.TenantPriority{}
	objs = append(objs, newUpstream("llm", "read", "write"))
	if got := mustCompile(t, objs...).Hash(); got != realisticHashBefore004 {
		t.Errorf("with the defaults spelt out: hash %s, want %s", got, realisticHashBefore004)
	}
}

func TestDefaultPriorityBase(t *testing.T) {
	for _, tt := range []struct {
		tiers int
		want  []float64 // the literals, to the bit
	}{
		{1, []float64{0.7}},
		{2, []float64{0.7, 0.1}},
		{3, []float64{0.7, 0.4, 0.1}},
		{4, []float64{0.7, 0.5, 0.3, 0.1}}, // seed 004's enterprise, business, starter, free
		{5, []float64{0.7, 0.55, 0.4, 0.25, 0.1}},
		{7, []float64{0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1}},
	} {
		got := make([]float64, tt.tiers)
		for rank := range got {
			got[rank] = policy.DefaultPriorityBase(rank, tt.tiers)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%d tiers: %v, want %v", tt.tiers, got, tt.want)
		}
	}
	// Every count a plane allows: the line from 0.7 down to 0.1, decreasing.
	for n := 1; n <= policy.MaxTiers; n++ {
		prev := math.Inf(1)
		for rank := range n {
			exact := 0.7
			if n > 1 {
				exact = 0.7 - 0.6*float64(rank)/float64(n-1)
			}
			got := policy.DefaultPriorityBase(rank, n)
			if math.Abs(got-exact) > 1e-12 || got >= prev {
				t.Errorf("rank %d of %d: %v, want %v, below %v", rank, n, got, exact, prev)
			}
			prev = got
		}
	}
	// Ranks out of range clamp to the ends.
	if policy.DefaultPriorityBase(-1, 4) != 0.7 || policy.DefaultPriorityBase(9, 4) != 0.1 || policy.DefaultPriorityBase(0, 0) != 0.7 {
		t.Error("out-of-range ranks do not clamp to 0.7 and 0.1")
	}
	// A priorityBase equal to its rank's default is the default (canonical:
	// the same hash); one that is not, with 8 tiers (bases 0.7, 0.614...),
	// is kept, though it rounds to the default's percent.
	tiers := func(n int, base int64, at int) *v1alpha1.QuotaPlane {
		return newPlane(func(qp *v1alpha1.QuotaPlane) {
			qp.Spec.Tiers = nil
			for i := range n {
				qp.Spec.Tiers = append(qp.Spec.Tiers, v1alpha1.Tier{Name: fmt.Sprintf("t%d", i), Weight: int64(n - i)})
			}
			qp.Spec.Tiers[at].PriorityBase = &base
		})
	}
	if a, b := mustCompile(t, tiers(5, 55, 1)), mustCompile(t, tiers(5, 0, 1)); a.Spec().Tiers[1].PriorityBase != nil || b.Spec().Tiers[1].PriorityBase == nil {
		t.Errorf("5 tiers: 55 at rank 1 compiled to %v (want nil, the default), 0 to %v", a.Spec().Tiers[1].PriorityBase, b.Spec().Tiers[1].PriorityBase)
	}
	if p := mustCompile(t, tiers(8, 61, 1)); p.Spec().Tiers[1].PriorityBase == nil || p.PriorityBase("t1") != 0.61 {
		t.Errorf("8 tiers: 61 at rank 1 (default 0.6143) compiled to %v, base %v; want kept", p.Spec().Tiers[1].PriorityBase, p.PriorityBase("t1"))
	}
}

func TestPriorityBaseByTier(t *testing.T) {
	p := mustCompile(t, newPlane())
	for tier, want := range map[string]float64{"gold": 0.7, "silver": 0.4, "bronze": 0.1, "platinum": 0.1} {
		if got := p.PriorityBase(tier); math.Abs(got-want) > 1e-12 {
			t.Errorf("PriorityBase(%s) = %v, want %v", tier, got, want)
		}
	}
	// Overrides, one of them 0; the default tier silver serves unknown names.
	p = mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) {
		qp.Spec.Tiers[0].PriorityBase = ptr[int64](0)
		qp.Spec.Tiers[1].PriorityBase = ptr[int64](55)
		qp.Spec.DefaultTier = "silver"
	}))
	for tier, want := range map[string]float64{"gold": 0, "silver": 0.55, "bronze": 0.1, "platinum": 0.55} {
		if got := p.PriorityBase(tier); math.Abs(got-want) > 1e-12 {
			t.Errorf("with overrides: PriorityBase(%s) = %v, want %v", tier, got, want)
		}
	}
	if gold, _ := p.Tier("gold"); gold.PriorityBase == nil || *gold.PriorityBase != 0 {
		t.Errorf("gold's compiled priorityBase = %v, want 0", gold.PriorityBase)
	}
	if bronze, _ := p.Tier("bronze"); bronze.PriorityBase != nil {
		t.Errorf("bronze's compiled priorityBase = %v, want nil (its rank's default)", *bronze.PriorityBase)
	}
	// The rank is the priority order, not the QuotaPlane's list order.
	p = mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) {
		qp.Spec.Tiers[0].Weight, qp.Spec.Tiers[2].Weight = 1, 8 // bronze first, gold last
	}))
	if p.PriorityBase("bronze") != 0.7 || p.PriorityBase("gold") != 0.1 {
		t.Errorf("reweighted: bronze %v, gold %v; want 0.7 and 0.1", p.PriorityBase("bronze"), p.PriorityBase("gold"))
	}
	// Decode gives the same values.
	q, err := policy.Decode(mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) {
		qp.Spec.Tiers[1].PriorityBase = ptr[int64](55)
	})).Encode())
	if err != nil || q.PriorityBase("silver") != 0.55 || q.PriorityBase("gold") != 0.7 {
		t.Errorf("decoded: %v, silver %v, gold %v", err, q.PriorityBase("silver"), q.PriorityBase("gold"))
	}
}

func TestTenantPriorityCompiles(t *testing.T) {
	p := mustCompile(t, newPlane(),
		newTenant("whale", "whale", "gold", func(tq *v1alpha1.TenantQuota) {
			tq.Spec.Priority = &v1alpha1.TenantPriority{ContractValue: 1_200_000, Realtime: true, Importance: 80}
		}),
		newTenant("batch", "batch", "silver", func(tq *v1alpha1.TenantQuota) {
			tq.Spec.Priority = &v1alpha1.TenantPriority{Realtime: true}
		}),
		newTenant("empty", "empty", "silver", func(tq *v1alpha1.TenantQuota) {
			tq.Spec.Priority = &v1alpha1.TenantPriority{}
		}),
		newTenant("plain", "plain", "bronze"),
	)
	for name, want := range map[string]*policy.Priority{
		"whale": {ContractValue: 1_200_000, Realtime: true, Importance: 80},
		"batch": {Realtime: true},
		"empty": nil,
		"plain": nil,
	} {
		got, _ := p.Tenant(name)
		if !reflect.DeepEqual(got.Priority, want) {
			t.Errorf("%s: priority %+v, want %+v", name, got.Priority, want)
		}
	}
	if unknown, _ := p.DefaultTenant("stranger", ""); unknown.Priority != nil || p.PriorityBase(unknown.Tier) != 0.1 {
		t.Errorf("an unknown tenant: priority %+v, base %v; want none and its tier's 0.1", unknown.Priority, p.PriorityBase(unknown.Tier))
	}
	// Carried through the encoding.
	q, err := policy.Decode(p.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if whale, _ := q.Tenant("whale"); whale.Priority == nil || *whale.Priority != (policy.Priority{ContractValue: 1_200_000, Realtime: true, Importance: 80}) {
		t.Errorf("decoded whale priority %+v", whale.Priority)
	}
	if !strings.Contains(string(p.EncodedSpec()), `"priority":{"contractValue":1200000,"realtime":true,"importance":80}`) {
		t.Errorf("encoded spec lacks whale's priority: %s", p.EncodedSpec())
	}
}

func TestPriorityProblems(t *testing.T) {
	tenant := func(pr v1alpha1.TenantPriority) *v1alpha1.TenantQuota {
		return newTenant("t", "t", "gold", func(tq *v1alpha1.TenantQuota) { tq.Spec.Priority = &pr })
	}
	planeWithBase := func(base int64) *v1alpha1.QuotaPlane {
		return newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[1].PriorityBase = &base })
	}
	for _, tt := range []struct {
		name        string
		objs        []runtime.Object
		kind, field string
		words       string
	}{
		{"importance above 100", objects(newPlane(), tenant(v1alpha1.TenantPriority{Importance: 101})),
			"TenantQuota", "spec.priority.importance", "importance 101 is out of range; use 0 to 100"},
		{"importance negative", objects(newPlane(), tenant(v1alpha1.TenantPriority{Importance: -1})),
			"TenantQuota", "spec.priority.importance", "out of range"},
		{"contract value negative", objects(newPlane(), tenant(v1alpha1.TenantPriority{ContractValue: -5})),
			"TenantQuota", "spec.priority.contractValue", "contractValue -5 is out of range"},
		{"contract value above 10^12", objects(newPlane(), tenant(v1alpha1.TenantPriority{ContractValue: policy.MaxContractValue + 1})),
			"TenantQuota", "spec.priority.contractValue", "out of range"},
		{"tier priorityBase above 100", objects(planeWithBase(101)),
			"QuotaPlane", "spec.tiers[1].priorityBase", "priorityBase 101 is out of range; use 0 to 100"},
		{"tier priorityBase negative", objects(planeWithBase(-1)),
			"QuotaPlane", "spec.tiers[1].priorityBase", "priorityBase -1 is out of range"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, problems := policy.Compile(tt.objs)
			expectProblem(t, problems, tt.kind, tt.field, tt.words)
			switch {
			case tt.kind == "QuotaPlane" && p != nil:
				t.Errorf("a plane with a bad priorityBase compiled (hash %s)", p.Hash())
			case tt.kind == "TenantQuota" && (p == nil || len(p.Spec().Tenants) != 0):
				t.Errorf("policy %v: want one without the tenant", p)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// expectProblem fails unless problems holds exactly one, of kind on field,
// whose message contains words.
func expectProblem(t *testing.T, problems []policy.Problem, kind, field, words string) {
	t.Helper()
	if len(problems) != 1 || problems[0].Kind != kind || problems[0].Field != field || !strings.Contains(problems[0].Message, words) {
		t.Fatalf("problems:\n%swant one %s problem on %s with %q", problemList(problems), kind, field, words)
	}
}

// TestShareByDefaultKeepsTheHash: shareBy tenant is the default and is
// stored empty, so that planes keep their hash and enforcers that predate
// the field keep reading them; tier is stored, and changes the content.
func TestShareByDefaultKeepsTheHash(t *testing.T) {
	objs := realisticObjects()
	pick[*v1alpha1.QuotaPlane](t, objs, "main").Spec.ShareBy = v1alpha1.ShareByTenant
	p := mustCompile(t, objs...)
	if p.Hash() != realisticHashBefore004 || !p.Spec().SharesByTenant() || bytes.Contains(p.EncodedSpec(), []byte("shareBy")) {
		t.Errorf("shareBy tenant spelt out: hash %s, shares by tenant %v, encoding %s; want the unset plane's hash and no field",
			p.Hash(), p.Spec().SharesByTenant(), p.EncodedSpec())
	}
	pick[*v1alpha1.QuotaPlane](t, objs, "main").Spec.ShareBy = v1alpha1.ShareByTier
	q := mustCompile(t, objs...)
	if q.Hash() == realisticHashBefore004 || q.Spec().SharesByTenant() || !bytes.Contains(q.EncodedSpec(), []byte(`"shareBy":"tier"`)) {
		t.Errorf("shareBy tier: hash %s, shares by tenant %v; want its own hash and tier", q.Hash(), q.Spec().SharesByTenant())
	}
	back, err := policy.Decode(q.Encode())
	if err != nil || back.Spec().SharesByTenant() {
		t.Errorf("decoded shareBy tier: %v, shares by tenant %v", err, back != nil && back.Spec().SharesByTenant())
	}
	r, err := q.Override(policy.Overrides{ShareBy: "tenant"})
	if err != nil || r.Hash() != realisticHashBefore004 {
		t.Errorf("override to tenant: %v, hash %s; want the default's", err, r.Hash())
	}
}
