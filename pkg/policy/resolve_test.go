package policy_test

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// resolutionObjects is a plane whose silver tier has no key limit, three
// endpoints (e1: default and silver limit; e2: gold limit only; e3: none) and
// tenants that exercise every level of precedence.
func resolutionObjects(extra ...runtime.Object) []runtime.Object {
	hard, soft := true, false
	weight := int64(9)
	return append(objects(
		newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers[1].Key = nil }),
		newEndpoint("e1", "e1", func(eq *v1alpha1.EndpointQuota) {
			eq.Spec.Limit = lim(10, 10)
			eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{{Tier: "silver", Limit: *lim(20, 20)}}
		}),
		newEndpoint("e2", "e2", func(eq *v1alpha1.EndpointQuota) {
			eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{{Tier: "gold", Limit: *lim(30, 30)}}
		}),
		newEndpoint("e3", "e3"),
		newTenant("over", "over", "silver", func(tq *v1alpha1.TenantQuota) {
			tq.Spec.Endpoints = []v1alpha1.TenantEndpointQuota{{Endpoint: "e3", Limit: *lim(50, 50)}, {Endpoint: "e1", Limit: *lim(40, 40)}}
			tq.Spec.Keys = []v1alpha1.KeyQuota{{Key: "z", Limit: *lim(3, 3)}, {Key: "a", Limit: *lim(1, 1)}, {Key: "m", Limit: *lim(2, 2)}}
		}),
		newTenant("plain-silver", "plain-silver", "silver"),
		newTenant("plain-gold", "plain-gold", "gold"),
		newTenant("keyed-gold", "keyed-gold", "gold", func(tq *v1alpha1.TenantQuota) {
			tq.Spec.Keys = []v1alpha1.KeyQuota{{Key: "k", Limit: *lim(7, 7)}}
		}),
		newTenant("soft-bronze", "soft-bronze", "bronze", func(tq *v1alpha1.TenantQuota) { tq.Spec.Hard = &soft }),
		newTenant("heavy-gold", "heavy-gold", "gold", func(tq *v1alpha1.TenantQuota) {
			tq.Spec.Hard = &hard
			tq.Spec.Weight = &weight
		}),
	), extra...)
}

func mustTenant(t *testing.T, p *policy.Policy, name string) *policy.Tenant {
	t.Helper()
	tenant, ok := p.Tenant(name)
	if !ok {
		t.Fatalf("tenant %q not in the policy", name)
	}
	return &tenant
}

func mustDefaultTenant(t *testing.T, p *policy.Policy, name, tier string) *policy.Tenant {
	t.Helper()
	tenant, ok := p.DefaultTenant(name, tier)
	if !ok {
		t.Fatalf("DefaultTenant(%q, %q) denied", name, tier)
	}
	return &tenant
}

func limitString(l *policy.Limit) string {
	if l == nil {
		return "<nil>"
	}
	return l.String()
}

func TestEndpointLimitPrecedence(t *testing.T) {
	p := mustCompile(t, resolutionObjects()...)
	tests := []struct {
		name     string
		tenant   *policy.Tenant
		endpoint string
		want     *policy.Limit
	}{
		{"tenant override beats the tier limit", mustTenant(t, p, "over"), "e1", tb(40, 40, time.Second)},
		{"tenant override where the endpoint has no limit", mustTenant(t, p, "over"), "e3", tb(50, 50, time.Second)},
		{"no override, no tier limit, no default", mustTenant(t, p, "over"), "e2", nil},
		{"tier limit beats the endpoint default", mustTenant(t, p, "plain-silver"), "e1", tb(20, 20, time.Second)},
		{"endpoint default for a tier without its own limit", mustTenant(t, p, "plain-gold"), "e1", tb(10, 10, time.Second)},
		{"tier limit without an endpoint default", mustTenant(t, p, "plain-gold"), "e2", tb(30, 30, time.Second)},
		{"other tier's limit does not apply", mustTenant(t, p, "plain-silver"), "e2", nil},
		{"endpoint without limits", mustTenant(t, p, "plain-gold"), "e3", nil},
		{"unknown tenant in the default tier", mustDefaultTenant(t, p, "stranger", ""), "e1", tb(10, 10, time.Second)},
		{"unknown tenant asking for silver", mustDefaultTenant(t, p, "stranger", "silver"), "e1", tb(20, 20, time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			i, ok := p.EndpointIndex(tt.endpoint)
			if !ok {
				t.Fatalf("endpoint %q not in the policy", tt.endpoint)
			}
			got := p.EndpointLimit(tt.tenant, i)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("EndpointLimit(%s, %s) = %s, want %s", tt.tenant.Name, tt.endpoint, limitString(got), limitString(tt.want))
			}
		})
	}
}

func TestKeyLimitPrecedence(t *testing.T) {
	p := mustCompile(t, resolutionObjects()...)
	gold, _ := p.Tier("gold")
	bronze, _ := p.Tier("bronze")
	tests := []struct {
		name   string
		tenant *policy.Tenant
		key    string
		want   *policy.Limit
	}{
		{"first of several overrides", mustTenant(t, p, "over"), "a", tb(1, 1, time.Second)},
		{"middle of several overrides", mustTenant(t, p, "over"), "m", tb(2, 2, time.Second)},
		{"last of several overrides", mustTenant(t, p, "over"), "z", tb(3, 3, time.Second)},
		{"key between overrides, tier without a key limit", mustTenant(t, p, "over"), "b", nil},
		{"key after every override", mustTenant(t, p, "over"), "zz", nil},
		{"override beats the tier's key limit", mustTenant(t, p, "keyed-gold"), "k", tb(7, 7, time.Second)},
		{"tier's key limit for other keys", mustTenant(t, p, "keyed-gold"), "other", gold.Key},
		{"tier's key limit for a tenant without overrides", mustTenant(t, p, "plain-gold"), "k", gold.Key},
		{"no key limit anywhere", mustTenant(t, p, "plain-silver"), "k", nil},
		{"unknown tenant gets the default tier's key limit", mustDefaultTenant(t, p, "stranger", ""), "k", bronze.Key},
		{"tenant of a tier the policy does not have", &policy.Tenant{Name: "ghost", Tier: "ghost"}, "k", nil},
	}
	if gold.Key == nil || *gold.Key != *tb(500, 1000, time.Second) || bronze.Key == nil {
		t.Fatalf("gold key limit = %v, bronze %v", gold.Key, bronze.Key)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := p.KeyLimit(tt.tenant, tt.key)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("KeyLimit(%s, %q) = %s, want %s", tt.tenant.Name, tt.key, limitString(got), limitString(tt.want))
			}
		})
	}
}

func TestTenantCarriesTheEffectiveTierValues(t *testing.T) {
	p := mustCompile(t, resolutionObjects()...)
	gold, _ := p.Tier("gold")
	bronze, _ := p.Tier("bronze")
	tests := []struct {
		name                 string
		wantTier             string
		wantLimit            *policy.Limit
		wantWeight           int64
		wantHard             bool
		wantKeys, wantPoints int
	}{
		{"plain-gold", "gold", gold.Tenant, 8, false, 0, 0},
		{"heavy-gold", "gold", gold.Tenant, 9, true, 0, 0},
		{"soft-bronze", "bronze", bronze.Tenant, 1, false, 0, 0},
		{"over", "silver", tb(500, 1000, time.Second), 4, false, 3, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mustTenant(t, p, tt.name)
			if got.Name != tt.name || got.Tier != tt.wantTier || !reflect.DeepEqual(got.Limit, tt.wantLimit) ||
				got.Weight != tt.wantWeight || got.Hard != tt.wantHard || !got.Known ||
				len(got.Keys) != tt.wantKeys || len(got.Endpoints) != tt.wantPoints {
				t.Errorf("Tenant(%s) = %+v", tt.name, *got)
			}
		})
	}
	if _, ok := p.Tenant("stranger"); ok {
		t.Error("Tenant(stranger) found a tenant the plane does not name")
	}
	over := mustTenant(t, p, "over")
	if keys := []string{over.Keys[0].Key, over.Keys[1].Key, over.Keys[2].Key}; !slices.Equal(keys, []string{"a", "m", "z"}) {
		t.Errorf("keys are not sorted: %v", keys)
	}
	if over.Endpoints[0].Endpoint != "e1" || over.Endpoints[1].Endpoint != "e3" {
		t.Errorf("endpoint overrides are not sorted: %+v", over.Endpoints)
	}
}

func TestDefaultTenant(t *testing.T) {
	p := mustCompile(t, resolutionObjects()...)
	silverDefault := mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.DefaultTier = "silver" }))
	gold, _ := p.Tier("gold")
	bronze, _ := p.Tier("bronze")
	silver, _ := silverDefault.Tier("silver")
	tests := []struct {
		name string
		p    *policy.Policy
		tier string
		want policy.Tenant
	}{
		{name: "requested tier is honoured", p: p, tier: "gold", want: policy.Tenant{Name: "stranger", Tier: "gold", Limit: gold.Tenant, Weight: 8}},
		{name: "no tier requested", p: p, tier: "", want: policy.Tenant{Name: "stranger", Tier: "bronze", Limit: bronze.Tenant, Weight: 1, Hard: true}},
		{name: "unknown tier requested", p: p, tier: "platinum", want: policy.Tenant{Name: "stranger", Tier: "bronze", Limit: bronze.Tenant, Weight: 1, Hard: true}},
		{name: "explicit default tier", p: silverDefault, tier: "platinum", want: policy.Tenant{Name: "stranger", Tier: "silver", Limit: silver.Tenant, Weight: 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tt.p.DefaultTenant("stranger", tt.tier)
			if !ok {
				t.Fatal("DefaultTenant denied")
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DefaultTenant(stranger, %q) = %+v, want %+v", tt.tier, got, tt.want)
			}
			if got.Known {
				t.Error("an unknown tenant is marked Known")
			}
		})
	}

	deny := mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.UnknownTenants = v1alpha1.UnknownDeny }))
	for _, tier := range []string{"", "gold", "platinum"} {
		if got, ok := deny.DefaultTenant("stranger", tier); ok || !reflect.DeepEqual(got, policy.Tenant{}) {
			t.Errorf("unknownTenants=deny: DefaultTenant(stranger, %q) = %+v, %v; want zero, false", tier, got, ok)
		}
	}
}

func TestMayBorrow(t *testing.T) {
	noPool := mustCompile(t, resolutionObjects()...)
	anyTier := mustCompile(t, resolutionObjects(newPool("shared"))...)
	goldOnly := mustCompile(t, resolutionObjects(newPool("shared", func(bp *v1alpha1.BurstPool) {
		bp.Spec.Tiers = []string{"gold", "gold"}
	}))...)
	tests := []struct {
		name   string
		p      *policy.Policy
		tenant string // a named tenant, or "" for an unknown tenant of tier
		tier   string
		want   bool
	}{
		{"no pool: soft tenant", noPool, "plain-gold", "", false},
		{"no pool: unknown soft tenant", noPool, "", "gold", false},
		{"pool for every tier: soft gold", anyTier, "plain-gold", "", true},
		{"pool for every tier: soft silver", anyTier, "plain-silver", "", true},
		{"pool for every tier: soft tenant of a hard tier", anyTier, "soft-bronze", "", true},
		{"pool for every tier: hard tenant of a soft tier", anyTier, "heavy-gold", "", false},
		{"pool for every tier: unknown tenant of the hard default tier", anyTier, "", "", false},
		{"pool for every tier: unknown soft tenant", anyTier, "", "silver", true},
		{"gold pool: soft gold", goldOnly, "plain-gold", "", true},
		{"gold pool: soft silver", goldOnly, "plain-silver", "", false},
		{"gold pool: soft bronze", goldOnly, "soft-bronze", "", false},
		{"gold pool: hard gold", goldOnly, "heavy-gold", "", false},
		{"gold pool: unknown gold tenant", goldOnly, "", "gold", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var tenant *policy.Tenant
			if tt.tenant != "" {
				tenant = mustTenant(t, tt.p, tt.tenant)
			} else {
				tenant = mustDefaultTenant(t, tt.p, "stranger", tt.tier)
			}
			if got := tt.p.MayBorrow(tenant); got != tt.want {
				t.Errorf("MayBorrow(%s in %s) = %v, want %v", tenant.Name, tenant.Tier, got, tt.want)
			}
		})
	}
	if got := goldOnly.Spec().BurstPool.Tiers; !slices.Equal(got, []string{"gold"}) {
		t.Errorf("pool tiers = %v, want [gold] (sorted, without duplicates)", got)
	}
	if got := anyTier.Spec().BurstPool.Tiers; got != nil {
		t.Errorf("pool tiers = %#v, want nil for every tier", got)
	}
}

func TestTierOrderAndDefaultTier(t *testing.T) {
	tiers := []v1alpha1.Tier{{Name: "b", Weight: 2}, {Name: "a", Weight: 2}, {Name: "d"}, {Name: "c", Weight: 5}}
	tests := []struct {
		name        string
		tiers       []v1alpha1.Tier
		defaultTier string
		wantOrder   []string
		wantDefault string
	}{
		{"weight descending, then name; default is the lowest weight", tiers, "", []string{"c", "a", "b", "d"}, "d"},
		{"explicit default tier", tiers, "c", []string{"c", "a", "b", "d"}, "c"},
		{"a tie at the lowest weight defaults to the name sorting last", []v1alpha1.Tier{{Name: "x", Weight: 3}, {Name: "z"}, {Name: "y", Weight: 1}}, "", []string{"x", "y", "z"}, "z"},
		{"one tier", []v1alpha1.Tier{{Name: "only", Weight: 7}}, "", []string{"only"}, "only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) {
				qp.Spec.Tiers = slices.Clone(tt.tiers)
				qp.Spec.DefaultTier = tt.defaultTier
			}))
			if got := tierOrder(p); !slices.Equal(got, tt.wantOrder) {
				t.Errorf("tier order = %v, want %v", got, tt.wantOrder)
			}
			if got := p.Spec().DefaultTier; got != tt.wantDefault {
				t.Errorf("default tier = %q, want %q", got, tt.wantDefault)
			}
			if tenant := mustDefaultTenant(t, p, "stranger", ""); tenant.Tier != tt.wantDefault {
				t.Errorf("unknown tenant tier = %q, want %q", tenant.Tier, tt.wantDefault)
			}
		})
	}
	p := mustCompile(t, newPlane(func(qp *v1alpha1.QuotaPlane) { qp.Spec.Tiers = slices.Clone(tiers) }))
	if d, ok := p.Tier("d"); !ok || d.Weight != 1 {
		t.Errorf("tier d = %+v, %v; want the default weight 1", d, ok)
	}
	if _, ok := p.Tier("nope"); ok {
		t.Error("Tier(nope) found a tier")
	}
}

func TestEndpointsAreSortedAndIndexed(t *testing.T) {
	p := mustCompile(t, newPlane(),
		newEndpoint("z", "zeta", func(eq *v1alpha1.EndpointQuota) { eq.Spec.Cost = 3 }),
		newEndpoint("a", "alpha"),
		newEndpoint("m", "mu", func(eq *v1alpha1.EndpointQuota) {
			eq.Spec.Tiers = []v1alpha1.EndpointTierLimit{{Tier: "silver", Limit: *lim(2, 2)}, {Tier: "bronze", Limit: *lim(1, 1)}}
		}),
	)
	if got, want := endpointNames(p), []string{"alpha", "mu", "zeta"}; !slices.Equal(got, want) {
		t.Fatalf("endpoints = %v, want %v", got, want)
	}
	for want, name := range []string{"alpha", "mu", "zeta"} {
		if i, ok := p.EndpointIndex(name); !ok || i != want {
			t.Errorf("EndpointIndex(%s) = %d, %v; want %d", name, i, ok, want)
		}
	}
	if _, ok := p.EndpointIndex("nope"); ok {
		t.Error("EndpointIndex(nope) found an endpoint")
	}
	if e := p.Endpoints()[0]; e.Cost != 1 || e.Limit != nil || e.Tiers != nil {
		t.Errorf("alpha = %+v, want cost 1 and no limits", e)
	}
	if e := p.Endpoints()[2]; e.Cost != 3 {
		t.Errorf("zeta cost = %d, want 3", e.Cost)
	}
	if tl := p.Endpoints()[1].Tiers; len(tl) != 2 || tl[0].Tier != "bronze" || tl[1].Tier != "silver" {
		t.Errorf("mu tier limits = %+v, want bronze then silver", tl)
	}
}

func TestConcurrentReaders(t *testing.T) {
	// A Policy is safe for concurrent use; run with -race.
	p := mustCompile(t, resolutionObjects(newPool("shared"))...)
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 200 {
				tenant, _ := p.Tenant("over")
				i, _ := p.EndpointIndex("e1")
				_ = p.EndpointLimit(&tenant, i)
				_ = p.KeyLimit(&tenant, "m")
				_ = p.MayBorrow(&tenant)
				_, _ = p.DefaultTenant("x", "gold")
				_ = p.WithVersion(3).Encode()
			}
		}()
	}
	for range 4 {
		<-done
	}
	if q, err := policy.Decode(p.Encode()); err != nil || q.Hash() != p.Hash() {
		t.Errorf("policy changed under concurrent reads: %v", err)
	}
}
